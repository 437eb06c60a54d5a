"""The async summary's interference from step and checkpoint records (synthetic), and an
async run's table next to a sync run's (real runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ckptbench.report import load
from ckptbench.report.asynchronous import slowdown
from ckptbench.report.html import grid_html
from ckptbench.report.table import async_grid

S = 10**9


def _records(starts: list[float], seconds: list[float], windows: list[tuple[float, float]]
             ) -> list[dict]:
    recs: list[dict] = [{"type": "steps", "loop": "async", "process": 0,
                         "start_ns": [int(a * S) for a in starts], "seconds": seconds}]
    recs += [{"type": "checkpoint", "process": 0, "ok": True, "resume_ns": int(a * S),
              "durable_ns": int(b * S)} for a, b in windows]
    return recs


def test_steps_inside_a_persist_give_the_mean_step_over_the_baseline():
    # Baseline 1 s; a persist from 1 s to 4 s; the steps it overlaps take 1.5 s.
    recs = _records([0, 1.5, 3.0, 4.5], [1.5, 1.5, 1.5, 1.0], [(1.0, 4.0)])
    extra, window = slowdown(recs, 1.0)
    assert (extra, window) == pytest.approx((1.5, 3.0))
    assert extra / (window - extra) == pytest.approx(1.0)


def test_a_persist_shorter_than_a_step_still_measures():
    # A 3 s step (baseline 2 s) holds a 2 s persist: 1 s of work done in its 2 s,
    # steps twice as slow while it ran.
    extra, window = slowdown(_records([0, 3], [3.0, 2.0], [(0.5, 2.5)]), 2.0)
    assert extra / (window - extra) == pytest.approx(1.0)
    # No persist overlapped: nothing extra, no window.
    assert slowdown(_records([0, 3], [2.0, 2.0], []), 2.0) == (0.0, 0.0)


def test_an_async_run_reports_its_table_beside_a_sync_run(tmp_path):
    """Real runs of the tiny workload, async and sync, reported side by side in 80
    columns: the runs are told apart by their mode, the async table fits (in parts) and
    holds the async run only; the HTML page gets the same table."""
    root = Path(__file__).resolve().parents[2]
    tiny = str(root / "workloads" / "tiny.toml")
    paths = {m: tmp_path / f"{m}.jsonl" for m in ("async", "sync")}
    loop = ("--mode", "async", "--step-seconds", "0.02", "--steps-per-checkpoint", "2")
    for mode, extra in (("async", loop), ("sync", ())):
        r = subprocess.run([sys.executable, "-m", "ckptbench", "run", tiny, "--target",
                            str(tmp_path / mode), "--results", str(paths[mode]), *extra],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "ckptbench", "report", str(paths["async"]),
                        str(paths["sync"]), "--width", "80"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    assert "asynchronous checkpoints (1 of" in r.stdout and "interference" in r.stdout
    assert "mode" in r.stdout and "async" in r.stdout
    views = [load(str(paths["async"])), load(str(paths["sync"]))]
    grid = async_grid(views)
    assert grid is not None and [row[0] for row in grid.rows] == ["#1"]
    assert async_grid(views[1:]) is None
    assert "<caption>asynchronous checkpoints" in grid_html(grid)  # in parts that fit the page
