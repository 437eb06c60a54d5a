"""Records -> answers: throughput as the trusted benchmarks define it, spread, stragglers.

Throughput (the one figure every command prints under that name, ``report.throughput``)
= total bytes / (latest end - earliest start) over all ranks; the save ends when the
manifest is committed (what a training job waits for) and the restore starts with
reading the manifest. The ranks' own span (``data_seconds``) leaves those out. Per
rank: bytes / its own span. Per op: p50/p99 latency. Over iterations: median, min, max
and spread, never one lucky number.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from ckptbench.errors import CkptbenchError
from ckptbench.records import read_records
from ckptbench.report.asynchronous import SUMMARY, summarize_async
from ckptbench.report.tiers import TYPES as TIER_TYPES
from ckptbench.report.tiers import summarize_tiers

LATENCY_OPS = ("open", "write", "fsync", "close", "read", "write_shard", "read_shard")


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def iteration_stats(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per successful (iteration, phase)."""
    ranks: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    ops: dict[tuple[int, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    extra_start: dict[tuple[int, str], int] = {}
    manifest: dict[tuple[int, str], list[tuple[float, int]]] = defaultdict(list)
    extra_end: dict[tuple[int, str], int] = {}
    phases: dict[tuple[int, str], dict[str, Any]] = {}
    for r in records:
        t = r.get("type")
        if t in ("rank", "op", "phase"):
            key = (r["iteration"], r["phase"])
        if t == "rank":
            ranks[key].append(r)
        elif t == "op":
            op = r["op"]
            if op in LATENCY_OPS:
                ops[key][op].append((r["end_ns"] - r["start_ns"]) / 1e9)
            elif op == "commit":
                extra_end[key] = max(extra_end.get(key, 0), r["end_ns"])
            elif op == "manifest":
                extra_start[key] = min(extra_start.get(key, r["start_ns"]), r["start_ns"])
                manifest[key].append(((r["end_ns"] - r["start_ns"]) / 1e9, r.get("size", 0)))
        elif t == "phase":
            phases[key] = r
    out = []
    for key in sorted(ranks):
        phase_rec = phases.get(key, {})
        if not phase_rec.get("ok", False):
            continue
        rs = ranks[key]
        start = min([r["start_ns"] for r in rs] + ([extra_start[key]] if key in extra_start else []))
        end = max([r["end_ns"] for r in rs] + ([extra_end[key]] if key in extra_end else []))
        total = sum(r["bytes"] for r in rs)
        seconds = max((end - start) / 1e9, 1e-9)
        spans = {r["rank"]: max((r["end_ns"] - r["start_ns"]) / 1e9, 1e-9) for r in rs}
        rank_tp = sorted(r["bytes"] / spans[r["rank"]] for r in rs)
        slowest = max(rs, key=lambda r: r["end_ns"])
        ends = sorted((r["end_ns"] - start) / 1e9 for r in rs)
        lat = {op: {"p50_s": _pct(v, 50), "p99_s": _pct(v, 99), "count": len(v)}
               for op, v in ops[key].items()}
        commit = phase_rec.get("commit_ns")
        data_span = max(r["end_ns"] for r in rs) - min(r["start_ns"] for r in rs)
        out.append({
            "iteration": key[0],
            "phase": key[1],
            "bytes": total,
            "seconds": seconds,
            "throughput_bytes_per_s": total / seconds,
            "data_seconds": max(data_span / 1e9, 1e-9),  # the ranks' span: no manifest, commit
            "ranks": len(rs),
            "nodes": len({r.get("host") for r in rs}),
            "rank_throughput_bytes_per_s": {"min": rank_tp[0], "median": statistics.median(rank_tp),
                                            "max": rank_tp[-1]},
            "slowest_rank": slowest["rank"],
            "slowest_rank_seconds": (slowest["end_ns"] - start) / 1e9,
            "first_done_s": ends[0],
            "last_done_s": ends[-1],
            "first_to_last_gap_s": ends[-1] - ends[0],
            "commit_s": (commit[1] - commit[0]) / 1e9 if commit else None,
            "cache": phase_rec.get("cache"),
            "latency": lat,
            **stored_stats(rs, seconds),
            **restore_stats(phase_rec, manifest.get(key, [])),
            **({"parts": phase_rec["parts"]} if isinstance(phase_rec.get("parts"), dict) else {}),
            **({"off_clock": phase_rec["off_clock"]}
               if isinstance(phase_rec.get("off_clock"), dict) else {}),
            **({"rank_parts": phase_rec["rank_parts"]}
               if isinstance(phase_rec.get("rank_parts"), dict) else {}),
            **({"file_read_bytes": phase_rec["file_read_bytes"]}
               if isinstance(phase_rec.get("file_read_bytes"), int) else {}),
            **threads_stats(rs),
        })
    return out


def threads_stats(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The intra-op threads the ranks' processes ran with (runner.threads), lowest and
    highest; nothing for results written before they were recorded."""
    values = [r["intra_op_threads"] for r in ranks if isinstance(r.get("intra_op_threads"), int)]
    return {"intra_op_threads": {"min": min(values), "max": max(values)}} if values else {}


RESTORE_FIELDS = ("restore_plan", "restore_world_size", "restore_layout", "restore_ranks",
                  "amplification", "planned_read_bytes", "fill_in_files", "fill_in_bytes",
                  "file_readers_max", "file_readers_median")


def restore_stats(phase_rec: dict[str, Any], manifest: list[tuple[float, int]]
                  ) -> dict[str, Any]:
    """A restore's plan figures (from its phase record) and its manifest reads: size, the
    slowest rank's read time."""
    out = {k: phase_rec[k] for k in RESTORE_FIELDS if k in phase_rec}
    if manifest:
        out["manifest_bytes"] = max(size for _, size in manifest)
        out["manifest_s"] = max(t for t, _ in manifest)
    return out


def stored_stats(ranks: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Stored (encoded) bytes, compression ratio and stored throughput of one iteration's
    phase, when its ops recorded stored bytes (the zarr format); else nothing."""
    if not any("stored_bytes" in r for r in ranks):
        return {}
    logical = sum(r["bytes"] for r in ranks)
    stored = sum(r.get("stored_bytes", 0) for r in ranks)
    return {"stored_bytes": stored, "compression_ratio": logical / stored if stored else None,
            "stored_throughput_bytes_per_s": stored / seconds}


def stored_summary(sel: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of stored_stats over iterations (summary fields), when present."""
    if not sel or "stored_bytes" not in sel[0]:
        return {}
    ratios = [i["compression_ratio"] for i in sel if i.get("compression_ratio")]
    return {
        "stored_bytes": sel[0]["stored_bytes"],
        "compression_ratio": statistics.median(ratios) if ratios else None,
        "stored_throughput_bytes_per_s": statistics.median(
            i["stored_throughput_bytes_per_s"] for i in sel),
    }


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``summary`` record per phase: medians and spread over iterations."""
    its = iteration_stats(records)
    out = []
    for phase in ("save", "restore"):
        sel = [i for i in its if i["phase"] == phase]
        if not sel:
            continue
        tps = [i["throughput_bytes_per_s"] for i in sel]
        worst = max(sel, key=lambda i: i["slowest_rank_seconds"])
        secs = [i["seconds"] for i in sel]
        lat: dict[str, dict[str, float | None]] = {}
        for op in LATENCY_OPS:
            values = [r for r in records if r.get("type") == "op" and r["phase"] == phase
                      and r["op"] == op]
            d = [(r["end_ns"] - r["start_ns"]) / 1e9 for r in values]
            if d:
                lat[op] = {"p50_s": _pct(d, 50), "p99_s": _pct(d, 99)}
        out.append({
            "type": "summary",
            "phase": phase,
            "iterations": len(sel),
            "bytes": sel[0]["bytes"],
            "seconds": statistics.median(secs),
            "data_seconds": statistics.median(i["data_seconds"] for i in sel),
            "throughput_bytes_per_s": statistics.median(tps),
            "throughput_min": min(tps),
            "throughput_max": max(tps),
            "throughput_stdev": statistics.stdev(tps) if len(tps) > 1 else 0.0,
            "rank_throughput_min_bytes_per_s": min(i["rank_throughput_bytes_per_s"]["min"] for i in sel),
            "slowest_rank_seconds_max": worst["slowest_rank_seconds"],
            "slowest_rank": worst["slowest_rank"],  # the rank that finished last, worst iteration
            "slowest_rank_iteration": worst["iteration"],
            "first_to_last_gap_s_median": statistics.median(i["first_to_last_gap_s"] for i in sel),
            "ranks": sel[0]["ranks"],
            "nodes": sel[0]["nodes"],
            "cache": sel[0]["cache"],
            "latency": lat,
            **stored_summary(sel),
            **{k: sel[0][k] for k in (*RESTORE_FIELDS, "manifest_bytes") if k in sel[0]},
            **({"manifest_s": statistics.median(i["manifest_s"] for i in sel)}
               if "manifest_s" in sel[0] else {}),
            **parts_summary(sel),
            **rank_parts_summary(sel),
            **({"file_read_bytes": statistics.median(i["file_read_bytes"] for i in sel)}
               if all("file_read_bytes" in i for i in sel) else {}),
            **threads_summary(sel),
        })
    return out


def rank_parts_summary(sel: list[dict[str, Any]]) -> dict[str, Any]:
    """A format's parts of two ranks (runner.phase_report.rank_parts: the slowest rank,
    the one the others waited for, and the median rank): per part the median over the
    iterations, and the rank of each iteration."""
    given = [i["rank_parts"] for i in sel if isinstance(i.get("rank_parts"), dict)]
    out: dict[str, Any] = {}
    for which in ("slowest", "median"):
        picked = [g[which] for g in given if isinstance(g.get(which), dict)]
        parts = [p["parts"] for p in picked if isinstance(p.get("parts"), dict)]
        if not parts:
            continue
        names = list(dict.fromkeys(k for p in parts for k in p))
        out[which] = {"ranks": [p.get("rank") for p in picked],
                      "parts": {k: statistics.median(p.get(k, 0.0) for p in parts)
                                for k in names}}
    return {"rank_parts": out} if out else {}


def threads_summary(sel: list[dict[str, Any]]) -> dict[str, Any]:
    """The intra-op threads of the phase's ranks over the iterations (lowest, highest)."""
    given = [i["intra_op_threads"] for i in sel if isinstance(i.get("intra_op_threads"), dict)]
    if not given:
        return {}
    return {"intra_op_threads": {"min": min(g["min"] for g in given),
                                 "max": max(g["max"] for g in given)}}


def parts_summary(sel: list[dict[str, Any]]) -> dict[str, Any]:
    """The median seconds of each named part of a phase (runner.parts) over the iterations
    that recorded them; nothing for results written before parts were recorded."""
    with_parts = [i["parts"] for i in sel if "parts" in i]
    if not with_parts:
        return {}
    names = list(dict.fromkeys(k for p in with_parts for k in p))
    return {"parts": {k: statistics.median(p.get(k, 0.0) for p in with_parts) for k in names}}


# What the report shows of summary and error records (summarize() writes them all), and
# what each field must hold for the table to show it.
_NUMBER, _OPTIONAL = "a number", "a number or null"
_SHOWN_FIELDS: dict[str, dict[str, str]] = {
    "summary": {"phase": "a string", "iterations": "an integer", "bytes": _NUMBER,
                "seconds": _NUMBER, "throughput_bytes_per_s": _NUMBER,
                "throughput_min": _OPTIONAL, "throughput_max": _OPTIONAL,
                "rank_throughput_min_bytes_per_s": _OPTIONAL,
                "slowest_rank_seconds_max": _NUMBER, "first_to_last_gap_s_median": _NUMBER,
                "latency": "an object of {p50_s, p99_s} objects",
                "cache": "a string, a list of strings or null"},
    "error": {"phase": "a string", "iteration": "an integer", "message": "a string"},
}
_STORED_FIELDS = {"stored_bytes": _NUMBER, "compression_ratio": _OPTIONAL,
                  "stored_throughput_bytes_per_s": _NUMBER}


def _fits(value: Any, rule: str) -> bool:
    """Whether `value` is what `rule` (a value of _SHOWN_FIELDS) allows."""
    if rule in (_NUMBER, _OPTIONAL):
        return (value is None and rule == _OPTIONAL) or (
            isinstance(value, int | float) and not isinstance(value, bool))
    if rule == "an integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if rule == "a string":
        return isinstance(value, str)
    if rule.startswith("a string, a list"):
        return value is None or isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(v, str) for v in value))
    return isinstance(value, dict) and all(
        isinstance(v, dict) and all(_fits(v.get(q), _OPTIONAL) for q in ("p50_s", "p99_s"))
        for v in value.values())


def checked_view(records: list[dict[str, Any]], path: str) -> dict[str, Any]:
    """:func:`view` of a results file's records, refused in one line when a record lacks
    what the statistics need or a field the report shows holds something else, or when
    the file holds neither a summary nor an error (its run was killed before it ended):
    an empty table would read as success."""
    if not records:
        raise CkptbenchError(f"{path}: empty; allowed: a results file of `ckptbench run`")
    try:
        loaded = view(records, path)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CkptbenchError(f"{path}: a record lacks a valid field ({type(exc).__name__}: {exc});"
                             " not a results file of `ckptbench run`") from None
    for r in loaded["summary"] + loaded["errors"]:
        fields = _SHOWN_FIELDS[r["type"]]
        missing = [k for k in fields if k not in r]
        if missing:
            raise CkptbenchError(f"{path}: a {r['type']} record lacks {', '.join(missing)};"
                                 " not a results file of `ckptbench run`")
        rules = {**fields, **(_STORED_FIELDS if "stored_bytes" in r else {})}
        for key, rule in rules.items():
            if not _fits(r.get(key), rule):
                raise CkptbenchError(f"{path}: a {r['type']} record's {key} is "
                                     f"{json.dumps(r.get(key))[:40]}; allowed: {rule}")
    if not loaded["summary"] and not loaded["errors"]:
        raise CkptbenchError(f"{path}: the run is incomplete: no summary and no error record "
                             "(was it or one of its ranks killed?)")
    return loaded


def load(path: str) -> dict[str, Any]:
    """A results file as {run, iterations, summary, errors} (see :func:`checked_view`)."""
    return checked_view(list(read_records(path)), path)


def view(records: list[dict[str, Any]], path: str) -> dict[str, Any]:
    """A run's records (from a file, or kept in memory by the sink) as {run, iterations,
    summary, errors}."""
    run = next((r for r in records if r.get("type") == "run"), {})
    summary = [r for r in records if r.get("type") == "summary"] or summarize(records)
    return {
        "path": str(path),
        "run": run,
        "iterations": iteration_stats(records),
        "summary": summary,
        "errors": [r for r in records if r.get("type") == "error"],
        "async": [r for r in records if r.get("type") == SUMMARY] or summarize_async(records),
        "tiers": [r for r in records if r.get("type") in TIER_TYPES] or summarize_tiers(records),
    }
