"""File patterns of parallel file systems: N-N (per-rank), N-1 (shared, stripe-aligned
regions), DCP's many files per rank; striping hints (lfs / beegfs-ctl) where they exist."""

from __future__ import annotations

import json
import mmap
import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ckptbench.backends.base import Backend
from ckptbench.backends.local import LocalBackend, LocalOptions, apply_striping, striping_command
from ckptbench.errors import BackendError, SpecError
from ckptbench.formats.base import file_jobs
from ckptbench.formats.manifest import Manifest, manifest_files
from ckptbench.measure import measure
from ckptbench.plan import build_plan
from ckptbench.plan.files import SHARED_FILE_NAME, plan_layout, region_layout
from ckptbench.runner import RunRequest
from ckptbench.runner.options import RunOptions
from ckptbench.runner.session import check_supported, striping_record
from ckptbench.spec import Workload, load_workload, parse_workload

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "workloads" / "tiny.toml"


def tiny(files: str = "dcp", **ckpt: int) -> Workload:
    w = load_workload(TINY)
    return replace(w, checkpoint=replace(w.checkpoint, files=files, **ckpt))


def ckptbench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


# --- the plan ---

def test_per_rank_is_one_file_per_rank_with_dcp_single_thread_contents():
    dcp, per_rank = build_plan(tiny("dcp")), build_plan(tiny("per-rank"))
    assert per_rank.file_paths == tuple(f"rank_{r}.bin" for r in range(4))
    assert per_rank.file_rank.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(per_rank.file_bytes, dcp.file_bytes)
    np.testing.assert_array_equal(per_rank.chunk_file_offset, dcp.chunk_file_offset)
    assert not plan_layout(per_rank).shared_size


def test_per_rank_ignores_threads_while_dcp_splits_files():
    assert build_plan(tiny("per-rank", threads=4)).n_files == 4
    assert build_plan(tiny("dcp", threads=4)).n_files == 16


def test_shared_regions_are_stripe_aligned_disjoint_and_in_rank_order():
    stripe = 1 << 20
    plan = build_plan(tiny("shared", stripe_size=stripe))
    assert set(plan.file_paths) == {SHARED_FILE_NAME}
    assert plan.file_rank.tolist() == [0, 1, 2, 3]
    layout = plan_layout(plan)
    base, nbytes = layout.base.tolist(), plan.file_bytes.tolist()
    assert base[0] == 0 and all(b % stripe == 0 for b in base)
    for r in range(3):
        assert base[r] + nbytes[r] <= base[r + 1] < base[r] + nbytes[r] + stripe
    assert layout.shared_size == {SHARED_FILE_NAME: base[3] + nbytes[3]}
    assert plan.total_bytes == build_plan(tiny("dcp")).total_bytes


def test_region_layout_edge_cases():
    # An empty rank gets an empty region; paths written by one rank start at 0.
    layout = region_layout(["s", "s", "s", "own"], np.array([10, 0, 5, 7]),
                           np.array([0, 1, 2, 3]), 4096)
    assert layout.base.tolist() == [0, 4096, 4096, 0]
    assert layout.shared_size == {"s": 4096 + 5}
    # An empty last region does not make the file longer than its data.
    layout = region_layout(["s", "s"], np.array([10, 0]), np.array([0, 1]), 4096)
    assert layout.base.tolist() == [0, 4096] and layout.shared_size == {"s": 10}
    assert layout.is_shared("s") and not layout.is_shared("own")
    with pytest.raises(ValueError, match="more than one region"):
        region_layout(["s", "s"], np.array([1, 1]), np.array([0, 0]), 4096)


