"""--mode async end to end: a training loop checkpointing in the background on real files,
MinIO and under mpirun; every byte verified, failures that leave the last durable
checkpoint intact, and a checkpoint that waits for the persist before it."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import xxhash
from test_mpi import TINY, files_of, local, mpirun, needs_mpi, records

from ckptbench.backends.local import LocalBackend
from ckptbench.errors import RunFailed
from ckptbench.formats.manifest import Manifest
from ckptbench.plan import build_plan
from ckptbench.records import JsonlSink
from ckptbench.report.asynchronous import summarize_async
from ckptbench.runner.comm import SingleComm
from ckptbench.runner.driver import run_iterations
from ckptbench.runner.options import LoopOptions, RunOptions
from ckptbench.runner.staging import cuda_available
from ckptbench.spec import load_workload
from ckptbench.testing.faults import FullDiskBackend, SlowBackend
from harness import FaultProxy, MinioServer

# Short steps keep the tests fast; 2 steps between checkpoints.
LOOP = ("--mode", "async", "--step-seconds", "0.02", "--steps-per-checkpoint", "2",
        "--block-size", "1MiB")
PLAN = build_plan(load_workload(TINY))
BANNER = re.compile(r"^\S+: \d+ of \d+ ranks, [0-9.]+ GiB per checkpoint, \d+ iteration")


def of_type(recs: list[dict], kind: str) -> list[dict]:
    return [r for r in recs if r["type"] == kind]


def assert_async_run(recs: list[dict], checkpoints: int, processes: int,
                     device: str = "host") -> dict:
    """The records an async run must hold; returns its async summary."""
    loops = of_type(recs, "loop")
    assert sorted(r["process"] for r in loops) == list(range(processes))
    assert sum(r["bytes"] for r in loops) == PLAN.total_bytes
    total = (checkpoints + 1) * 2
    steps = of_type(recs, "steps")
    assert sorted((r["loop"], r["process"]) for r in steps) == sorted(
        (loop, p) for loop in ("baseline", "async") for p in range(processes))
    assert all(len(r["seconds"]) == total and min(r["seconds"]) > 0 for r in steps)
    cks = of_type(recs, "checkpoint")
    assert sorted((c["iteration"], c["process"]) for c in cks) == [
        (i, p) for i in range(1, checkpoints + 1) for p in range(processes)]
    for c in cks:
        assert c["ok"] and c["blocking_s"] >= c["snapshot_s"] > 0 and c["limit_s"] > 0
        assert c["persist_s"] > c["durable_after_s"] >= 0
        assert c["start_ns"] < c["resume_ns"] < c["durable_ns"]
    saves = [p for p in of_type(recs, "phase") if p["phase"] == "save"]
    restores = [p for p in of_type(recs, "phase") if p["phase"] == "restore"]
    assert [p["iteration"] for p in saves if p["ok"]] == list(range(1, checkpoints + 1))
    assert [p["iteration"] for p in restores] == list(range(1, checkpoints + 1))
    assert all(p["verified"] and p["mismatched_chunks"] == 0 for p in restores)
    saved = {}
    for r in of_type(recs, "rank"):
        if r["phase"] == "save":
            saved[r["rank"]] = saved.get(r["rank"], 0) + r["bytes"]
    assert saved == {r: b * checkpoints for r, b in enumerate(PLAN.rank_bytes().tolist())}
    (summary,) = of_type(recs, "async_summary")
    assert summary["checkpoints"] == checkpoints and summary["failed"] == 0
    assert summary["processes"] == processes and summary["device"] == device
    assert summary["blocking_s"]["median"] > 0 and summary["persist_s"]["median"] > 0
    assert summary["baseline_step_s"] > 0
    # Not measurable only where the loop's steps slowed by more than the persists lasted
    # (a machine whose load drifted: beside two busy loops it happened under mpirun).
    assert summary["interference"] is not None or (
        summary["extra_step_s"] >= summary["persist_window_s"]), summary
    detail = summary["per_checkpoint"]
    assert sorted((c["iteration"], c["process"]) for c in detail) == sorted(
        (c["iteration"], c["process"]) for c in cks)
    # Every step of the loop falls before the first checkpoint, or during or after one
    # checkpoint's persist.
    for p in range(processes):
        mine = sorted((c for c in detail if c["process"] == p), key=lambda c: c["iteration"])
        placed = mine[0]["steps"]["before"]["count"] + sum(
            c["steps"]["during"]["count"] + c["steps"]["after"]["count"] for c in mine)
        assert placed == total, mine
    assert sum(c["steps"]["during"]["count"] for c in detail) == summary["steps_during_persist"]
    return summary


def test_async_run_on_local_files_writes_what_a_sync_run_writes(tmp_path):
    a, _ = local(str(TINY), "--target", str(tmp_path / "async"), "--results",
                 str(tmp_path / "a.jsonl"), "--iterations", "3", "--keep", *LOOP)
    assert a.returncode == 0, a.stderr
    assert "asynchronous checkpoints" in a.stdout and "interference" in a.stdout
    recs = records(tmp_path / "a.jsonl")
    assert recs[0]["options"]["mode"] == "async"
    assert_async_run(recs, checkpoints=3, processes=4)
    assert of_type(recs, "loop")[0]["snapshot"] == "full"
    # The checkpoints are those a sync run writes, byte for byte (payload: seed, file,
    # iteration), each committed with its manifest.
    s, _ = local(str(TINY), "--target", str(tmp_path / "sync"), "--results",
                 str(tmp_path / "s.jsonl"), "--iterations", "3", "--keep", "--block-size", "1MiB")
    assert s.returncode == 0, s.stderr
    assert files_of(tmp_path / "async") == files_of(tmp_path / "sync")
    (run_dir,) = [p for p in (tmp_path / "async").iterdir() if p.is_dir()]
    assert sorted(p.parent.name for p in run_dir.rglob(".metadata")) == [
        f"checkpoint-{i}" for i in (1, 2, 3)]


def test_staging_smaller_than_the_state_snapshots_in_pieces(tmp_path):
    r, _ = local(str(TINY), "--target", str(tmp_path / "t"), "--results",
                 str(tmp_path / "r.jsonl"), "--iterations", "2", "--threads", "2",
                 "--staging-memory", "1MiB", *LOOP)
    assert r.returncode == 0, r.stderr
    recs = records(tmp_path / "r.jsonl")
    assert_async_run(recs, checkpoints=2, processes=4)
    assert {(x["snapshot"], x["staging_bytes"]) for x in of_type(recs, "loop")} == {
        ("piecewise", 1 << 20)}
    assert not (tmp_path / "t").exists()  # removed after the restores


def _in_process(tmp_path: Path, backend, iterations: int, **loop) -> JsonlSink:
    sink = JsonlSink(tmp_path / f"{uuid.uuid4().hex[:6]}.jsonl")
    sink.open()
    backend.prepare()
    options = RunOptions(iterations=iterations, mode="async", block_size=1 << 20,
                         run_id="run-t", loop=LoopOptions(**loop))
    try:
        run_iterations(PLAN, [0, 1, 2, 3], [0, 1, 2, 3], backend, SingleComm(), options, sink)
    finally:
        sink.close()
    return sink


def test_a_checkpoint_due_while_the_last_persist_runs_waits_and_is_recorded(tmp_path):
    # Every write waits 20 ms: a persist takes far longer than a 1 ms step.
    backend = SlowBackend(LocalBackend(str(tmp_path / "t")), 0.02)
    sink = _in_process(tmp_path, backend, 3, step_seconds=0.001, steps_per_checkpoint=1)
    cks = {c["iteration"]: c for c in of_type(sink.records, "checkpoint")}
    assert cks[1]["wait_s"] == 0.0  # nothing in flight before the first
    for it in (2, 3):
        previous = cks[it - 1]
        assert cks[it]["wait_s"] > 0 and cks[it]["blocking_s"] >= cks[it]["wait_s"]
        # One persist in flight: the snapshot started only once the last one was durable.
        assert cks[it]["start_ns"] + cks[it]["wait_s"] * 1e9 >= previous["durable_ns"]
    (summary,) = summarize_async(sink.records)
    assert summary["waited_checkpoints"] == 2
    assert summary["blocking_s"]["max"] >= summary["wait_s"]["max"] > 0
    assert all(p["verified"] for p in of_type(sink.records, "phase") if p["phase"] == "restore")


def _intact(checkpoint: Path) -> None:
    """Every chunk of a committed checkpoint hashes to its manifest's digest."""
    manifest = Manifest.decode((checkpoint / ".metadata").read_bytes())
    assert manifest["files"]
    for key, entry in manifest["files"].items():
        data = (checkpoint / key.split("/", 2)[2]).read_bytes()
        assert len(data) == entry["size"]
        for (_name, offset, nbytes), want in zip(entry["chunks"], entry["digests"], strict=True):
            assert xxhash.xxh3_64_intdigest(data[offset:offset + nbytes]) == want


