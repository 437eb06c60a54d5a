"""Recovery tiers' records -> answers (runner.tiers writes ``tier`` and ``tier_restore``).

Per tier (``tier_summary``): per checkpoint, the slowest process's blocking seconds and
its baseline (a plain copy of the same bytes for memory, a plain transfer over the same
transport for peer), the bytes of every process and the rate, every process's bytes over
the span from the first start to the last end; median over checkpoints, and the ratio
that says how close the tier comes to its physical limit: blocking over the baseline's
time for the same bytes (a peer tier's K replicas are K times the bytes of the one plain
transfer, so its baseline counts K times).

Per restart scenario (``tier_restore_summary``): seconds from the first process's start
to the last one's end, bytes, rate, which tier served how many processes and which ones,
and the slowest process's baseline. The storage restart is the last storage checkpoint's restore (its
``rank`` records, read by the DCP restore plan), measured in the same run.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from ckptbench.errors import SpecError
from ckptbench.records import read_records

SUMMARY = "tier_summary"
RESTORE_SUMMARY = "tier_restore_summary"
LEVELS = "tier_levels"
TYPES = (SUMMARY, RESTORE_SUMMARY, LEVELS)  # what the report step adds


def _span(rows: list[dict[str, Any]]) -> float:
    return float(max(r["end_ns"] for r in rows) - min(r["start_ns"] for r in rows)) / 1e9


def _rate(nbytes: int, seconds: float) -> float | None:
    return nbytes / seconds if seconds > 0 else None


def _seconds(r: dict[str, Any]) -> float:
    """A tier's time per checkpoint: what the loop waited for, or the replication's
    seconds when it ran in the background (--mode async: the loop did not wait)."""
    return float(r["replication_s"] if r.get("background") else r["blocking_s"])


def _interference(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> float | None:
    """--mode async: the median step that overlapped a replication of its process over
    the median baseline step (None without such steps)."""
    windows = defaultdict(list)
    for r in rows:
        windows[r["process"]].append((r["start_ns"], r["end_ns"]))
    during, baseline = [], []
    for r in records:
        if r.get("type") != "steps":
            continue
        pairs = zip(r["start_ns"], r["seconds"], strict=True)
        if r["loop"] == "baseline":
            baseline += r["seconds"]
            continue
        during += [sec for start, sec in pairs if any(
            start < b and start + sec * 1e9 > a for a, b in windows[r["process"]])]
    if not during or not baseline:
        return None
    return float(statistics.median(during) / statistics.median(baseline))


def _tier_summary(tier: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_it: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_it[r["iteration"]].append(r)
    blocking, baseline, rates, ratios = [], [], [], []
    nbytes = 0
    for its in by_it.values():
        slow, base = max(_seconds(r) for r in its), max(r["baseline_s"] for r in its)
        nbytes = sum(r["bytes"] * r.get("replicas", 1) for r in its)
        blocking.append(slow)
        baseline.append(base)
        rates.append(_rate(nbytes, _span(its)) or 0.0)
        # the baseline moved one replica's bytes: k replicas are k times its bytes
        ratios.append(slow / (base * its[0].get("replicas", 1)) if base > 0 else float("inf"))
    first = rows[0]
    return {"type": SUMMARY, "tier": tier, "checkpoints": len(by_it), "bytes": nbytes,
            "processes": len({r["process"] for r in rows}),
            "blocking_s": statistics.median(blocking), "baseline_s": statistics.median(baseline),
            "baseline": first["baseline"], "rate_Bps": statistics.median(rates),
            "over_baseline": statistics.median(ratios),
            "transport": first.get("transport", _where(first)),
            "replicas": first.get("replicas", 0), "background": bool(first.get("background"))}


def _where(record: dict[str, Any]) -> str:
    """The memory tier's directory and the pages its copies are held in (runs before
    the pages were recorded: the directory alone)."""
    where = str(record.get("where", ""))
    return f"{where} ({record['pages']})" if record.get("pages") else where


def _restore_summary(scenario: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = _span(rows)
    nbytes = sum(r["bytes"] for r in rows)
    served: dict[str, int] = defaultdict(int)
    by_process: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        served[r["tier"]] += 1
        by_process[r["tier"]].append(r["process"])
    base = [r["baseline_s"] for r in rows if r.get("baseline_s")]
    slowest = max(r["seconds"] for r in rows)
    ratios = {}  # per serving tier: its slowest process over the slowest baseline
    for tier in served:
        mine = [r for r in rows if r["tier"] == tier and r.get("baseline_s")]
        if mine:
            ratios[tier] = max(r["seconds"] for r in mine) / max(r["baseline_s"] for r in mine)
    return {"type": RESTORE_SUMMARY, "scenario": scenario, "iteration": rows[0]["iteration"],
            "seconds": seconds, "bytes": nbytes, "rate_Bps": _rate(nbytes, seconds),
            "served": dict(served), "served_by": {t: sorted(p) for t, p in by_process.items()},
            "slowest_s": slowest, "over_baseline": ratios,
            "baseline_s": max(base) if base else None,
            "lost_nodes": rows[0].get("lost_nodes", []),
            # onto the restore layout (runner.tier_reshard): DCP's load plan from the tiers
            "resharded": any("restore_ranks" in r for r in rows),
            "verified": all(r.get("verified") for r in rows)}


def _storage_restore(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    done = [r["iteration"] for r in records if r.get("type") == "phase"
            and r.get("phase") == "restore" and r.get("ok")]
    if not done:
        return None
    it = max(done)
    rows = [r for r in records if r.get("type") == "rank" and r.get("phase") == "restore"
            and r.get("iteration") == it]
    if not rows:
        return None
    seconds = _span(rows)
    nbytes = sum(r["bytes"] for r in rows)
    return {"type": RESTORE_SUMMARY, "scenario": "storage", "iteration": it,
            "seconds": seconds, "bytes": nbytes, "rate_Bps": _rate(nbytes, seconds),
            "served": {"storage": len(rows)}, "slowest_s": None, "baseline_s": None,
            "over_baseline": {},
            "lost_nodes": "all copies", "verified": True}


def _phase_s(records: list[dict[str, Any]], phase: str) -> float | None:
    """The median seconds of a run's ok phases (their parts add up to the phase)."""
    secs = [sum(r["parts"].values()) for r in records if r.get("type") == "phase"
            and r.get("phase") == phase and r.get("ok") and r.get("parts")]
    return statistics.median(secs) if secs else None