def test_jobs_and_manifest_name_each_rank_region_of_the_shared_file():
    plan = build_plan(tiny("shared", stripe_size=65536))
    layout = plan_layout(plan)
    jobs = file_jobs(plan, [1, 3], "run/ckpt", 1, 0)
    assert [j.key for j in jobs] == ["run/ckpt/checkpoint.bin"] * 2
    assert [j.offset for j in jobs] == [int(layout.base[1]), int(layout.base[3])]
    assert all(j.file_size == layout.shared_size[SHARED_FILE_NAME] for j in jobs)
    assert [j.name for j in jobs] == ["run/ckpt/checkpoint.bin#1", "run/ckpt/checkpoint.bin#3"]
    files = manifest_files(plan, "run/ckpt", {1: [1], 3: [3]})
    assert set(files) == {j.name for j in jobs}
    assert files["run/ckpt/checkpoint.bin#3"]["offset"] == int(layout.base[3])
    assert files["run/ckpt/checkpoint.bin#3"]["path"] == "run/ckpt/checkpoint.bin"
    # Unshared files keep their plain names (the manifest format is unchanged for them).
    dcp = build_plan(tiny("dcp"))
    assert list(manifest_files(dcp, "c", {0: []})) == ["c/__0_0.distcp"]
    assert file_jobs(dcp, [0], "c", 1, 0)[0].name == "c/__0_0.distcp"


@pytest.mark.parametrize(("ckpt", "message"), [
    ({"stripe_size": 1000}, "[checkpoint] stripe_size = 1000 must be an integer >= 4096"),
    ({"stripe_size": 6000}, "[checkpoint] stripe_size = 6000 must be a multiple of 4096"),
    ({"stripe_count": -2}, "[checkpoint] stripe_count = -2 must be an integer >= -1"),
    ({"files": "n-1"}, "[checkpoint] files = 'n-1' is not allowed; allowed: dcp, per-chunk, "
                       "per-rank, shared, megatron"),
])
def test_checkpoint_table_validation(ckpt, message):
    data = {"model": {"name": "llama3-8b"}, "checkpoint": ckpt}
    with pytest.raises(SpecError) as exc:
        parse_workload(data)
    assert message in str(exc.value)


def test_shared_is_for_the_dcp_family_layouts_only():
    data = {"model": {"name": "llama3-8b"}, "parallel": {"layout": "megatron-deepspeed"},
            "checkpoint": {"files": "shared"}}
    with pytest.raises(SpecError, match="does not fit layout 'megatron-deepspeed'"):
        parse_workload(data)
    w = parse_workload({"model": {"name": "llama3-8b"}, "checkpoint": {"files": "shared"}})
    assert (w.checkpoint.stripe_size, w.checkpoint.stripe_count) == (1 << 20, 0)


# --- the local backend: one file, several writers ---

@pytest.mark.parametrize("io", ["buffered", "direct"])
def test_local_backend_writes_regions_of_one_file(tmp_path, io):
    backend = LocalBackend(str(tmp_path / "t"), LocalOptions(io=io))
    backend.prepare()
    size = 4096 + 100
    backend.create_shared("c/f", size)
    with pytest.raises(BackendError, match="already exists"):
        backend.create_shared("c/f", size)
    buf = np.frombuffer(mmap.mmap(-1, 4096), dtype=np.uint8)  # page-aligned, as O_DIRECT needs
    for offset, n, fill in ((4096, 100, 2), (0, 10, 1)):  # the last region first
        buf[:] = fill
        h = backend.open_write_region("c/f", offset, n, size)
        h.write(memoryview(buf)[:4096 if io == "direct" else n])  # type: ignore[arg-type]
        h.sync()
        h.close()
    data = (tmp_path / "t" / "c" / "f").read_bytes()
    assert len(data) == size  # direct I/O's padding past the end of the file was cut
    assert data[:10] == b"\1" * 10 and data[4096:] == b"\2" * 100
    if io == "direct":
        with pytest.raises(BackendError, match="not aligned"):
            backend.open_write_region("c/f", 100, 1, size)


