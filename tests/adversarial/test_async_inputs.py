"""--mode async's input (issue 18): every bad value of --mode, --step-seconds,
--steps-per-checkpoint and --staging-memory is one line naming the flag, exit 2, before
anything is created; the training state and its staging memory are counted against the
host's memory before the run starts (staging never more than the state).

Real CLI processes on real local targets; the memory bound also through the library's
own check with a stated amount of available memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptbench.backends.local import LocalBackend, LocalOptions
from ckptbench.formats.base import file_jobs
from ckptbench.plan import build_plan
from ckptbench.runner.async_mode import KERNEL_BYTES, loop_memory_bytes
from ckptbench.runner.options import LoopOptions, RunOptions, RunRequest
from ckptbench.runner.resources import loop_needs, resource_error
from ckptbench.runner.session import Topology
from ckptbench.runner.staging import state_bytes
from ckptbench.spec import load_workload

from .helpers import WORKLOADS
from .runs import TINY, ckptbench, one_line, refused_before_start

ASYNC = ("--mode", "async")


@pytest.mark.parametrize("args, needles", [
    (["--mode", "later"], ["--mode", "'later' is not one of 'sync', 'async'"]),
    (["--mode", ""], ["--mode"]),
    ([*ASYNC, "--step-seconds", "0"], ["--step-seconds 0.0 must be > 0"]),
    ([*ASYNC, "--step-seconds", "-1"], ["--step-seconds -1.0 must be > 0"]),
    ([*ASYNC, "--step-seconds", "nan"], ["--step-seconds nan must be > 0"]),
    ([*ASYNC, "--step-seconds", "inf"], ["--step-seconds inf must be > 0"]),
    ([*ASYNC, "--step-seconds", "1e9"], ["--step-seconds 1000000000.0", "at most 3600"]),
    ([*ASYNC, "--step-seconds", "soon"], ["--step-seconds", "'soon' is not a valid float"]),
    ([*ASYNC, "--steps-per-checkpoint", "0"], ["--steps-per-checkpoint", "0 is not in the range"]),
    ([*ASYNC, "--steps-per-checkpoint", "-3"], ["--steps-per-checkpoint", "not in the range"]),
    ([*ASYNC, "--steps-per-checkpoint", "1.5"], ["--steps-per-checkpoint", "not a valid integer"]),
    ([*ASYNC, "--staging-memory", "0"], ["--staging-memory must be > 0"]),
    ([*ASYNC, "--staging-memory", "-1GiB"], ["--staging-memory must be > 0"]),
    ([*ASYNC, "--staging-memory", "lots"], ["--staging-memory 'lots' is not a size"]),
    ([*ASYNC, "--staging-memory", "1e400"], ["--staging-memory '1e400'", "inf is not allowed"]),
    ([*ASYNC, "--staging-memory", "1KiB"],
     ["--staging-memory 1024 B holds no block of --block-size", "allowed"]),
    # loop flags change nothing in a sync run: refused rather than ignored
    (["--step-seconds", "2"], ["--step-seconds needs --mode async"]),
    (["--steps-per-checkpoint", "4"], ["--steps-per-checkpoint needs --mode async"]),
    (["--staging-memory", "1GiB"], ["--staging-memory needs --mode async"]),
    ([*ASYNC, "--format", "zarr"], ["--mode async persists with --format raw"]),
])
def test_refused_before_the_run_starts(tmp_path: Path, args: list[str], needles: list[str]
                                       ) -> None:
    refused_before_start(tmp_path, args, needles)


def test_a_state_that_does_not_fit_the_host_is_refused_naming_staging_memory(tmp_path: Path
                                                                              ) -> None:
    """Llama 3.1 405B on 8 ranks of one host: 4.9 TB of state (host memory without a
    GPU), more than a host has; refused before the target is made, whatever
    --staging-memory asks (the state alone does not fit)."""
    text = (WORKLOADS / "llama3-8b-fsdp2-8.toml").read_text()
    workload = tmp_path / "big.toml"
    workload.write_text(text.replace('name = "llama3-8b-fsdp2-8"', 'name = "big"')
                        .replace('name = "llama3-8b"', 'name = "llama3.1-405b"'))
    results = tmp_path / "r.jsonl"
    for staging in ("state", "64MiB", "1PiB"):
        r = ckptbench("run", str(workload), "--target", str(tmp_path / "t"), "--results",
                      str(results), *ASYNC, "--staging-memory", staging, "--no-restore",
                      cwd=tmp_path, timeout=120)
        one_line(r, 2, "--mode async", "8 ranks on one host", "of training state",
                 "--staging-memory", "MemAvailable", "allowed: a smaller --staging-memory")
        assert not (tmp_path / "t").exists() and not results.exists()


def _request(tmp_path: Path, staging: int, mode: str = "async") -> RunRequest:
    plan = build_plan(load_workload(TINY))
    return RunRequest(workload=plan.workload, plan=plan, ranks=list(range(plan.world_size)),
                      backend=LocalBackend(str(tmp_path / "t"), LocalOptions()),
                      options=RunOptions(mode=mode, loop=LoopOptions(staging_bytes=staging)))


def test_staging_is_bounded_by_the_state_and_counted_per_host(tmp_path: Path) -> None:
    plan = build_plan(load_workload(TINY))
    state = state_bytes(file_jobs(plan, [0], "x", 1, 0))
    huge = _request(tmp_path, 1 << 50)  # 1 PiB asked: at most the state is allocated
    assert loop_memory_bytes(plan, [0], huge.options) == (state + KERNEL_BYTES, state)
    assert loop_memory_bytes(plan, [0], _request(tmp_path, 1 << 20).options)[1] == 1 << 20
    assert loop_memory_bytes(plan, [0], _request(tmp_path, 0, "sync").options) == (0, 0)
    topo = Topology("run-x", [[0, 1], [2, 3]], ["a", "a"], {})
    (need,) = loop_needs(huge, topo).values()
    assert need[1] == state_bytes(file_jobs(plan, [0, 1, 2, 3], "x", 1, 0))
    # the run fits a host with room for it, and is refused one line naming the option
    # on a host with less
    total = sum(need)
    assert resource_error(huge, topo, available=10 * total) is None
    error = resource_error(huge, topo, available=total // 2)
    assert error is not None and "--staging-memory" in str(error)
    assert "\n" not in str(error)
