"""MLPerf Storage v2.0 side by side: both views from the same records, and the rules."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptbench.mlperf import GIB, RunFacts, compare, facts, rules
from ckptbench.report import iteration_stats

ROOT = Path(__file__).resolve().parent.parent
MS = 1_000_000


def op(it: int, phase: str, rank: int, name: str, a_ms: float, b_ms: float, nbytes: int = 0,
       thread: int = 0) -> dict[str, Any]:
    return {"type": "op", "iteration": it, "phase": phase, "rank": rank, "thread": thread,
            "op": name, "file": f"f{rank}", "bytes": nbytes, "start_ns": int(a_ms * MS),
            "end_ns": int(b_ms * MS)}


def as_run(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`ops` with the rank and phase records a run writes beside them: each rank's bytes
    and span, each (iteration, phase) ok (the throughput `run` prints reads those)."""
    out = list(ops)
    for key in sorted({(o["iteration"], o["phase"]) for o in ops}):
        mine = [o for o in ops if (o["iteration"], o["phase"]) == key]
        for rank in sorted({o["rank"] for o in mine if o["rank"] >= 0}):
            rank_ops = [o for o in mine if o["rank"] == rank and o["thread"] >= 0]
            out.append({"type": "rank", "iteration": key[0], "phase": key[1], "rank": rank,
                        "host": "h", "bytes": sum(o["bytes"] for o in rank_ops),
                        "start_ns": min(o["start_ns"] for o in rank_ops),
                        "end_ns": max(o["end_ns"] for o in rank_ops)})
        out.append({"type": "phase", "iteration": key[0], "phase": key[1], "ok": True})
    return out


def save_iteration(it: int, t0: float, slow_ms: float) -> list[dict[str, Any]]:
    """Rank 0: write 500 ms then fsync 300 ms; rank 1 ends at `slow_ms`; commit 10 ms."""
    return [
        op(it, "save", 0, "open", t0, t0 + 1),
        op(it, "save", 0, "write", t0 + 1, t0 + 501, GIB + 100),
        op(it, "save", 0, "fsync", t0 + 501, t0 + 801),
        op(it, "save", 1, "open", t0, t0 + 1),
        op(it, "save", 1, "write", t0 + 1, t0 + slow_ms - 100, GIB + 100),
        op(it, "save", 1, "fsync", t0 + slow_ms - 100, t0 + slow_ms),
        op(it, "save", 0, "commit", t0 + slow_ms, t0 + slow_ms + 10, thread=-1),
    ]


def test_both_views_from_synthetic_records() -> None:
    recs = as_run(save_iteration(1, 0, 1000) + save_iteration(2, 5000, 2000))
    c = compare(recs, "save", 2 * GIB)
    # MLPerf: rank 0's span (801 ms) less its fsync (300 ms), tensor bytes, GiB/s
    assert c.mlperf.seconds == pytest.approx([0.501, 0.501])
    assert c.mlperf.gibps == pytest.approx([2 / 0.501] * 2)
    assert c.mlperf_with_fsync.gibps == pytest.approx([2 / 0.801] * 2)
    # ckptbench: first call to the commit's end, bytes written (container bytes): the
    # throughput `ckptbench run` prints for each iteration, in GiB/s
    assert c.ckptbench.seconds == pytest.approx([1.010, 2.010])
    written = (2 * GIB + 200) / GIB
    assert c.ckptbench.gibps == pytest.approx([written / 1.010, written / 2.010])
    ours = [i["throughput_bytes_per_s"] / GIB for i in iteration_stats(recs)]
    assert c.ckptbench.gibps == pytest.approx(ours)
    assert c.ckptbench.mean == pytest.approx(statistics.fmean(c.ckptbench.gibps))
    # DLIO reports np.std: the population standard deviation (ddof 0)
    assert c.ckptbench.stdev == pytest.approx(statistics.pstdev(c.ckptbench.gibps))
    assert c.ckptbench.stdev == pytest.approx(abs(c.ckptbench.gibps[0] - c.ckptbench.gibps[1]) / 2)
    assert c.mlperf.stdev == pytest.approx(0.0)
    assert c.ratio == pytest.approx(c.mlperf.mean / c.ckptbench.mean)
    assert c.container_bytes - c.tensor_bytes == 200


