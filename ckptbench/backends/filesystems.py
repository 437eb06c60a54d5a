"""The file system under a target, from the mount table, and what its client caches.

A restore is only cold if every cache between the reader and the storage that the save
filled has been emptied. On a local disk that is the kernel's page cache
(``posix_fadvise(DONTNEED)`` per file, ``drop_caches`` for the host). Network and
parallel file systems can keep data in the client outside the page cache, where neither
reaches: Gluster's io-cache translator, the GPFS pagepool, ceph-fuse's object cache, NFS
FS-Cache. :meth:`FileSystem.client_cache_held` names such a cache while it may hold data,
so the restore is recorded as "warm: client cache not evictable (...)", never as cold.
The servers' own caches are outside any client's reach: recorded as not controlled.

What evicts what on a Gluster FUSE client was measured (docs/parallel-fs.md).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOCAL_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs",
                         "overlay", "bcachefs", "jfs", "reiserfs", "vfat", "exfat", "ntfs3"})
NETWORK_TYPES = frozenset({"nfs", "nfs4", "cifs", "smb3", "9p", "virtiofs", "fuse.sshfs"})
PARALLEL_TYPES = frozenset({"lustre", "gpfs", "beegfs", "ceph", "fuse.ceph-fuse", "fuse.ceph",
                            "fuse.glusterfs", "glusterfs", "wekafs", "pvfs2", "orangefs",
                            "fuse.juicefs", "fuse.daos", "fuse.dfuse"})
GLUSTER_TYPES = frozenset({"fuse.glusterfs", "glusterfs"})
# Gluster translators that hold file data in the client between operations.
GLUSTER_DATA_CACHES = {"performance/io-cache": "io-cache"}
# Options of the client graph that say how it stores and caches (never credentials: the
# graph's protocol/client sections carry a username and password, never read here).
GLUSTER_SAFE_OPTIONS = frozenset({"shard-block-size", "cache-size", "page-count",
                                  "cache-timeout", "max-file-size"})


def family(fs_type: str) -> str:
    """local | network | parallel | unknown (what a client cache rule has to consider)."""
    if fs_type in LOCAL_TYPES:
        return "local"
    if fs_type in PARALLEL_TYPES:
        return "parallel"
    if fs_type in NETWORK_TYPES or fs_type.startswith("fuse."):
        return "network"
    return "unknown"


def filesystem_info(path: str | Path) -> dict[str, Any]:
    """File-system type, mount point and options, and block device model of `path`, from
    /proc/self/mountinfo (the longest mount point containing the path)."""
    real = os.path.realpath(path)
    best: dict[str, Any] = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-")
                mount_point = fields[4].replace("\\040", " ")
                inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best.get("mount_point", "")):
                    best = {
                        "mount_point": mount_point,
                        "fs_type": fields[sep + 1],
                        "mount_source": fields[sep + 2],
                        "mount_options": fields[5],
                        "super_options": fields[sep + 3] if len(fields) > sep + 3 else "",
                        "dev": fields[2],
                    }
    except OSError:
        return {}
    dev = best.pop("dev", None)
    if dev:
        sys_dev = Path("/sys/dev/block") / dev
        for candidate in (sys_dev / "device" / "model", sys_dev / ".." / "device" / "model"):
            with contextlib.suppress(OSError):
                best["device_model"] = candidate.read_text().strip()
                break
        with contextlib.suppress(OSError):
            best["device"] = os.path.basename(os.path.realpath(sys_dev))
            rotational = sys_dev / "queue" / "rotational"
            if not rotational.exists():
                rotational = sys_dev / ".." / "queue" / "rotational"
            best["rotational"] = rotational.read_text().strip() == "1"
    return best


# --- Gluster's client graph (the FUSE client's translators, under MOUNT/.meta) ---

@dataclass(frozen=True)
class Translator:
    name: str
    type: str
    options: dict[str, str] = field(default_factory=dict)  # GLUSTER_SAFE_OPTIONS only


def gluster_graph(mount_point: str | Path) -> list[Translator]:
    """The translators of a Gluster FUSE client's active graph, from the volfile the meta
    translator shows at MOUNT/.meta/graphs/active/volfile (types and a few layout and
    cache options; [] when it cannot be read)."""
    try:
        text = (Path(mount_point) / ".meta" / "graphs" / "active" / "volfile").read_text()
    except OSError:
        return []
    out: list[Translator] = []
    name = kind = ""
    opts: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "volume":
            name, kind, opts = words[1], "", {}
        elif len(words) >= 2 and words[0] == "type":
            kind = words[1]
        elif len(words) >= 3 and words[0] == "option" and words[1] in GLUSTER_SAFE_OPTIONS:
            opts[words[1]] = words[2]
        elif words[:1] == ["end-volume"] and name:
            out.append(Translator(name, kind, opts))
            name = ""
    return out


def gluster_private(mount_point: str | Path, translator: str) -> dict[str, str]:
    """A translator's state dump (MOUNT/.meta/graphs/active/NAME/private) as key -> value."""
    try:
        text = (Path(mount_point) / ".meta" / "graphs" / "active" / translator / "private"
                ).read_text()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