def _error_lines(stderr: str) -> list[str]:
    """stderr without the run's banner (printed there before the run starts)."""
    return [x for x in stderr.splitlines() if x.strip() and not BANNER.match(x)]


def _assert_failed_at_2(r: subprocess.CompletedProcess[str], target: Path, results: Path,
                        cause: str) -> None:
    assert r.returncode == 2, r.stderr
    lines = _error_lines(r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("ckptbench: error: checkpoint 2: the background persist failed")
    assert cause in lines[0].lower() and "checkpoint 1 is the last durable one" in lines[0]
    (run_dir,) = [p for p in target.iterdir() if p.is_dir()]
    assert sorted(p.parent.name for p in run_dir.rglob(".metadata")) == ["checkpoint-1"]
    assert not (run_dir / "checkpoint-2").exists()  # the failed one is removed
    _intact(run_dir / "checkpoint-1")
    recs = records(results)
    errors = of_type(recs, "error")
    assert [(e["iteration"], e["phase"]) for e in errors] == [(2, "save")]
    assert cause in errors[0]["message"].lower()
    saves = [(p["iteration"], p["ok"]) for p in of_type(recs, "phase") if p["phase"] == "save"]
    assert saves == [(1, True), (2, False)]


def test_a_persist_failing_with_enospc_leaves_no_manifest_and_checkpoint_1_intact(tmp_path):
    # Each process may write 1 MB of checkpoint-2's files, then the disk is full.
    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    r, _ = local(str(TINY), "--target", str(target), "--results", str(results),
                 "--iterations", "3", "--keep", *LOOP,
                 faults=("--full-file", "checkpoint-2/", "--full-after", "1000000"))
    _assert_failed_at_2(r, target, results, "no space left on")


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def test_a_real_full_disk_fails_the_second_checkpoint_cleanly(tmp_path):
    """tmpfs of 36 MiB: checkpoint 1 (22.5 MiB) fits, checkpoint 2 runs out of space."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "36m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        target, results = disk / "t", tmp_path / "r.jsonl"
        r, _ = local(str(TINY), "--target", str(target), "--results", str(results),
                     "--iterations", "3", "--keep", *LOOP)
        _assert_failed_at_2(r, target, results, "no space left on")
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.s3
def test_stopping_minio_fails_the_checkpoint_in_flight_and_keeps_the_durable_one(
        minio_server, tmp_path):
    server = MinioServer(minio_server.binary, data_dir=tmp_path / "minio-data").start()
    bucket = server.make_bucket()
    held: list[list[str]] = []  # what MinIO held when it was killed
    killed = threading.Event()

    def checkpoint_2(method: str, path: str) -> bool:
        """The first request of checkpoint 2 (the run begins it only once checkpoint 1 is
        committed: one persist in flight) kills MinIO and closes the endpoint's port: the
        state waited for, never a timer, whatever the load. This request is reset
        unanswered, and every later one is refused."""
        if killed.is_set() or "checkpoint-2" not in path:
            return False
        held.append(server.list_keys(bucket, "stop/"))
        server.kill()
        proxy.server.shutdown()
        proxy.server.server_close()
        killed.set()
        return True

    proc = None
    proxy = FaultProxy(server.endpoint, ["reset"], checkpoint_2).start()
    try:
        results = tmp_path / "r.jsonl"
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckptbench", "run", str(TINY), "--target",
             f"s3://{bucket}/stop", "--endpoint-url", proxy.endpoint, "--iterations", "3",
             "--keep", "--results", str(results), "--mode", "async", "--step-seconds", "0.05",
             "--steps-per-checkpoint", "10"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
            env=server.env())
        while not killed.wait(0.05):
            if proc.poll() is not None:
                pytest.fail(f"checkpoint 2 was never begun: {proc.communicate()[1][-3000:]}")
        (keys,) = held
        assert any(k.endswith("checkpoint-1/.metadata") for k in keys), keys
        assert not any("checkpoint-2/" in k for k in keys), keys
        out, err = proc.communicate(timeout=600)
        # The error, and (MinIO being down) a note that the run's clean-up could not reach it
        lines = [x for x in _error_lines(err) if not x.startswith("ckptbench: note: cleaning up")]
        assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in err, err
        # MinIO is gone when checkpoint 2 is due: making its directory fails, or its
        # persist; either way no manifest, and checkpoint 1 is the last durable one
        failed = re.match(r"ckptbench: error: checkpoint 2: (its directory could not be "
                          r"made|the background persist failed): .*cannot reach the endpoint",
                          lines[0])
        assert failed, lines[0]
        durable = 1
        assert f"no manifest written; checkpoint {durable} is the last durable one" in lines[0]
        assert server.access_key not in err + out + results.read_text()
        server.start()  # same data: what is left
        keys = server.list_keys(bucket, "stop/")
        committed = [k.split("/")[-2] for k in keys if k.endswith("/.metadata")]
        assert committed == [f"checkpoint-{i}" for i in range(1, durable + 1)]
        manifest = Manifest.decode(server.client().get_object(
            Bucket=bucket, Key=next(k for k in keys if k.endswith("/.metadata")))["Body"].read())
        for key, entry in manifest["files"].items():
            body = server.client().get_object(Bucket=bucket, Key=f"stop/{key}")["Body"].read()
            for (_n, offset, nbytes), want in zip(entry["chunks"], entry["digests"], strict=True):
                assert xxhash.xxh3_64_intdigest(body[offset:offset + nbytes]) == want
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        proxy.stop()
        server.stop()


@pytest.mark.s3
def test_async_run_on_minio(minio_server, tmp_path):
    results = tmp_path / "r.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "ckptbench", "run", str(TINY), "--target",
         f"s3://{minio_server.bucket}/async-{uuid.uuid4().hex[:8]}", "--endpoint-url",
         minio_server.endpoint, "--iterations", "2", "--results", str(results), *LOOP],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=minio_server.env())
    assert r.returncode == 0, r.stderr
    assert_async_run(records(results), checkpoints=2, processes=4)
    assert minio_server.secret_key not in r.stdout + r.stderr + results.read_text()


@needs_mpi
@pytest.mark.parametrize("np", [4, 2])
def test_async_run_under_mpirun(tmp_path, np):
    results = tmp_path / "r.jsonl"
    r, _ = mpirun(np, str(TINY), "--target", str(tmp_path / "t"), "--results", str(results),
                  "--iterations", "2", *LOOP, timeout=240)
    assert r.returncode == 0, r.stderr
    # rank 0 prints: one results line, the async table (in parts: 80 columns under mpirun)
    assert r.stdout.count("results: ") == 1 and "asynchronous checkpoints" in r.stdout
    recs = records(results)
    assert recs[0]["launcher"] == "mpi"
    assert_async_run(recs, checkpoints=2, processes=np)
    loops = of_type(recs, "loop")
    assert sorted(x["ranks"] for x in loops) == recs[0]["mpi"]["groups"]


def test_loop_flags_need_async_mode_and_bad_values_are_one_line(tmp_path):
    cases = [
        (["--step-seconds", "2"], "--step-seconds needs --mode async"),
        (["--mode", "async", "--step-seconds", "0"], "--step-seconds 0.0 must be > 0"),
        (["--mode", "async", "--format", "zarr"], "--mode async persists with --format raw"),
        (["--mode", "async", "--staging-memory", "1KiB"],
         "--staging-memory 1024 B holds no block of --block-size"),
        (["--mode", "async", "--mode", "later"], "'later' is not one of 'sync', 'async'"),
    ]
    if not cuda_available():
        needs = "needs torch with CUDA" if importlib.util.find_spec("torch") is None else \
            "torch with CUDA is not available here"
        cases.append((["--mode", "async", "--state-device", "cuda"], needs))
    for args, message in cases:
        r, _ = local(str(TINY), "--target", str(tmp_path / "t"), *args)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, r.stderr)
        assert not (tmp_path / "t").exists()


def test_run_failed_is_what_the_library_raises(tmp_path):
    """In process: the failed persist surfaces as RunFailed naming the checkpoint."""
    backend = FullDiskBackend(LocalBackend(str(tmp_path / "t")), lambda k: "checkpoint-2/" in k,
                              0)
    with pytest.raises(RunFailed, match=r"checkpoint 2: the background persist failed: .*(?i:no "
                                        r"space left on)"):
        _in_process(tmp_path, backend, 3, step_seconds=0.01, steps_per_checkpoint=1)


@pytest.mark.skipif(not cuda_available(), reason="needs torch with CUDA")
def test_async_run_with_the_state_on_the_gpu(tmp_path):
    """CUDA tensors, pinned staging, device-to-host snapshots, every byte verified."""
    r, _ = local(str(TINY), "--target", str(tmp_path / "t"), "--results",
                 str(tmp_path / "r.jsonl"), "--iterations", "2", "--state-device", "cuda",
                 "--staging-memory", "2MiB", *LOOP)
    assert r.returncode == 0, r.stderr
    recs = records(tmp_path / "r.jsonl")
    summary = assert_async_run(recs, checkpoints=2, processes=4, device="cuda")
    assert summary["kernel"] == "matmul" and summary["copy_bytes_per_s"] > 0
