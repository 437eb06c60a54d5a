"""Hangs and unbounded resources (issue 16, item 5, and item 6's --io direct case).

What a run will need is checked before anything is created, and refused with one line
naming the option; a rank whose storage stops answering fails the run in bounded time.
Real CLI processes on real local targets (the hang: sabotage_run.py's never-returning
write, on a real file).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ckptbench.backends.local import LocalBackend, LocalOptions
from ckptbench.plan import build_plan
from ckptbench.runner.options import RunOptions, RunRequest
from ckptbench.runner.session import Topology
from ckptbench.spec import load_workload

from .runs import (
    SABOTAGE,
    TINY,
    env,
    one_line,
    records,
    refused_before_start,
    sabotaged,
)

GiB = 1 << 30


@pytest.mark.parametrize("args, needles", [
    # 7.4 GB and the OOM killer for a 22 MiB checkpoint, before
    (["--threads", "1000"], ["--threads 1000", "allowed: 1 to 256"]),
    # minutes of one-byte writes, before
    (["--block-size", "1B"], ["--block-size 1B", "allowed: 4KiB to 1GiB"]),
    (["--block-size", "2GiB"], ["--block-size 2GiB", "allowed: 4KiB to 1GiB"]),
    # 4096-byte calls recorded as 1000, before
    (["--io", "direct", "--block-size", "1000"],
     ["--block-size 1000", "not a multiple of 4096 bytes", "--io direct"]),
    (["--io", "direct", "--block-size", "1MB"], ["--block-size 1000000", "multiple of 4096"]),
    (["--block-size", "4100"], ["--block-size 4100", "not a multiple of 8 bytes"]),
    (["--prefill", "64TiB"], ["--prefill 64TiB", "MemAvailable", "4 ranks on one host"]),
    (["--threads", "256", "--block-size", "1GiB"],
     ["--threads 256 x --block-size 1GiB", "MemAvailable", "allowed: fewer --threads"]),
    (["--stall-timeout", "soon"], ["--stall-timeout 'soon'"]),
    (["--stall-timeout", "-5"], ["--stall-timeout must be > 0"]),
])
def test_refused_before_the_run_starts(tmp_path: Path, args: list[str], needles: list[str]
                                       ) -> None:
    refused_before_start(tmp_path, args, needles)


def _request(tmp_path: Path, **options: object) -> RunRequest:
    plan = build_plan(load_workload(TINY))
    return RunRequest(workload=plan.workload, plan=plan, ranks=list(range(plan.world_size)),
                      backend=LocalBackend(str(tmp_path / "t"), LocalOptions()),
                      options=RunOptions(**options))  # type: ignore[arg-type]


def _topology(groups: list[list[int]], hosts: list[str]) -> Topology:
    return Topology("run-x", groups, hosts, {})


def test_memory_is_counted_per_host(tmp_path: Path) -> None:
    """Threads x blocks x ranks on the busiest host, against that host's memory: two MPI
    processes of two plan ranks each need twice what one does, and on two hosts each
    host needs only its own (and process 0's host the coordinator's manifest buffer)."""
    from ckptbench.formats.manifest import manifest_bytes
    from ckptbench.runner.resources import host_needs, resource_error

    req = _request(tmp_path, threads=8, block_size=64 << 20)
    one_host = host_needs(req, _topology([[0, 1], [2, 3]], ["a", "a"]))
    two_hosts = host_needs(req, _topology([[0, 1], [2, 3]], ["a", "b"]))
    coordinator = manifest_bytes(req.plan, req.options.format)  # process 0's manifest buffer
    assert coordinator > 0
    assert one_host["a"][0] - coordinator == 2 * (two_hosts["a"][0] - coordinator) \
        == 2 * two_hosts["b"][0]
    assert one_host["a"][1:] == (32, 4) and two_hosts["b"][1:] == (16, 2)
    need = one_host["a"][0]
    assert need >= 32 * 2 * (64 << 20)  # at least two blocks per I/O thread
    assert resource_error(req, _topology([[0, 1], [2, 3]], ["a", "a"]), available=2 * need) is None
    refused = resource_error(req, _topology([[0, 1], [2, 3]], ["a", "a"]), available=need)
    assert refused is not None and "--threads 8 x --block-size 64MiB" in str(refused)
    assert resource_error(req, _topology([[0, 1], [2, 3]], ["a", "b"]), available=need) is None


def test_an_s3_backends_transfer_buffers_are_counted(tmp_path: Path) -> None:
    """The S3 backend's upload parts and read-ahead ranges are part of the memory bound:
    each process on a host adds them, and a refusal says how much they are."""
    from ckptbench.backends.s3 import S3Backend, S3Options
    from ckptbench.runner.resources import host_needs, resource_error

    local = _request(tmp_path)
    backend = S3Backend("s3://bucket/t", S3Options(concurrency=8))
    req = RunRequest(workload=local.workload, plan=local.plan, ranks=local.ranks,
                     backend=backend, options=local.options)
    topo = _topology([[0, 1], [2, 3]], ["a", "a"])
    extra = backend.buffer_bytes()
    assert extra >= 9 * 2 * (64 << 20)  # a part and a range per request in flight, and one more
    assert host_needs(req, topo)["a"][0] == host_needs(local, topo)["a"][0] + 2 * extra
    refused = resource_error(req, topo, available=host_needs(local, topo)["a"][0] * 2)
    assert refused is not None and "of them the s3 backend's transfer buffers" in str(refused)
    assert "\n" not in str(refused)


def test_threads_on_one_host_are_capped(tmp_path: Path) -> None:
    from ckptbench.runner.resources import resource_error

    req = _request(tmp_path, threads=256, block_size=4096, prefill_bytes=4096)
    many = _topology([[r] for r in range(4)] * 5, ["a"] * 20)  # 20 processes on one host
    refused = resource_error(req, many, available=1 << 50)
    assert refused is not None and "--threads 256 x 20 ranks on one host" in str(refused)


def test_a_rank_whose_storage_stops_answering_fails_the_run(tmp_path: Path) -> None:
    """Rank 1's writes never return after its first block (a mount that stopped
    answering): the run fails within --stall-timeout plus the launcher's grace, with one
    line naming the rank, and removes what it wrote."""
    results = tmp_path / "r.jsonl"
    start = time.monotonic()
    r = sabotaged("hang:__1_", str(TINY), "--target", str(tmp_path / "t"), "--block-size",
                  "1MiB", "--stall-timeout", "2s", "--results", str(results), cwd=tmp_path,
                  timeout=120)
    elapsed = time.monotonic() - start
    one_line(r, 1, "rank 1 stalled: no byte moved for 2 s during the save of checkpoint-1",
             "--stall-timeout")
    assert elapsed < 60, elapsed
    assert not (tmp_path / "t").exists()
    assert not any(p["ok"] for p in records(results) if p["type"] == "phase")


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None,
                    reason="needs mpirun and mpi4py")
def test_a_stalled_mpi_rank_ends_the_job(tmp_path: Path) -> None:
    """Under MPI each process watches itself: MPI rank 0 (plan ranks 0-1) stalls on rank
    1's file, says so and exits, and mpirun ends the job."""
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "-x", "PYTHONPATH", sys.executable,
           str(SABOTAGE), "hang:__1_", "--", str(TINY), "--target", str(tmp_path / "t"),
           "--block-size", "1MiB", "--stall-timeout", "2s", "--results",
           str(tmp_path / "r.jsonl")]
    mpi_env = {**env(), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=mpi_env, start_new_session=True)
    try:
        _out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the MPI job was still running 120 s after a rank stalled")
    assert proc.returncode != 0
    assert time.monotonic() - start < 60
    assert "ckptbench: error: MPI rank 0 on " in err and (
        "stalled: no byte moved for 2 s during the save of checkpoint-1") in err, err[-3000:]
    assert "Traceback" not in err