def test_restore_view_counts_the_manifest_in_ckptbench_only() -> None:
    recs = as_run([
        {"type": "op", "iteration": 1, "phase": "restore", "rank": -1, "process": 0, "thread": -1,
         "op": "manifest", "file": ".metadata", "bytes": 0, "start_ns": 0, "end_ns": 50 * MS},
        op(1, "restore", 0, "read", 50, 550, GIB),
        op(1, "restore", 1, "read", 50, 1050, GIB),
    ])
    c = compare(recs, "restore", 2 * GIB)
    assert c.mlperf.seconds == pytest.approx([0.5]) and c.mlperf.gibps == pytest.approx([4.0])
    assert c.ckptbench.seconds == pytest.approx([1.05])
    assert c.ratio == pytest.approx(4.0 / (2 / 1.05))


def test_rank_0_is_the_first_rank_that_ran() -> None:
    """--ranks 2-3: DLIO's rank 0 is the first process, plan rank 2 here."""
    recs = as_run([op(1, "restore", 2, "read", 0, 400, GIB),
                   op(1, "restore", 3, "read", 0, 800, GIB)])
    c = compare(recs, "restore", 2 * GIB)
    assert c.mlperf.seconds == pytest.approx([0.4]) and c.ckptbench.seconds == pytest.approx([0.8])


def _facts(**kw: Any) -> RunFacts:
    base: dict[str, Any] = dict(
        workload="mlperf-llama3-405b", world_size=512, ranks=8, scale=1, iterations=10,
        hosts=1, host_memory_bytes=64 * GIB, bytes_per_host=400 * GIB, files_written=10,
        files_fsynced=10, cache="none", verified=True, sequence="writes-then-reads",
        writes_first=True)
    base.update(kw)
    return RunFacts(**base)


def test_rules_one_line_each_with_its_name() -> None:
    ok = {r.name: r.ok for r in rules(_facts())}
    assert ok == {"closed.model": True, "closed.full_size": True, "closed.process_count": True,
                  "closed.num_checkpoints": True, "closed.sequence": True, "closed.fsync": True,
                  "closed.page_cache": True, "closed.runs": False, "closed.verification": True}
    bad = {r.name: r for r in rules(_facts(ranks=16, scale=8, iterations=3, files_fsynced=0,
                                           bytes_per_host=100 * GIB, sequence="interleaved"))}
    for name in ("closed.full_size", "closed.process_count", "closed.num_checkpoints",
                 "closed.sequence", "closed.fsync", "closed.page_cache"):
        assert not bad[name].ok and bad[name].line().startswith(f"FAIL {name}: ")
    # a client writing under 3x its memory passes only when the caches were cleared
    assert {r.name: r.ok for r in rules(_facts(bytes_per_host=100 * GIB,
                                               cache="fadvise+drop_caches"))}["closed.page_cache"]


def test_sequence_rule_needs_the_option_and_the_order_in_the_records() -> None:
    rule = {r.name: r for r in rules(_facts(writes_first=False))}["closed.sequence"]
    assert rule.line() == ("FAIL closed.sequence: writes-then-reads asked for, but the records "
                           "show a restore before a save ended")
    rule = {r.name: r for r in rules(_facts(sequence="interleaved"))}["closed.sequence"]
    assert rule.line().startswith("FAIL closed.sequence: --sequence interleaved: ")
    rule = {r.name: r for r in rules(_facts())}["closed.sequence"]
    assert rule.line() == ("PASS closed.sequence: all 10 checkpoints written, then read in the "
                           "order written")


