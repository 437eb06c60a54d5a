"""Aggregation as the trusted benchmarks define it, on hand-made records."""

from __future__ import annotations

import json

import pytest

from ckptbench.errors import CkptbenchError
from ckptbench.records import SCHEMA, JsonlSink, read_records, redact
from ckptbench.report import iteration_stats, summarize

S = 1_000_000_000  # ns per second


def rank(it, phase, r, nbytes, start, end, host="h0"):
    return {"type": "rank", "iteration": it, "phase": phase, "rank": r, "host": host,
            "bytes": nbytes, "start_ns": start, "end_ns": end}


def op(it, phase, name, start, end, r=0, n=0):
    return {"type": "op", "iteration": it, "phase": phase, "op": name, "rank": r, "bytes": n,
            "start_ns": start, "end_ns": end}


def phase(it, name, ok=True, **kw):
    return {"type": "phase", "iteration": it, "phase": name, "ok": ok, **kw}


def test_aggregate_is_total_bytes_over_first_start_to_last_end_including_commit():
    recs = [
        rank(1, "save", 0, 4 * S, 0, 2 * S),
        rank(1, "save", 1, 4 * S, 1 * S, 4 * S, host="h1"),
        op(1, "save", "commit", 4 * S, 5 * S),
        op(1, "save", "write", 0, S // 2, n=S), op(1, "save", "write", 0, S, n=S),
        phase(1, "save", commit_ns=[4 * S, 5 * S]),
    ]
    (it,) = iteration_stats(recs)
    assert it["bytes"] == 8 * S
    assert it["seconds"] == pytest.approx(5.0)
    assert it["throughput_bytes_per_s"] == pytest.approx(8 * S / 5)
    assert it["rank_throughput_bytes_per_s"]["min"] == pytest.approx(4 * S / 3)
    assert it["rank_throughput_bytes_per_s"]["max"] == pytest.approx(2 * S)
    assert it["slowest_rank"] == 1
    assert it["first_to_last_gap_s"] == pytest.approx(2.0)
    assert it["nodes"] == 2 and it["commit_s"] == pytest.approx(1.0)
    assert it["latency"]["write"]["p50_s"] == pytest.approx(0.75)


def test_restore_starts_at_the_manifest_read_and_failed_iterations_are_left_out():
    recs = [
        op(1, "restore", "manifest", 0, S // 10),
        rank(1, "restore", 0, S, S // 10, S),
        phase(1, "restore", cache="direct"),
        rank(2, "restore", 0, S, 0, S // 2),
        phase(2, "restore", ok=False),
    ]
    its = iteration_stats(recs)
    assert len(its) == 1 and its[0]["seconds"] == pytest.approx(1.0)
    assert its[0]["cache"] == "direct"


def test_summary_is_the_median_over_iterations():
    recs = []
    for it, secs in enumerate([1.0, 2.0, 4.0], 1):
        recs += [rank(it, "save", 0, 2 * S, 0, int(secs * S)), phase(it, "save")]
    (s,) = summarize(recs)
    assert s["type"] == "summary" and s["phase"] == "save" and s["iterations"] == 3
    assert s["throughput_bytes_per_s"] == pytest.approx(1 * S)
    assert s["throughput_min"] == pytest.approx(0.5 * S)
    assert s["throughput_max"] == pytest.approx(2 * S)
    assert s["seconds"] == pytest.approx(2.0)


def test_secrets_are_redacted_and_results_never_overwritten(tmp_path):
    assert redact({"aws_secret_access_key": "x", "nested": [{"password": "p", "ok": 1}]}) == \
        {"aws_secret_access_key": "<redacted>", "nested": [{"password": "<redacted>", "ok": 1}]}
    path = tmp_path / "r.jsonl"
    w = JsonlSink(path)
    w.open()
    w.write({"type": "run", "schema": SCHEMA, "options": {"secret_key": "hunter2"}})
    w.close()
    assert "hunter2" not in path.read_text()
    assert next(read_records(path))["options"]["secret_key"] == "<redacted>"
    with pytest.raises(CkptbenchError, match="never overwritten"):
        JsonlSink(path).open()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"type": "run", "schema": "other/1"}) + "\n")
    with pytest.raises(CkptbenchError, match="not a ckptbench results file"):
        list(read_records(bad))