def tier_levels(summaries: list[dict[str, Any]], records: list[dict[str, Any]]
                ) -> dict[str, Any] | None:
    """The levels of ``ckptbench levels`` (NAME:SAVE:RESTORE:SCOPE) as this run measured
    them, at its own size: memory survives a process failure, peer a node's, storage the
    job's. The restores are the scenarios' (the restart itself not included)."""
    tiers = {r["tier"]: r for r in summaries if r["type"] == SUMMARY}
    restarts = {r["scenario"]: r for r in summaries if r["type"] == RESTORE_SUMMARY}
    out = []
    for tier, scenario, scope in (("memory", "process", "process"), ("peer", "node", "node")):
        if tier in tiers and scenario in restarts:
            out.append(f"{tier}:{tiers[tier]['blocking_s']:.4g}s:"
                       f"{restarts[scenario]['seconds']:.4g}s:{scope}")
    save, restore = _phase_s(records, "save"), _phase_s(records, "restore")
    if save is not None and restore is not None:
        out.append(f"storage:{save:.4g}s:{restore:.4g}s:job")
    return {"type": LEVELS, "levels": out} if out else None


def summarize_tiers(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tier and restart summaries of a run's records ([] for a run without tiers)."""
    tiers = [r for r in records if r.get("type") == "tier"]
    if not tiers:
        return []
    out = [_tier_summary(t, [r for r in tiers if r["tier"] == t])
           for t in ("memory", "peer") if any(r["tier"] == t for r in tiers)]
    for row in out:
        if row["background"]:
            row["interference"] = _interference([r for r in tiers if r["tier"] == row["tier"]],
                                                records)
    restores = [r for r in records if r.get("type") == "tier_restore"]
    out += [_restore_summary(s, [r for r in restores if r["scenario"] == s])
            for s in ("process", "node", "group") if any(r["scenario"] == s for r in restores)]
    storage = _storage_restore(records)
    out += [storage] if storage else []
    levels = tier_levels(out, records)
    return out + ([levels] if levels else [])


def measured_levels(path: str) -> list[str]:
    """The levels (NAME:SAVE:RESTORE:SCOPE) a tiered run's results file holds."""
    records = list(read_records(path))
    found = next((r for r in records if r.get("type") == LEVELS), None)
    if found is None:
        found = next((r for r in summarize_tiers(records) if r["type"] == LEVELS), None)
    if found is None or not found.get("levels"):
        raise SpecError(f"--tiers-results {path}: no tier measurements in it; allowed: the "
                        "results file of a `ckptbench run --tiers ...`")
    return [str(lv) for lv in found["levels"]]
