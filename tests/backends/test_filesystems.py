"""The file system under a target (from the mount table), its client caches, and striping
mapped per file system: CephFS's layout xattr and Gluster's shard block size (Lustre's and
BeeGFS's tools: tests/plan/test_file_patterns.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ckptbench.backends.filesystems import FileSystem, family, filesystem_info
from ckptbench.backends.local import LocalBackend
from ckptbench.backends.striping import apply_striping, ceph_layout, gluster_shard_block_size

MIB = 1 << 20


def test_the_mount_table_names_the_file_system_of_a_path_not_yet_made(tmp_path: Path):
    fs = FileSystem.of(tmp_path / "not" / "yet")
    info = filesystem_info(tmp_path)
    assert (fs.fs_type, fs.mount_point) == (info["fs_type"], info["mount_point"])
    assert LocalBackend(str(tmp_path)).details()["fs_type"] == info["fs_type"]
    proc = FileSystem.of("/proc/self")
    assert (proc.fs_type, proc.family) == ("proc", "unknown")


@pytest.mark.parametrize(("fs_type", "kind"), [
    ("ext4", "local"), ("xfs", "local"), ("lustre", "parallel"), ("gpfs", "parallel"),
    ("beegfs", "parallel"), ("ceph", "parallel"), ("fuse.glusterfs", "parallel"),
    ("nfs4", "network"), ("fuse.sshfs", "network"), ("fuse.something", "network"),
    ("proc", "unknown")])
def test_families(fs_type: str, kind: str):
    assert family(fs_type) == kind


@pytest.mark.parametrize(("fs", "direct", "held"), [
    (FileSystem("ext4", "/"), False, None),
    (FileSystem("lustre", "/lus"), False, None),  # llite data is page cache: fadvise reaches it
    (FileSystem("gpfs", "/gpfs"), False, "GPFS pagepool"),
    (FileSystem("gpfs", "/gpfs"), True, None),  # O_DIRECT bypasses the pagepool
    (FileSystem("fuse.ceph-fuse", "/cephfs"), True, "ceph-fuse object cache"),
    (FileSystem("nfs4", "/home", "rw,relatime,fsc"), False, "NFS FS-Cache (mount option fsc)"),
    (FileSystem("nfs4", "/home", "rw,relatime"), False, None),
])
def test_client_caches_outside_the_page_cache_are_named(fs, direct, held):
    assert fs.client_cache_held(direct) == held
    if held:
        assert fs.client_caches()


def test_a_restore_on_gpfs_is_recorded_warm_not_cold(tmp_path: Path, monkeypatch):
    """The rule as the backend applies it (the file system faked: no GPFS here)."""
    backend = LocalBackend(str(tmp_path))
    monkeypatch.setattr(FileSystem, "of", classmethod(lambda cls, p: FileSystem("gpfs", "/g")))
    assert backend.drop_cache([]) == "warm: client cache not evictable (GPFS pagepool)"
    assert backend.details()["server_caches"].startswith("not controlled")


def test_ceph_layout_values():
    assert ceph_layout(1 * MIB, 4) == f"stripe_unit={MIB} stripe_count=4 object_size={4 * MIB}"
    assert ceph_layout(3 * MIB, -1) == f"stripe_unit={3 * MIB} object_size={6 * MIB}"
    assert ceph_layout(8 * MIB, 2) == f"stripe_unit={8 * MIB} stripe_count=2 object_size={8 * MIB}"


def test_ceph_striping_is_an_xattr_and_its_refusal_is_recorded(tmp_path: Path):
    rec = apply_striping(tmp_path, "ceph", 1 * MIB, 4)
    assert rec["xattr"] == {"ceph.dir.layout": ceph_layout(1 * MIB, 4)}
    assert rec["applied"] is False  # not a CephFS: the kernel refuses the ceph.* name
    assert rec["reason"] == f"setxattr ceph.dir.layout: {os.strerror(errno.EOPNOTSUPP)}"
    rec = apply_striping(tmp_path, "ceph", 4096 * 3, 4)
    assert rec["reason"].startswith("CephFS stripe units are multiples of 65536 bytes")


def test_gluster_shard_block_size_mapping():
    assert [gluster_shard_block_size(n) for n in (64 << 10, 1 * MIB, 4 * MIB, 6 * MIB + 1)] == \
        ["4MB", "4MB", "4MB", "7MB"]


def test_no_striping_where_the_file_system_has_none(tmp_path: Path):
    assert apply_striping(tmp_path, "gpfs", MIB, 4)["reason"] == (
        "not available on gpfs (GPFS stripes by its block size, fixed per file system "
        "(mmcrfs -B))")
    assert apply_striping(tmp_path, "nfs4", MIB, 4)["reason"] == \
        "not available on nfs4 (NFS has no client-side layout)"
