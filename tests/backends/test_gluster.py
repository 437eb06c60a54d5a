"""The local/POSIX backend on a real GlusterFS (FUSE): the conformance suite on a plain
distributed volume (buffered and O_DIRECT) and on a sharded one, and the harness itself:
what the volumes look like on their bricks, and a teardown that ends only its own."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from ckptbench.backends.filesystems import FileSystem, gluster_graph
from ckptbench.backends.local import LocalBackend
from harness.gluster import GlusterBed, GlusterServer, is_mounted

from .test_local import LocalConformance

MIB = 1 << 20


def brick_files(server: GlusterServer, volume: str) -> dict[str, dict[str, int]]:
    """brick -> {relative path: size} of the regular files a volume's bricks hold (not
    Gluster's own .glusterfs tree)."""
    out: dict[str, dict[str, int]] = {}
    for brick in server.volumes[volume].bricks:
        files = {}
        for dirpath, dirs, names in os.walk(brick):
            dirs[:] = [d for d in dirs if d != ".glusterfs"]
            for n in names:
                p = Path(dirpath) / n
                files[str(p.relative_to(brick))] = p.stat().st_size
        out[brick.name] = files
    return out


def assert_untouched(gluster: GlusterBed) -> None:
    """The session's server, its four bricks and both clients of the plain volume work."""
    assert gluster.server.proc is not None and gluster.server.proc.poll() is None
    assert len(gluster.server.brick_pids()) == 4
    probe = gluster.plain.path / f"alive-{uuid.uuid4().hex[:6]}"
    probe.write_bytes(b"ok")
    assert (gluster.other.path / probe.name).read_bytes() == b"ok"
    probe.unlink()


class GlusterConformance(LocalConformance):
    mount = "plain"

    @pytest.fixture
    def target(self, gluster: GlusterBed) -> str:
        mount: Path = getattr(gluster, self.mount).path
        return str(mount / f"conf-{uuid.uuid4().hex[:8]}")


class TestGlusterBuffered(GlusterConformance):
    io = "buffered"


class TestGlusterDirect(GlusterConformance):
    """O_DIRECT through FUSE: the client's page cache is bypassed; Gluster accepts it."""

    io = "direct"


class TestGlusterShardBuffered(GlusterConformance):
    mount = "shard"
    io = "buffered"


# --- the volumes, as the harness made them ---

def test_plain_volume_spreads_whole_files_over_two_bricks(gluster: GlusterBed, gluster_dir: Path):
    gluster_dir.mkdir()
    for i in range(16):
        (gluster_dir / f"f{i}").write_bytes(os.urandom(1000 + i))
    per_brick = brick_files(gluster.server, "ckb")
    assert len(per_brick) == 2
    held = {b: [k for k in files if k.startswith(gluster_dir.name + "/")]
            for b, files in per_brick.items()}
    assert all(held.values()), held  # distributed: both bricks hold some of the files
    assert sorted(k for ks in held.values() for k in ks) == sorted(
        f"{gluster_dir.name}/f{i}" for i in range(16))  # each file whole, on one brick
    assert (gluster.other.path / gluster_dir.name / "f3").read_bytes() == \
        (gluster_dir / "f3").read_bytes()  # the second client sees the same files


def test_shard_volume_splits_a_file_into_4mb_pieces_across_bricks(gluster: GlusterBed):
    name = f"sharded-{uuid.uuid4().hex[:6]}"
    data = os.urandom(10 * MIB + 5)
    (gluster.shard.path / name).write_bytes(data)
    try:
        files = {k: v for b in brick_files(gluster.server, "ckbshard").values()
                 for k, v in b.items()}
        assert files[name] == 4 * MIB  # the base file holds the first block only
        pieces = sorted(v for k, v in files.items() if k.startswith(".shard/"))
        assert pieces == [2 * MIB + 5, 4 * MIB]  # blocks 1 and 2 in Gluster's .shard tree
        assert (gluster.shard.path / name).read_bytes() == data
    finally:
        (gluster.shard.path / name).unlink()


