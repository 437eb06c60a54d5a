"""The async summary's interference from step and checkpoint records (synthetic)."""

from __future__ import annotations

import pytest

from ckptbench.report.asynchronous import slowdown

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