def test_shared_file_round_trip_end_to_end(tmp_path):
    toml = TINY.read_text().replace("[parallel]", '[checkpoint]\nfiles = "shared"\n'
                                    "stripe_size = 65536\n\n[parallel]")
    workload = tmp_path / "tiny-shared.toml"
    workload.write_text(toml)
    for io in ("buffered", "direct"):
        target, results = tmp_path / f"t-{io}", tmp_path / f"r-{io}.jsonl"
        r = ckptbench("run", str(workload), "--target", str(target), "--results", str(results),
                      "--keep", "--io", io, "--block-size", "1MiB", "--threads", "2")
        assert r.returncode == 0, r.stderr
        (ckpt,) = target.glob("run-*/checkpoint-1")
        assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "checkpoint.bin"]
        plan = build_plan(load_workload(workload))
        layout = plan_layout(plan)
        assert (ckpt / "checkpoint.bin").stat().st_size == layout.shared_size["checkpoint.bin"]
        manifest = Manifest.decode((ckpt / ".metadata").read_bytes())
        assert len(manifest["files"]) == 4
        recs = [json.loads(x) for x in results.read_text().splitlines()]
        restore = [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]
        assert restore[0]["verified"]
        saved = {x["rank"]: x["bytes"] for x in recs if x["type"] == "rank" and x["phase"] == "save"}
        assert saved == dict(enumerate(plan.file_bytes.tolist()))


def test_per_rank_round_trip_end_to_end(tmp_path):
    workload = tmp_path / "tiny-n-n.toml"
    workload.write_text(TINY.read_text().replace(
        "[parallel]", '[checkpoint]\nfiles = "per-rank"\nthreads = 2\n\n[parallel]'))
    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    r = ckptbench("run", str(workload), "--target", str(target), "--results", str(results), "--keep")
    assert r.returncode == 0, r.stderr
    (ckpt,) = target.glob("run-*/checkpoint-1")
    plan = build_plan(load_workload(workload))
    assert {p.name: p.stat().st_size for p in ckpt.iterdir() if p.name != ".metadata"} == {
        f"rank_{r}.bin": n for r, n in enumerate(plan.file_bytes.tolist())}
    recs = [json.loads(x) for x in results.read_text().splitlines()]
    assert [x["verified"] for x in recs if x["type"] == "phase" and x["phase"] == "restore"] == [True]


