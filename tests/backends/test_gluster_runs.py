"""Whole runs (`ckptbench run`) on a real GlusterFS: the DCP, N-N (`per-rank`) and N-1
(`shared`) file patterns, buffered and O_DIRECT, on a plain and a sharded volume, with
shifted restores; the restore plans (DCP's onto other layouts, each rank's files); what
the run record says about the file system and its striping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ckptbench.plan import build_plan
from ckptbench.plan.files import plan_layout
from ckptbench.spec import load_workload
from harness.gluster import GlusterBed

from . import TINY


def workload(tmp_path: Path, files: str, stripe_count: int = 0) -> Path:
    path = tmp_path / f"tiny-{files}.toml"
    path.write_text(TINY.read_text().replace(
        "[parallel]", f'[checkpoint]\nfiles = "{files}"\nthreads = 2\nstripe_size = 1048576\n'
        f"stripe_count = {stripe_count}\n\n[parallel]"))
    return path


def run(*args: str) -> list[dict]:
    results = Path(args[args.index("--results") + 1])
    r = subprocess.run([sys.executable, "-m", "ckptbench", "run", *args], capture_output=True,
                       text=True, timeout=300, env=os.environ.copy())
    assert r.returncode == 0, r.stderr[-2000:]
    return [json.loads(line) for line in results.read_text().splitlines()]


@pytest.mark.parametrize(("files", "io", "volume", "shift"), [
    ("dcp", "buffered", "plain", 0),
    ("dcp", "direct", "plain", 1),
    ("per-rank", "buffered", "plain", 2),
    ("per-rank", "direct", "shard", 0),
    ("shared", "buffered", "plain", 1),
    ("shared", "direct", "plain", 0),
    ("shared", "buffered", "shard", 3),
])
def test_file_pattern_round_trip(gluster: GlusterBed, tmp_path: Path, files: str, io: str,
                                 volume: str, shift: int) -> None:
    w = workload(tmp_path, files, stripe_count=2)
    target = getattr(gluster, volume).path / f"run-{files}-{io}-{uuid.uuid4().hex[:6]}"
    try:
        recs = run(str(w), "--target", str(target), "--results", str(tmp_path / "r.jsonl"),
                   "--io", io, "--block-size", "1MiB", "--restore-shift", str(shift),
                   "--iterations", "2", "--keep")
        phases = [r for r in recs if r["type"] == "phase"]
        restores = [p for p in phases if p["phase"] == "restore"]
        assert [p["ok"] for p in phases] == [True] * 4
        assert all(p["verified"] and p["restore_shift"] == shift for p in restores)
        assert {p["cache"] for p in restores} == {"direct" if io == "direct"
                                                  else "fadvise+drop_caches"}
        env = recs[0]["environment"]["target"]
        assert (env["fs_type"], env["fs_family"]) == ("fuse.glusterfs", "parallel")
        plan = build_plan(load_workload(w))
        (ckpt,) = target.glob("run-*/checkpoint-1")
        on_disk = {p.name: p.stat().st_size for p in ckpt.iterdir() if p.name != ".metadata"}
        if files == "shared":
            layout = plan_layout(plan)
            assert on_disk == {"checkpoint.bin": layout.shared_size["checkpoint.bin"]}
        elif files == "per-rank":
            assert on_disk == {f"rank_{r}.bin": n for r, n in enumerate(plan.file_bytes.tolist())}
        else:
            assert on_disk == dict(zip(plan.file_paths, plan.file_bytes.tolist(), strict=True))
            assert all(name.endswith(".distcp") for name in on_disk)
        saved = sum(r["bytes"] for r in recs if r["type"] == "rank" and r["phase"] == "save")
        assert saved == 2 * plan.total_bytes
        # Striping: not settable from a Gluster client; the record says so and what is set.
        striping = recs[0]["striping"]
        assert striping["applied"] is False and striping["fs_type"] == "fuse.glusterfs"
        assert "features.shard-block-size 4MB" in striping["reason"]
        assert striping["gluster_shard"] == ({"enabled": True, "block_size": "4MB"}
                                             if volume == "shard" else {"enabled": False})
    finally:
        import shutil
        shutil.rmtree(target, ignore_errors=True)



@pytest.mark.parametrize(("volume", "args", "plan", "world", "amplification"), [
    ("plain", ("--restore-layout", "world_size=2,tp=1"), "dcp", 2, 1.0),  # resharded
    ("shard", ("--restore-layout", "world_size=8,dp_replicate=2"), "dcp", 8, 2.0),  # HSDP
    ("plain", ("--restore-plan", "files", "--restore-shift", "1"), "files", 4, 1.0),
])
def test_restore_plans(gluster: GlusterBed, tmp_path: Path, volume: str,
                       args: tuple[str, ...], plan: str, world: int,
                       amplification: float) -> None:
    """The restore plans on Gluster: DCP's load planner onto another layout (fewer
    ranks, HSDP replicas reading the checkpoint twice), and each rank's own files read
    back by another rank; every chunk verified, bytes read as planned."""
    target = getattr(gluster, volume).path / f"restore-{plan}-{uuid.uuid4().hex[:6]}"
    try:
        recs = run(str(TINY), "--target", str(target), "--results", str(tmp_path / "r.jsonl"),
                   "--block-size", "1MiB", *args)
        (phase,) = [r for r in recs if r["type"] == "phase" and r["phase"] == "restore"]
        assert phase["ok"] and phase["verified"] and phase["mismatched_chunks"] == 0
        assert phase["restore_plan"] == plan
        if plan == "dcp":
            assert phase["restore_world_size"] == world
            assert phase["amplification"] == pytest.approx(amplification, abs=0.01)
        else:
            assert phase["restore_shift"] == 1
        assert phase["cache"] == "fadvise+drop_caches"
        summaries = {s["phase"]: s for s in recs if s["type"] == "summary"}
        assert summaries["restore"]["bytes"] == pytest.approx(
            amplification * summaries["save"]["bytes"], rel=0.01)
        readers = {r["rank"] for r in recs if r["type"] == "rank" and r["phase"] == "restore"}
        assert readers == set(range(world))
    finally:
        import shutil
        shutil.rmtree(target, ignore_errors=True)

def test_the_workloads_stripe_size_as_the_shard_block_size_of_a_volume_we_own(
        gluster: GlusterBed, tmp_path: Path) -> None:
    """Gluster's striping is the shard translator, a volume option: for a volume the
    harness owns, [checkpoint] stripe_size becomes its shard block size; the run record
    shows what the client's graph has, and the bricks hold pieces of that size."""
    from ckptbench.backends.striping import gluster_shard_block_size

    stripe = 8 << 20
    server = gluster.server
    server.create_volume("ckbstripe", shard_block_size=gluster_shard_block_size(stripe))
    mount = server.mount("ckbstripe")
    try:
        w = tmp_path / "w.toml"
        w.write_text(TINY.read_text().replace(
            "[parallel]", f'[checkpoint]\nfiles = "shared"\nstripe_size = {stripe}\n'
            "stripe_count = -1\n\n[parallel]"))
        recs = run(str(w), "--target", str(mount.path / "t"), "--results",
                   str(tmp_path / "r.jsonl"), "--keep")
        striping = recs[0]["striping"]
        assert striping["gluster_shard"] == {"enabled": True, "block_size": "8MB"}
        assert striping["applied"] is False and "features.shard-block-size 8MB" in \
            striping["reason"]
        size = plan_layout(build_plan(load_workload(w))).shared_size["checkpoint.bin"]
        pieces = sorted(p.stat().st_size for brick in server.volumes["ckbstripe"].bricks
                        for p in (brick / ".shard").glob("*") if p.is_file())
        # (.shard/.remove_me, a directory, is where Gluster notes shards to delete)
        # Block 0 stays in the base file; the others are pieces of at most 8 MiB (each
        # rank's region starts a block, so a piece ends where its region's data does).
        assert len(pieces) == -(-size // stripe) - 1
        assert all(0 < n <= stripe for n in pieces) and max(pieces) > stripe // 2
    finally:
        server.delete_volume("ckbstripe")
