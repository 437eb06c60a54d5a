"""What the figures compute (binned throughput, the slowest rank, the timeline's marks)
and how compared runs are labelled, on hand-made records and on real runs."""

from __future__ import annotations

import numpy as np
import pytest

from ckptbench.report import compare, summarize, view
from ckptbench.report.data import RunData, load_runs, op_table
from ckptbench.report.figures import bytes_per_bin, rank_throughput, timeline
from ckptbench.report.table import summary_grid
from tests.report.conftest import Runs

S = 1_000_000_000


def stalled_run() -> list[dict]:
    """4 ranks save 1 GB each in 1 s, except rank 2, which stalls 4 s between its writes."""
    recs: list[dict] = [{"type": "run", "workload": {"name": "t"}, "options": {}}]
    for r in range(4):
        end = 5 * S if r == 2 else S
        recs += [
            {"type": "op", "iteration": 1, "phase": "save", "rank": r, "thread": 0, "op": "write",
             "file": f"{r}", "bytes": S // 2, "start_ns": 0, "end_ns": S // 2},
            {"type": "op", "iteration": 1, "phase": "save", "rank": r, "thread": 0, "op": "write",
             "file": f"{r}", "bytes": S // 2, "start_ns": end - S // 2, "end_ns": end},
            {"type": "rank", "iteration": 1, "phase": "save", "rank": r, "host": "h",
             "bytes": S, "start_ns": 0, "end_ns": end},
        ]
    recs.append({"type": "phase", "iteration": 1, "phase": "save", "ok": True})
    return recs


def test_bytes_per_bin_spreads_each_call_over_its_duration_exactly() -> None:
    start, end = np.array([0.0, 0.5]), np.array([1.0, 1.5])
    got = bytes_per_bin(start, end, np.array([100.0, 200.0]), np.array([0.0, 0.5, 1.0, 1.5, 2.0]))
    assert got == pytest.approx([50.0, 150.0, 100.0, 0.0])
    rng = np.random.default_rng(1)
    s = rng.uniform(0, 10, 500)
    e = s + rng.uniform(0, 2, 500)
    n = rng.integers(1, 1000, 500).astype(float)
    assert bytes_per_bin(s, e, n, np.linspace(0, 13, 77)).sum() == pytest.approx(n.sum())


def test_the_stalled_rank_is_marked_slowest_and_its_end_drawn_in_red() -> None:
    recs = stalled_run()
    run = RunData("x.jsonl", "t", view(recs, "x.jsonl"), op_table(recs),
                  tuple(r for r in recs if r["type"] == "rank"))
    _fig, slowest = rank_throughput(run)
    assert slowest == {"save": 2}
    (s,) = summarize(recs)
    assert s["slowest_rank"] == 2 and s["slowest_rank_seconds_max"] == pytest.approx(5.0)
    ax = timeline(run).axes[0]
    red = [c for c in ax.collections if c.get_offsets().shape[0] == 1
           and tuple(c.get_edgecolor()[0][:3]) == (1.0, 0.0, 0.0)]
    assert [tuple(c.get_offsets()[0]) for c in red] == [(5.0, 2.0)]  # x: 5 s, lane of rank 2
    assert ax.get_xlim()[1] >= 5.0


def test_compared_runs_are_labelled_by_the_options_that_differ(three_runs: Runs) -> None:
    runs = load_runs([str(p) for p in three_runs.paths])
    # zarr records its inner chunks per shard in the codec text: a difference too
    assert [r.label for r in runs] == ["buffered, raw, no codec", "O_DIRECT, raw, no codec",
                                       "buffered, zarr, codec none:inner_chunks=1"]
    records = [r.view["run"] for r in runs]
    assert compare.differing(records) == ["io", "format", "codec"]
    assert compare.common(records)["workload"] == "tiny"
    grid = summary_grid([r.view for r in runs])
    names = [c.name for c in grid.columns]
    assert names[:5] == ["run", "io", "format", "codec", "phase"]
    assert [row[1] for row in grid.rows] == ["buffered", "buffered", "direct", "direct",
                                             "buffered", "buffered"]
    assert len(runs[0].ops) > 0 and set(runs[0].ops.names) >= {"write", "read", "commit"}


def test_one_run_is_labelled_by_its_workload_and_identical_runs_by_number() -> None:
    run = {"workload": {"name": "tiny"}, "options": {"format": "raw"}}
    assert compare.labels([run]) == ["tiny"]
    assert compare.labels([run, run]) == ["#1 tiny", "#2 tiny"]
    other = {**run, "options": {"format": "zarr", "codec": "zstd:level=3,inner_chunks=1"}}
    assert compare.labels([run, other]) == ["raw, no codec",
                                            "zarr, codec zstd:level=3, inner_chunks=1"]
