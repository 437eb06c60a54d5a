"""The pieces of --mode async on their own: the staging ring, snapshots against the
generator's bytes, the step schedule and how steps are placed around a persist."""

from __future__ import annotations

import numpy as np
import pytest
from test_mpi import TINY, local, records

from ckptbench.backends.local import LocalBackend
from ckptbench.errors import RunFailed
from ckptbench.formats.base import file_jobs
from ckptbench.payload import ChunkHasher, PayloadGenerator
from ckptbench.plan import build_plan
from ckptbench.records import JsonlSink
from ckptbench.report.asynchronous import classify_steps
from ckptbench.runner import staging
from ckptbench.runner.comm import SingleComm
from ckptbench.runner.driver import run_iterations
from ckptbench.runner.options import LoopOptions, RunOptions
from ckptbench.runner.staging import FullSnapshot, HostState, _Ring
from ckptbench.runner.training import MemoryKernel, Schedule, schedule, unit_seconds
from ckptbench.spec import load_workload

PLAN = build_plan(load_workload(TINY))


def test_ring_allocates_in_order_and_frees_from_the_oldest():
    ring = _Ring(10)
    assert ring.alloc(4) == 0 and ring.alloc(4) == 4
    assert ring.alloc(4) is None  # 12 bytes do not fit in 10
    ring.release(4)
    assert ring.alloc(4) is None  # the oldest piece still holds its bytes
    ring.release(0)
    assert ring.alloc(4) == 10  # no room before the end: wraps to the start (10 % 10)
    assert ring.alloc(6) == 14 and ring.alloc(1) is None
    ring.release(10)
    ring.release(14)
    assert ring.alloc(10) == 20


def test_state_holds_the_payload_and_a_full_snapshot_serves_it():
    jobs = file_jobs(PLAN, [1], "ck", 3, 0)
    gen = PayloadGenerator("random", 0)
    state = HostState(jobs)
    state.allocate_staging(state.nbytes)
    digests = state.load(jobs, gen)
    snap = FullSnapshot(state)
    snap.take()
    assert state.copy_bandwidth(state.nbytes) > 0
    for job in jobs:
        want = np.zeros(job.size + 13, dtype=np.uint8)
        gen.fill(job.base, job.regions, 0, want[:(job.size + 7) // 8 * 8])
        want[job.size:] = 0
        got = np.full(job.size + 13, 7, dtype=np.uint8)
        snap.fill(job, 0, got)  # past the job's end: zeros
        assert np.array_equal(got, want)
        hasher = ChunkHasher(job.regions)
        hasher.update(0, want[:job.size])
        assert digests[job.index] == hasher.digests()


def test_schedule_and_calibration():
    assert schedule(0.001, 0.05) == Schedule(0.001, 25, 2, 0.05)
    assert schedule(0.1, 0.01).units == 1 and schedule(0.1, 0.01).layers == 1
    long = schedule(0.002, 10.0)  # a collective every 25 ms
    assert long.units * long.unit_s == pytest.approx(0.025, abs=0.002)
    assert long.nominal_s == pytest.approx(10.0, rel=0.01)
    assert 0 < unit_seconds(MemoryKernel(1 << 16), budget_s=0.02) < 1


def test_steps_are_placed_before_during_and_after_each_persist():
    # Steps of 1 s starting every second; checkpoint 1 blocks 2.0-2.5 s, durable at
    # 5.2 s; checkpoint 2 is due at 7.0 s, blocks till 7.1 s, durable at 8.0 s.
    starts = [int(t * 1e9) for t in (0, 1, 2.5, 3.5, 4.5, 5.5, 6, 7.1)]
    seconds = [1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 0.5]
    out = classify_steps(starts, seconds, [(2 * 10**9, int(2.5e9), int(5.2e9)),
                                           (7 * 10**9, int(7.1e9), 8 * 10**9)])
    assert out[0]["before"] == {"count": 2, "mean_s": 1.0}
    assert out[0]["during"] == {"count": 3, "mean_s": 1.0}  # midpoints 3, 4, 5
    assert out[0]["after"] == {"count": 2, "mean_s": 0.75}  # 5.75, 6.5
    assert out[1]["before"] == out[0]["after"]
    assert out[1]["during"] == {"count": 1, "mean_s": 0.5}
    assert out[1]["after"]["count"] == 0


def test_one_block_of_staging_with_many_threads_and_files_completes(tmp_path):
    """The smallest staging there is (one block) with 3 writer threads per rank over
    many small files: pieces are staged in the order the threads read them, so nothing
    waits forever, and every byte restores."""
    workload = tmp_path / "per-chunk.toml"
    workload.write_text(TINY.read_text() + '\n[checkpoint]\nfiles = "per-chunk"\n')
    r, _ = local(str(workload), "--target", str(tmp_path / "t"), "--results",
                 str(tmp_path / "r.jsonl"), "--mode", "async", "--step-seconds", "0.01",
                 "--steps-per-checkpoint", "1", "--iterations", "2", "--threads", "3",
                 "--block-size", "64KiB", "--staging-memory", "64KiB", timeout=300)
    assert r.returncode == 0, r.stderr
    recs = records(tmp_path / "r.jsonl")
    assert {x["snapshot"] for x in recs if x["type"] == "loop"} == {"piecewise"}
    restores = [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]
    assert len(restores) == 2 and all(x["verified"] for x in restores)


def test_a_torn_snapshot_fails_the_checkpoint(tmp_path, monkeypatch):
    """A byte of staging changed after the copy: the persisted digests no longer match
    the state the loop held, so the checkpoint is not committed."""
    take = FullSnapshot.take

    def torn(self: FullSnapshot) -> None:
        take(self)
        self.state.staging[100] ^= 0xFF

    monkeypatch.setattr(staging.FullSnapshot, "take", torn)
    sink = JsonlSink(tmp_path / "r.jsonl")
    sink.open()
    backend = LocalBackend(str(tmp_path / "t"))
    backend.prepare()
    options = RunOptions(iterations=2, mode="async", run_id="run-t",
                         loop=LoopOptions(step_seconds=0.01, steps_per_checkpoint=1))
    with pytest.raises(RunFailed, match=r"checkpoint 1: .*the persisted snapshot differs "
                                        r"from the training state"):
        run_iterations(PLAN, [0, 1, 2, 3], [0, 1, 2, 3], backend, SingleComm(), options, sink)
    sink.close()
    assert not list((tmp_path / "t").rglob(".metadata"))