def test_facts_from_records() -> None:
    recs = [{"type": "run", "environment": {"memory_bytes": 8 * GIB}},
            {"type": "rank", "host": "a"},
            op(1, "save", 0, "open", 0, 1), op(1, "save", 0, "fsync", 1, 2),
            op(1, "save", 1, "open", 0, 1),
            {"type": "phase", "phase": "restore", "iteration": 1, "ok": True, "verified": True,
             "cache": "fadvise+drop_caches"}]
    f = facts(recs, workload="mlperf-llama3-8b", world_size=8, ranks=2, scale=8, iterations=1,
              bytes_per_checkpoint=GIB)
    assert (f.files_written, f.files_fsynced, f.host_memory_bytes, f.verified) == (2, 1, 8 * GIB, True)
    assert f.cache == "fadvise+drop_caches"
    assert (f.sequence, f.writes_first) == ("interleaved", False)  # no restore op: no order
    run = {"type": "run", "options": {"sequence": "writes-then-reads"}}
    wtr = [run, *recs[1:], op(1, "restore", 0, "read", 3, 4, 8), op(2, "save", 0, "open", 1, 2)]
    assert facts(wtr, workload="w", world_size=8, ranks=2, scale=1, iterations=2,
                 bytes_per_checkpoint=GIB).writes_first
    late = [*wtr, op(3, "save", 0, "open", 3.5, 5)]  # a save still running after a read began
    f = facts(late, workload="w", world_size=8, ranks=2, scale=1, iterations=2,
              bytes_per_checkpoint=GIB)
    assert (f.sequence, f.writes_first) == ("writes-then-reads", False)


def test_mlperf_command_reports_both_ways(tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    r = subprocess.run([sys.executable, "-m", "ckptbench", "mlperf",
                        str(ROOT / "workloads" / "mlperf-llama3-8b.toml"), "--scale", "32",
                        "--ranks", "0-1", "--iterations", "2", "--target", str(tmp_path / "t"),
                        "--results", str(results), "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    save, restore = out["phases"]
    for p in (save, restore):
        assert len(p["mlperf"]["gibps"]) == 2 and len(p["ckptbench"]["gibps"]) == 2
        assert p["ratio"] == pytest.approx(p["mlperf"]["gibps_mean"] / p["ckptbench"]["gibps_mean"])
        assert p["container_bytes"] > p["tensor_bytes"]
    # rank 0's clock without fsync can only be shorter than the whole phase with it
    assert all(a <= b for a, b in zip(save["mlperf"]["seconds"], save["ckptbench"]["seconds"],
                                      strict=True))
    names = [line.split(":")[0] for line in out["rules"]]
    assert "FAIL closed.full_size" in names and "PASS closed.fsync" in names
    assert "FAIL closed.num_checkpoints" in names
    # v2.0's order by default: both checkpoints written, then both read, in that order
    assert out["sequence"] == "writes-then-reads" and "PASS closed.sequence" in names
    records = [json.loads(line) for line in results.read_text().splitlines()]
    phases = [(r["phase"], r["iteration"]) for r in records if r["type"] == "phase"]
    assert phases == [("save", 1), ("save", 2), ("restore", 1), ("restore", 2)]
    assert all(r["verified"] for r in records if r["type"] == "phase" and r["phase"] == "restore")


def test_mlperf_command_interleaved_fails_the_sequence_rule(tmp_path: Path) -> None:
    r = _mlperf(tmp_path, "--sequence", "interleaved")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rule = next(line for line in out["rules"] if "closed.sequence" in line)
    assert rule.startswith("FAIL closed.sequence: --sequence interleaved: ")


def _mlperf(tmp_path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", "mlperf",
                           str(ROOT / "workloads" / "mlperf-llama3-8b.toml"), "--scale", "32",
                           "--ranks", "0-1", "--iterations", "2", "--target", str(tmp_path / "t"),
                           "--results", str(tmp_path / "r.jsonl"), "--json", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(("args", "names"), [
    (["--sequence", "reads-then-writes"], "--sequence"),
    (["--iterations", "0"], "--iterations"),
    (["--scale", "1", "--iterations", "100000"], "--iterations 100000 x "),
])
def test_mlperf_command_bad_input_is_one_line(tmp_path: Path, args: list[str], names: str) -> None:
    """Refused before anything is written: no target, no results file."""
    r = _mlperf(tmp_path, *args, timeout=120)
    assert r.returncode == 2 and names in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and r.stdout == ""
    assert not (tmp_path / "t").exists() and not (tmp_path / "r.jsonl").exists()


def test_mlperf_command_refuses_other_layouts(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ckptbench", "mlperf",
                        str(ROOT / "workloads" / "tiny.toml"), "--target", str(tmp_path / "t")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "megatron-deepspeed" in r.stderr
    assert r.stderr.strip().count("\n") == 0