def test_the_mount_table_says_fuse_glusterfs_and_the_record_keeps_no_secrets(
        gluster: GlusterBed, gluster_dir: Path):
    fs = FileSystem.of(gluster_dir)
    assert (fs.fs_type, fs.family, fs.mount_point) == (
        "fuse.glusterfs", "parallel", str(gluster.plain.path))
    details = LocalBackend(str(gluster_dir)).details()
    assert details["fs_type"] == "fuse.glusterfs"
    assert details["mount_source"] == f"{gluster.server.host}:ckb"
    assert "gluster performance/write-behind" in details["client_caches"]
    assert details["gluster_shard"] == {"enabled": False}
    assert details["server_caches"].startswith("not controlled")
    shard = LocalBackend(str(gluster.shard.path / "x")).details()["gluster_shard"]
    assert shard == {"enabled": True, "block_size": "4MB"}
    # The client graph's volfile carries the volume's username and password: never recorded.
    volfile = (gluster.plain.path / ".meta/graphs/active/volfile").read_text()
    secret = next(line.split()[2] for line in volfile.splitlines()
                  if line.split()[:2] == ["option", "password"])
    assert secret not in json.dumps(details)
    assert "password" not in json.dumps([t.options for t in gluster_graph(gluster.plain.path)])


def test_a_second_server_runs_beside_and_its_teardown_ends_only_its_own(gluster: GlusterBed):
    with GlusterServer() as other:
        assert other.host != gluster.server.host  # glusterd's port is taken on the first
        other.create_volume("solo")
        m = other.mount("solo")
        (m.path / "x").write_bytes(b"x" * 100)
        pids = [other.proc.pid, m.pid, *other.brick_pids()]  # type: ignore[union-attr]
        assert len(pids) == 4 and all(pids)
        base, mount = other.base, m.path
        outside = [*other.volumes["solo"].sockets, *(
            Path("/var/log/glusterfs/bricks") / (str(b).strip("/").replace("/", "-") + ".log")
            for b in other.volumes["solo"].bricks)]
        assert len(outside) == 4 and all(p.exists() for p in outside)
    for pid in pids:  # gone (or at most a zombie of someone else's: not ours to reap)
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split(")")[1].split()[0] == "Z", pid
    assert not is_mounted(mount) and not base.exists()
    assert not [p for p in outside if p.exists()]  # its brick sockets and logs too
    assert_untouched(gluster)


def test_the_harness_command_needs_a_command(capsys):
    from harness.gluster_cli import main

    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "a command to run is required" in capsys.readouterr().err


LEFT_BEHIND = """
import os, signal
from harness.gluster import GlusterServer
server = GlusterServer().start()
server.create_volume("left")
mount = server.mount("left")
(mount.path / "x").write_bytes(b"x")
print(server.base, mount.path, *server.brick_pids(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no stop(), no finalizer: what a killed CI job leaves
"""


def test_the_sweep_ends_what_a_killed_harness_left_and_nothing_else(
        gluster: GlusterBed, request):
    import shutil
    import subprocess
    import sys
    import tempfile

    from harness.gluster import BASE_ENV
    from harness.gluster_sweep import main as sweep_main
    from harness.gluster_sweep import mounts_under, processes_under

    under = Path(tempfile.mkdtemp(prefix="ckb-sweep-"))  # short: glusterd's socket is in it
    request.addfinalizer(lambda: shutil.rmtree(under, ignore_errors=True))
    done = subprocess.run([sys.executable, "-c", LEFT_BEHIND], capture_output=True, text=True,
                          timeout=120, env={**os.environ, BASE_ENV: str(under)})
    assert done.returncode == -9, done.stderr[-2000:]
    base, mount, *bricks = done.stdout.split()
    assert Path(base).parent == under and len(bricks) == 2
    # glusterd and the client die with the harness (death signal); the bricks do not.
    deadline = time.monotonic() + 10
    while sorted(processes_under(under)) != sorted(map(int, bricks)) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(processes_under(under)) == sorted(map(int, bricks))
    assert mounts_under(under) == [mount]  # a dead client's mount stays in the table
    brick_args = [Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
                  for pid in bricks]
    outside = [Path(a[a.index(flag) + 1]) for a in brick_args for flag in ("-l", "-S")]
    assert all(p.exists() and under not in p.parents for p in outside)

    assert sweep_main([str(under)]) == 0
    assert processes_under(under) == {} and mounts_under(under) == []
    assert not [p for p in outside if p.exists()]
    assert_untouched(gluster)


def test_the_sweep_needs_a_directory(tmp_path: Path, capsys):
    from harness.gluster_sweep import main as sweep_main

    with pytest.raises(SystemExit) as exc:
        sweep_main([str(tmp_path / "absent")])
    assert exc.value.code == 2
    assert "is not a directory" in capsys.readouterr().err


def test_a_directory_too_deep_for_glusterds_socket_is_refused_in_one_line(
        gluster: GlusterBed, tmp_path: Path):
    from harness import ToolError

    base = tmp_path / ("d" * 100)
    with pytest.raises(ToolError, match=r"too long a path for glusterd's socket; use a "
                                        r"shorter directory \(CKPTBENCH_GLUSTER_DIR\)$"):
        GlusterServer(base).start()
    assert not base.exists()
