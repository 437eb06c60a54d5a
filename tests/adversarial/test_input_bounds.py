"""Inputs that size memory or time are bounded before any work (issue 29, items 5 and
10): restore world sizes from every place they can be given, the training loop's steps,
and option values that were silently accepted (a duplicated layout key, a restore layout
with a plan that ignores it, a description that is not a string).

Each is one line naming the option or field and what is allowed, exit 2, within
seconds and under a memory limit far below what the unbounded input took (21.8 GB).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .helpers import WORKLOADS, assert_refused, ckptbench
from .runs import refused_before_start

TINY = WORKLOADS / "tiny.toml"
GiB = 1 << 30
BIG = "1000000000"
ALLOWED = "allowed: 1 to 1,048,576"


@pytest.mark.parametrize("args, needles", [
    (["--restore-world-size", BIG], ["--restore-world-size", f"world_size = {BIG} is too large",
                                     ALLOWED]),
    (["--restore-layout", f"world_size={BIG}"], ["--restore-layout",
                                                 f"world_size = {BIG} is too large", ALLOWED]),
    (["--restore-layout", f"tp=2,world_size={BIG}"], ["--restore-layout", ALLOWED]),
])
def test_a_restore_world_size_is_bounded_as_the_training_ones(args: list[str],
                                                              needles: list[str]) -> None:
    """`plan --restore` at a billion restore ranks took 21.8 GB until the OOM killer
    ended it; [parallel] world_size stops at 1,048,576, and so does every restore one."""
    start = time.monotonic()
    result = ckptbench("plan", str(TINY), "--restore", *args, memory_limit=2 * GiB)
    assert_refused(result, *needles)
    assert time.monotonic() - start < 30


def test_a_restore_table_world_size_is_bounded(tmp_path: Path, tiny_text: str) -> None:
    path = tmp_path / "w.toml"
    path.write_text(tiny_text + f"\n[restore]\nworld_size = {BIG}\n")
    result = ckptbench("plan", str(path), "--restore", memory_limit=2 * GiB)
    assert_refused(result, f"[restore] world_size = {BIG} is too large", ALLOWED)


@pytest.mark.parametrize("args, needles", [
    (["--restore-world-size", BIG], ["--restore-world-size", ALLOWED]),
    # a billion training steps: the loop would never end
    (["--mode", "async", "--steps-per-checkpoint", BIG],
     [f"--steps-per-checkpoint {BIG} x (--iterations 1 + 1)", "allowed: at most 1,000,000 "
      "steps and 24 h"]),
    (["--mode", "async", "--step-seconds", "60", "--steps-per-checkpoint", "1000",
      "--iterations", "2"], ["--steps-per-checkpoint 1000", "360,000 s at --step-seconds 60"]),
    (["--restore-layout", "tp=2,tp=4"], ["--restore-layout 'tp=2,tp=4': tp is given twice",
                                         "allowed: each key once"]),
    (["--restore-plan", "files", "--restore-world-size", "2"],
     ["--restore-world-size needs --restore-plan dcp", "allowed: drop --restore-world-size"]),
    (["--restore-plan", "files", "--restore-layout", "world_size=2"],
     ["--restore-layout needs --restore-plan dcp"]),
    (["--format", "zarr", "--restore-world-size", "2"],
     ["--restore-world-size needs --restore-plan dcp", "--format zarr reads back its own"]),
])
def test_a_run_is_refused_before_it_starts(tmp_path: Path, args: list[str],
                                           needles: list[str]) -> None:
    refused_before_start(tmp_path, args, needles)


def test_a_description_must_be_a_string(tmp_path: Path, tiny_text: str) -> None:
    path = tmp_path / "w.toml"
    path.write_text(tiny_text.replace('description = "Tiny', 'description = ["a", 1]\n# "'))
    result = ckptbench("plan", str(path))
    assert_refused(result, "[workload] description = ['a', 1] is not allowed",
                   "allowed: a string")


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of the tiny workload, kept with --keep."""
    tmp = tmp_path_factory.mktemp("kept")
    run = ckptbench("run", str(TINY), "--target", str(tmp / "t"), "--keep",
                    "--results", str(tmp / "r.jsonl"), timeout=300)
    assert run.rc == 0, run.err
    (ckpt,) = (tmp / "t").glob("run-*/checkpoint-1")
    return ckpt


@pytest.mark.parametrize("args, needles", [
    (["--restore-world-size", BIG], ["--restore-world-size", ALLOWED]),
    (["--restore-layout", f"world_size={BIG}"], ["--restore-layout", ALLOWED]),
    (["--restore-plan", "files", "--restore-world-size", "2"],
     ["--restore-world-size needs --restore-plan dcp"]),
    (["--restore-layout", "tp=1,tp=2"], ["tp is given twice"]),
])
def test_a_restore_of_a_kept_checkpoint_is_refused_before_it_starts(
        kept: Path, tmp_path: Path, args: list[str], needles: list[str]) -> None:
    results = tmp_path / "rr.jsonl"
    result = ckptbench("restore", str(kept), "--results", str(results), *args, cwd=tmp_path,
                       timeout=120, memory_limit=2 * GiB)
    assert_refused(result, *needles)
    assert not results.exists()