def test_only_a_process_with_bytes_to_move_can_stall() -> None:
    """The watch fires when armed and idle; bytes moving, waiting for peers (a process
    that finished its share waits for the slowest one) or being disarmed never fire it."""
    from ckptbench.runner.stall import StallWatch, WatchedGroup

    class Slow:
        rank, size = 0, 2

        def barrier(self) -> None:
            time.sleep(3.0)

    def run(body: object, timeout: float = 0.3) -> list[str]:
        fired: list[str] = []
        watch = StallWatch(timeout, fired.append, "rank 7")
        with watch.watching("the save of checkpoint-2"):
            body(watch)  # type: ignore[operator]
        time.sleep(0.5)  # disarmed: nothing fires after
        return fired

    def ticking(watch: StallWatch) -> None:  # 3 s of ticks, a gap of 1.5 s never
        for _ in range(60):
            time.sleep(0.05)
            watch.tick(4096)

    def stalled(watch: StallWatch) -> None:  # no byte moves until the stall is reported
        deadline = time.monotonic() + 60  # however slowly its thread is scheduled
        while not watch.fired and time.monotonic() < deadline:
            time.sleep(0.05)

    def busy_thread() -> None:  # a thread of the run's code beside the watched one
        while not done.wait(0.01):
            pass

    done = threading.Event()
    for _ in range(5):
        threading.Thread(target=busy_thread, daemon=True).start()
    try:
        (fired,) = run(stalled)
    finally:
        done.set()
    assert fired.startswith(
        "rank 7 stalled: no byte moved for 0.3 s during the save of checkpoint-2 "
        "(--stall-timeout 0.3s); the storage stopped answering, or allow slower storage a "
        "larger --stall-timeout; its threads: MainThread in stalled (tests/adversarial/"
        "test_bounds.py:"), fired  # where the watched thread waited, named first
    assert run(ticking, 1.5) == []
    assert run(lambda watch: WatchedGroup(Slow(), watch).barrier(), 1.5) == []
    fired: list[str] = []
    StallWatch(0, fired.append)  # off
    time.sleep(0.2)
    assert fired == []