# --- the file system of a target ---

@dataclass(frozen=True)
class FileSystem:
    """What the mount table says about a target's file system, and its client caches."""

    fs_type: str
    mount_point: str
    mount_options: str = ""

    @classmethod
    def of(cls, path: str | Path) -> FileSystem:
        """The file system `path` is on (its nearest existing ancestor's)."""
        p = Path(path).absolute()
        while not p.exists() and p != p.parent:
            p = p.parent
        info = filesystem_info(p)
        return cls(info.get("fs_type", "unknown"), info.get("mount_point", "/"),
                   info.get("mount_options", "") + "," + info.get("super_options", ""))

    @property
    def family(self) -> str:
        return family(self.fs_type)

    @property
    def is_gluster(self) -> bool:
        return self.fs_type in GLUSTER_TYPES

    def client_caches(self) -> list[str]:
        """The client's caches of file data besides the kernel page cache (recorded)."""
        if self.is_gluster:
            return [f"gluster {t.type}" for t in gluster_graph(self.mount_point)
                    if t.type.startswith("performance/")]
        return {"gpfs": ["GPFS pagepool"], "fuse.ceph-fuse": ["ceph-fuse object cache"],
                "fuse.ceph": ["ceph-fuse object cache"]}.get(self.fs_type, []) + (
            ["NFS FS-Cache (fsc)"] if self.fs_type.startswith("nfs") and self._has_fsc() else [])

    def _has_fsc(self) -> bool:
        return "fsc" in self.mount_options.split(",")

    def client_cache_held(self, direct: bool) -> str | None:
        """A client cache outside the page cache that may hold the checkpoint now (a short
        phrase naming it), or None when the page cache rules (fadvise, drop_caches, or
        O_DIRECT) are all there is to it."""
        if self.is_gluster:
            return _gluster_held(self.mount_point)
        if self.fs_type in ("fuse.ceph-fuse", "fuse.ceph"):  # not verified to obey O_DIRECT
            return "ceph-fuse object cache"
        if direct:  # GPFS documents O_DIRECT as bypassing its pagepool
            return None
        if self.fs_type == "gpfs":
            return "GPFS pagepool"
        if self.fs_type.startswith("nfs") and self._has_fsc():
            return "NFS FS-Cache (mount option fsc)"
        return None

    def describe(self) -> dict[str, Any]:
        """For the run record: the family, the client caches, and who controls the rest."""
        out: dict[str, Any] = {"fs_family": self.family, "client_caches": self.client_caches()}
        if self.family in ("network", "parallel"):
            out["server_caches"] = "not controlled (the storage servers' own memory)"
        if self.is_gluster:
            shard = next((t for t in gluster_graph(self.mount_point)
                          if t.type == "features/shard"), None)
            out["gluster_shard"] = ({"enabled": True, "block_size": shard.options.get(
                "shard-block-size", "64MB (default)")} if shard else {"enabled": False})
        return out


def _gluster_held(mount_point: str) -> str | None:
    """Bytes Gluster's data-caching translators hold on this client, as a phrase."""
    held = []
    for t in gluster_graph(mount_point):
        label = GLUSTER_DATA_CACHES.get(t.type)
        if label is None:
            continue
        used = gluster_private(mount_point, t.name).get("cache_used", "")
        if not used.isdigit():
            held.append(f"gluster {label}: contents unknown")
        elif int(used):
            held.append(f"gluster {label} holds {int(used)} bytes")
    return "; ".join(held) or None


# --- the page cache ---

def evict_from_page_cache(paths: Iterable[str | Path]) -> None:
    """posix_fadvise(DONTNEED) on each file: its clean cached pages are dropped (also on a
    FUSE mount: the client's kernel-side copy)."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO put there: no wait
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):  # not a FIFO or device put in its place
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_page_cache() -> bool:
    """Drop the host's page cache, dentries and inodes when permitted (root, writable
    /proc); say if it worked. Forgetting the inodes also empties Gluster's io-cache."""
    try:
        os.sync()
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False
