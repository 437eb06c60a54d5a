"""`[checkpoint] stripe_size / stripe_count` mapped onto each file system's own layout.

Applied to the run's directory (files created in it inherit the layout), and always
recorded: what ran, or one line saying why nothing did.

| file system | how |
|---|---|
| Lustre | ``lfs setstripe -S SIZE -c COUNT DIR`` (-1: all OSTs) |
| BeeGFS | ``beegfs-ctl --setpattern --chunksize=SIZEk [--numtargets=COUNT] DIR`` |
| CephFS | the ``ceph.dir.layout`` xattr: stripe_unit, stripe_count, object_size |
| GlusterFS | sharding is a volume option (``features.shard-block-size``) that only the volume's admin sets; what the client's graph shows is recorded |
| others | not available (GPFS: block size fixed per file system; local disks, NFS: none) |
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ckptbench.backends.filesystems import GLUSTER_TYPES, FileSystem

STRIPE_TOOLS = {"lustre": "lfs", "beegfs": "beegfs-ctl"}
CEPH_TYPES = frozenset({"ceph", "fuse.ceph-fuse", "fuse.ceph"})
CEPH_MIN_STRIPE_UNIT = 64 << 10  # CephFS refuses smaller stripe units
CEPH_OBJECT_SIZE = 4 << 20  # CephFS's default object size
GLUSTER_MIN_SHARD = 4 << 20  # features.shard-block-size's minimum
WHY_NOT = {
    "gpfs": "GPFS stripes by its block size, fixed per file system (mmcrfs -B)",
    "nfs": "NFS has no client-side layout", "nfs4": "NFS has no client-side layout",
}


def striping_command(tool: str, fs_type: str, path: Path, stripe_size: int,
                     stripe_count: int) -> list[str]:
    """The command that sets `path`'s default layout (files created in it inherit it)."""
    if fs_type == "lustre":
        return [tool, "setstripe", "-S", str(stripe_size), "-c", str(stripe_count), str(path)]
    # BeeGFS has no "all targets" value: -1 leaves the directory's target count as it is.
    cmd = [tool, "--setpattern", f"--chunksize={stripe_size // 1024}k"]
    if stripe_count > 0:
        cmd.append(f"--numtargets={stripe_count}")
    return [*cmd, str(path)]


def ceph_layout(stripe_size: int, stripe_count: int) -> str:
    """The ``ceph.dir.layout`` value: the stripe unit, the count (CephFS has no "all":
    -1 keeps the directory's), and an object size that is a multiple of the unit, at
    least CephFS's default 4 MiB."""
    object_size = -(-max(CEPH_OBJECT_SIZE, stripe_size) // stripe_size) * stripe_size
    parts = [f"stripe_unit={stripe_size}"]
    if stripe_count > 0:
        parts.append(f"stripe_count={stripe_count}")
    return " ".join([*parts, f"object_size={object_size}"])


def _run_tool(record: dict[str, Any], tool_name: str, path: Path, fs_type: str,
              stripe_size: int, stripe_count: int, timeout_s: float) -> dict[str, Any]:
    tool = shutil.which(tool_name)
    if tool is None:
        return {**record, "reason": f"not available: {tool_name} is not on PATH"}
    cmd = striping_command(tool, fs_type, path, stripe_size, stripe_count)
    record["command"] = [tool_name, *cmd[1:]]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {**record, "reason": f"{tool_name} failed: {exc}"}
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        return {**record, "reason": f"{tool_name} exited with {proc.returncode}"
                + (f": {detail[-1]}" if detail else "")}
    return {**record, "applied": True}


def _ceph(record: dict[str, Any], path: Path, stripe_size: int,
          stripe_count: int) -> dict[str, Any]:
    if stripe_size % CEPH_MIN_STRIPE_UNIT:
        return {**record, "reason": f"CephFS stripe units are multiples of "
                f"{CEPH_MIN_STRIPE_UNIT} bytes; stripe_size = {stripe_size} is not"}
    value = ceph_layout(stripe_size, stripe_count)
    record["xattr"] = {"ceph.dir.layout": value}
    try:
        os.setxattr(path, "ceph.dir.layout", value.encode())
    except OSError as exc:
        return {**record, "reason": f"setxattr ceph.dir.layout: {exc.strerror}"}
    return {**record, "applied": True}


def gluster_shard_block_size(stripe_size: int) -> str:
    """`stripe_size` as a Gluster shard block size: whole MB (Gluster's MB is MiB), rounded
    up, at least Gluster's minimum of 4MB."""
    return f"{max(GLUSTER_MIN_SHARD, stripe_size) + (1 << 20) - 1 >> 20}MB"


def _gluster(record: dict[str, Any], path: Path, stripe_size: int) -> dict[str, Any]:
    shard = FileSystem.of(path).describe().get("gluster_shard", {"enabled": False})
    now = (f"this volume shards files into {shard['block_size']} pieces" if shard["enabled"]
           else "this volume does not shard files (each file lives whole on one brick)")
    return {**record, "gluster_shard": shard,
            "reason": "not settable from a GlusterFS client: sharding is a volume option "
                      f"for the volume's admin (gluster volume set VOL features.shard-block-size "
                      f"{gluster_shard_block_size(stripe_size)}); {now}"}


def apply_striping(path: Path, fs_type: str, stripe_size: int, stripe_count: int,
                   timeout_s: float = 60.0) -> dict[str, Any]:
    """Set the stripe size and count of directory `path` where the file system has a way;
    say what was applied, or why nothing was (recorded in the run record).

    stripe_count 0 means "leave the file system's layout alone" (nothing runs).
    """
    record: dict[str, Any] = {"fs_type": fs_type, "stripe_size": stripe_size,
                              "stripe_count": stripe_count, "applied": False}
    if stripe_count == 0:
        return {**record, "reason": "not requested ([checkpoint] stripe_count = 0)"}
    tool_name = STRIPE_TOOLS.get(fs_type)
    if tool_name is not None:
        return _run_tool(record, tool_name, path, fs_type, stripe_size, stripe_count, timeout_s)
    if fs_type in CEPH_TYPES:
        return _ceph(record, path, stripe_size, stripe_count)
    if fs_type in GLUSTER_TYPES:
        return _gluster(record, path, stripe_size)
    why = WHY_NOT.get(fs_type)
    return {**record, "reason": f"not available on {fs_type} ("
            f"{why or 'striping is mapped on Lustre, BeeGFS, CephFS and GlusterFS only'})"}
