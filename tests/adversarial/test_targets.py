"""Where a run writes: `./results` being a file is named as what it is, and two runs
creating the same new nested target at once both get it (issue 16, item 6).

This suite (tests/adversarial) keeps the abuse cases of issue 16 so that later features
inherit them: a new backend's prepare() should survive the same race.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT, WORKLOADS, assert_refused, ckptbench


def test_results_path_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "results").write_text("a file, not a directory")
    result = ckptbench("run", str(WORKLOADS / "tiny.toml"), "--target", "tgt", cwd=tmp_path,
                       timeout=300)
    line = assert_refused(result, "results", "not a directory")
    assert "results file exists" not in line
    assert (tmp_path / "results").read_text() == "a file, not a directory"
    assert not (tmp_path / "tgt").exists()


def _prepare(target: str, barrier: multiprocessing.synchronize.Barrier,
             queue: multiprocessing.Queue) -> None:
    """One run's prepare() of `target`, released together with the other's."""
    from ckptbench.backends.local import LocalBackend, LocalOptions

    backend = LocalBackend(target, LocalOptions(io="buffered"))
    barrier.wait()
    try:
        backend.prepare()
        queue.put("ok")
    except Exception as exc:
        queue.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.parametrize("attempt", range(20))
def test_two_runs_creating_one_new_nested_target(tmp_path: Path, attempt: int) -> None:
    """Two processes released together into prepare() of the same new a/b/c: both
    succeed (the old code said "already exists" to the loser, about 1 in 5)."""
    target = str(tmp_path / "a" / "b" / f"c{attempt}")
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_prepare, args=(target, barrier, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    outcomes = [queue.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert outcomes == ["ok", "ok"]
    assert sorted(p.name for p in Path(target).iterdir()) == [".ckptbench-target"]


def test_two_cli_runs_on_one_new_nested_target(tmp_path: Path) -> None:
    """The issue's reproduction, end to end: two `ckptbench run`s on the same new nested
    target, started together; both finish."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    target = tmp_path / "x" / "y" / "tgt"
    procs = [subprocess.Popen([sys.executable, "-m", "ckptbench", "run", str(WORKLOADS / "tiny.toml"),
                               "--target", str(target), "--results", str(tmp_path / f"r{i}.jsonl")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err


def test_a_results_file_on_a_full_file_system_is_one_line(tmp_path: Path) -> None:
    """Results on a file system that fills up mid-run: one line naming the results file,
    exit 2, the run stopped and its checkpoints removed (no traceback, no wrong message)."""
    import subprocess
    import sys

    from .runs import TINY, env, one_line

    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(small)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        r = subprocess.run([sys.executable, "-m", "ckptbench", "run", str(TINY), "--target",
                            str(tmp_path / "t"), "--results", str(small / "r.jsonl")],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env())
        one_line(r, 2, f"{small / 'r.jsonl'}: cannot write results (No space left on device)")
        assert not (tmp_path / "t").exists()
    finally:
        subprocess.run(["umount", str(small)], check=False)