def test_a_corrupted_region_is_named_with_its_offset_in_the_shared_file(tmp_path):
    from ckptbench.formats.raw import RawFormat
    from ckptbench.records import JsonlSink
    from ckptbench.runner.comm import SingleComm
    from ckptbench.runner.driver import run_iterations

    w = tiny("shared", stripe_size=65536)
    w = replace(w, parallel=replace(w.parallel, world_size=2, tp=2))
    plan = build_plan(w)
    backend = LocalBackend(str(tmp_path / "t"))
    backend.prepare()
    writer = JsonlSink(tmp_path / "r.jsonl")
    writer.open()
    run_iterations(plan, [0, 1], [0, 1], backend, SingleComm(),
                   RunOptions(keep=True, restore=False, run_id="x"), writer)
    path = tmp_path / "t" / "x" / "checkpoint-1" / "checkpoint.bin"
    base1 = int(plan_layout(plan).base[1])
    with open(path, "r+b") as f:
        f.seek(base1 + 1000)
        byte = f.read(1)
        f.seek(base1 + 1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    engine = RawFormat(plan, [0, 1], backend, SingleComm(), RunOptions(run_id="x").format_options())
    results = engine.restore(file_jobs(plan, [0, 1], "x/checkpoint-1", 1, 0),
                             "x/checkpoint-1/.metadata").results
    mismatches = [m for r in results for m in r.mismatches]
    assert len(mismatches) == 1 and "checkpoint.bin" in mismatches[0]
    assert f"offset {base1 + 1000} " in mismatches[0]  # in the file, not in the region


class _ObjectStore(Backend):
    """A backend without the shared-file capability (what s3:// is)."""

    name = "s3"

    def prepare(self) -> None: ...
    def release(self) -> None: ...
    def open_write(self, key, size): raise AssertionError
    def open_read(self, key): raise AssertionError
    def put_atomic(self, key, data): raise AssertionError
    def get(self, key): raise AssertionError
    def exists(self, key): return False
    def delete(self, keys): ...
    def list_names(self, prefix, limit): return []


def test_shared_is_refused_for_an_object_store_in_one_line(tmp_path):
    plan = build_plan(tiny("shared"))
    store = _ObjectStore("s3://bucket/prefix")
    with pytest.raises(BackendError) as exc:
        check_supported(plan, store)
    assert str(exc.value) == (
        "[checkpoint] files = 'shared' (one file written by all ranks) needs a file system "
        "target; s3://bucket/prefix is a s3 target; allowed there: dcp, per-rank, per-chunk")
    req = RunRequest(workload=plan.workload, plan=plan, ranks=[0, 1, 2, 3], backend=store,
                     options=RunOptions())
    with pytest.raises(BackendError):
        measure(req, tmp_path / "r.jsonl")
    assert not (tmp_path / "r.jsonl").exists()
    check_supported(build_plan(tiny("per-rank")), store)  # N-N is fine on an object store
    assert striping_record(store, build_plan(tiny("shared", stripe_count=4)), "run")["reason"] \
        == "not available for the s3 backend"


# --- striping hints ---

def _fake_tool(bin_dir: Path, name: str, log: Path, status: int = 0) -> None:
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f'#!/bin/sh\necho "$@" >> {log}\necho "boom" >&2\nexit {status}\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


def test_lfs_setstripe_command_is_run_and_recorded(tmp_path, monkeypatch):
    log = tmp_path / "args.txt"
    _fake_tool(tmp_path / "bin", "lfs", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    d = tmp_path / "dir"
    d.mkdir()
    rec = apply_striping(d, "lustre", 4 << 20, 8)
    assert rec["applied"] is True
    assert rec["command"] == ["lfs", "setstripe", "-S", str(4 << 20), "-c", "8", str(d)]
    assert log.read_text().split() == ["setstripe", "-S", str(4 << 20), "-c", "8", str(d)]


def test_beegfs_setpattern_command(tmp_path, monkeypatch):
    log = tmp_path / "args.txt"
    _fake_tool(tmp_path / "bin", "beegfs-ctl", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    rec = apply_striping(tmp_path, "beegfs", 1 << 20, 4)
    assert rec["applied"] is True
    assert log.read_text().split() == ["--setpattern", "--chunksize=1024k", "--numtargets=4",
                                       str(tmp_path)]
    assert "--numtargets" not in " ".join(striping_command("b", "beegfs", tmp_path, 1 << 20, -1))


def test_striping_not_available_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rec = apply_striping(tmp_path, "lustre", 1 << 20, 4)
    assert rec["applied"] is False and rec["reason"] == "not available: lfs is not on PATH"
    assert apply_striping(tmp_path, "ext4", 1 << 20, 4)["reason"] == \
        "not available on ext4 (striping is mapped on Lustre, BeeGFS, CephFS and GlusterFS only)"
    assert apply_striping(tmp_path, "lustre", 1 << 20, 0)["reason"].startswith("not requested")


def test_a_failing_tool_is_recorded_not_fatal(tmp_path, monkeypatch):
    _fake_tool(tmp_path / "bin", "lfs", tmp_path / "log", status=22)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    rec = apply_striping(tmp_path, "lustre", 1 << 20, 4)
    assert rec["applied"] is False and rec["reason"] == "lfs exited with 22: boom"


def test_run_record_says_striping_was_not_available_on_this_file_system(tmp_path):
    toml = TINY.read_text().replace("[parallel]", "[checkpoint]\nstripe_count = 2\n\n[parallel]")
    workload = tmp_path / "w.toml"
    workload.write_text(toml)
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(workload), "--target", str(tmp_path / "t"), "--results", str(results))
    assert r.returncode == 0, r.stderr
    run = json.loads(results.read_text().splitlines()[0])
    assert run["striping"]["applied"] is False
    assert run["striping"]["reason"].startswith("not available")
    assert run["restore_shift"] == {"value": 0, "source": "auto: local processes (one node)"}
