"""Records of a ``--mode async`` run -> what the training loop waited, how long until a
checkpoint was durable, and how much the persist slowed training.

Per checkpoint the job waits for its slowest process (the loop resumes behind a barrier),
so the blocking, snapshot and persist figures are the maximum over processes, then the
median and p99 over checkpoints. Interference: how much slower steps run while a
persist is in flight, against the baseline loop's mean step (see :func:`slowdown`); the
mean of the steps whose midpoint falls in a persist is kept beside it. The physical limit of a snapshot is the
state's bytes over one plain copy of them into staging, timed just before each
snapshot (off the clock): each checkpoint is compared with the copy of its own moment.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

SUMMARY = "async_summary"


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p99": None, "max": None}
    return {"median": statistics.median(values), "p99": float(np.percentile(values, 99)),
            "max": max(values)}


def _mean(values: list[float]) -> dict[str, float]:
    return {"count": len(values), "mean_s": statistics.fmean(values) if values else 0.0}


def classify_steps(starts: list[int], seconds: list[float], windows: list[tuple[int, int, int]]
                   ) -> list[dict[str, dict[str, float]]]:
    """Per checkpoint (due, loop resumed, durable; ns): the steps before it (since the
    previous checkpoint was durable), during its persist (resumed to durable) and after
    it (until the next checkpoint), by each step's midpoint."""
    mids = [(s + sec * 5e8, sec) for s, sec in zip(starts, seconds, strict=True)]
    out = []
    for k, (due, resumed, durable) in enumerate(windows):
        prev = windows[k - 1][2] if k else -1
        nxt = windows[k + 1][0] if k + 1 < len(windows) else float("inf")
        out.append({
            "before": _mean([s for m, s in mids if prev < m < due]),
            "during": _mean([s for m, s in mids if resumed < m < durable]),
            "after": _mean([s for m, s in mids if durable < m < nxt]),
        })
    return out


def per_checkpoint(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each checkpoint on each process: its times and the mean step before, during and
    after its persist (from that process's steps of the checkpointing loop)."""
    steps = {r["process"]: r for r in records
             if r.get("type") == "steps" and r["loop"] == "async"}
    out = []
    for proc in sorted(steps):
        cks = sorted((r for r in records if r.get("type") == "checkpoint"
                      and r["process"] == proc), key=lambda r: r["iteration"])
        windows = [(c["start_ns"], c["resume_ns"],
                    c["durable_ns"] if c["durable_ns"] is not None else c["resume_ns"])
                   for c in cks]
        around = classify_steps(steps[proc]["start_ns"], steps[proc]["seconds"], windows)
        out += [{**{k: c[k] for k in ("iteration", "process", "ok", "wait_s", "snapshot_s",
                                      "limit_s", "blocking_s", "persist_s", "durable_after_s")},
                 "steps": a} for c, a in zip(cks, around, strict=True)]
    return out


def slowdown(records: list[dict[str, Any]], baseline_s: float) -> tuple[float, float]:
    """(extra seconds, persist seconds): over every process, the time the steps that
    overlap a persist took beyond the baseline step, and the wall time of the persists
    (loop resumed to durable). A persist of W seconds with steps running a fraction i
    slower costs W i / (1 + i) of extra time, so i = extra / (W - extra): the mean step
    time during persists over the baseline's, minus one, when persists span whole steps,
    and still a measure when a persist is shorter than one step."""
    extra = window = 0.0
    for st in (r for r in records if r.get("type") == "steps" and r["loop"] == "async"):
        spans = [(c["resume_ns"], c["durable_ns"]) for c in records
                 if c.get("type") == "checkpoint" and c["process"] == st["process"] and c["ok"]
                 and c["durable_ns"] is not None]
        steps = [(a, a + sec * 1e9, sec) for a, sec in zip(st["start_ns"], st["seconds"],
                                                           strict=True)]
        if not steps:
            continue
        loop_end = steps[-1][1]
        for a, b in spans:  # persists outlasting the loop count up to its end
            window += max(0.0, min(b, loop_end) - a) / 1e9
        extra += sum(sec - baseline_s for a, b, sec in steps
                     if any(a < hi and b > lo for lo, hi in spans))
    return extra, window


def _steps_mean(groups: list[dict[str, float]]) -> tuple[float | None, int]:
    count = sum(int(g["count"]) for g in groups)
    if not count:
        return None, 0
    return sum(g["count"] * g["mean_s"] for g in groups) / count, count


def summarize_async(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's ``async_summary`` record (a list of one), or [] for a sync run."""
    records = list(records)
    loops = [r for r in records if r.get("type") == "loop"]
    if not loops:
        return []
    run = next((r for r in records if r.get("type") == "run"), {})
    checkpoints = [r for r in records if r.get("type") == "checkpoint"]
    iterations = sorted({c["iteration"] for c in checkpoints if c["ok"]})
    per_it = {it: [c for c in checkpoints if c["iteration"] == it] for it in iterations}

    def worst(key: str) -> list[float]:
        return [max(c[key] for c in cs) for cs in per_it.values()
                if all(c[key] is not None for c in cs)]

    blocking = worst("blocking_s")
    waits = worst("wait_s")
    unwaited = [max(c["blocking_s"] - c["wait_s"] for c in cs) for cs in per_it.values()]
    baseline = [s for r in records if r.get("type") == "steps" and r["loop"] == "baseline"
                for s in r["seconds"]]
    base_mean = statistics.fmean(baseline) if baseline else None
    detail = per_checkpoint(records)
    during, n_during = _steps_mean([c["steps"]["during"] for c in detail if c["ok"]])
    first = {c["process"]: c for c in detail if c["iteration"] == 1}
    between, _ = _steps_mean([c["steps"]["after"] for c in detail]
                             + [c["steps"]["before"] for c in first.values()])
    extra, window = slowdown(records, base_mean) if base_mean else (0.0, 0.0)
    local, _ = slowdown(records, between) if between else (0.0, 0.0)
    limits = worst("limit_s")
    calibrated = statistics.median(r["calibrated_step_s"] for r in loops)
    # Each checkpoint against the plain copy timed just before it (the machine's load
    # drifts; a pair of the same moment does not).
    over = [b / lim for b, lim in zip(unwaited, limits, strict=True) if lim > 0]
    return [{
        "type": SUMMARY,
        "checkpoints": len(iterations),
        "failed": len({c["iteration"] for c in checkpoints if not c["ok"]}),
        "processes": len(loops),
        "device": loops[0]["device"],
        "snapshot": loops[0]["snapshot"],
        "kernel": loops[0]["kernel"],
        "bytes_per_process": max(r["bytes"] for r in loops),
        "staging_bytes": max(r["staging_bytes"] for r in loops),
        "step_seconds": loops[0]["step_seconds"],
        "steps_per_checkpoint": run.get("options", {}).get("loop", {}).get("steps_per_checkpoint"),
        "calibrated_step_s": calibrated,
        "baseline_step_s": base_mean,
        # above 1: the machine was busier during the loop than when the step was timed
        "baseline_over_calibrated": base_mean / calibrated if base_mean else None,
        "during_step_s": during,
        "between_step_s": between,  # the loop's steps with no persist in flight: a check
        "steps_during_persist": n_during,
        "persist_window_s": window,
        "extra_step_s": extra,
        "interference": extra / (window - extra) if window > extra else None,
        # the same against the loop's own steps between persists (load drifting in time)
        "interference_against_between": local / (window - local) if window > local else None,
        "blocking_s": _spread(blocking),
        "blocking_without_wait_s": _spread(unwaited),
        "waited_checkpoints": sum(1 for w in waits if w > 0),
        "wait_s": _spread(waits),
        "snapshot_s": _spread(worst("snapshot_s")),
        "copy_bytes_per_s": statistics.median(r["copy_bytes_per_s"] for r in loops),
        "limit_s": _spread(limits),
        "blocking_over_limit": _spread(over),
        "persist_s": _spread(worst("persist_s")),
        "durable_after_s": _spread(worst("durable_after_s")),
        "per_checkpoint": detail,
    }]


@dataclass(frozen=True)
class LoopLane:
    """One process's checkpointing loop on the run's clock (seconds from the loop's first
    step): each step's start and seconds, and each checkpoint's due time, when the loop
    resumed (blocking = resumed - due) and when it was durable (persist: resumed to
    durable; None: never)."""

    process: int
    step_start: tuple[float, ...]
    step_s: tuple[float, ...]
    due: tuple[float, ...]
    resumed: tuple[float, ...]
    durable: tuple[float | None, ...]
    ok: tuple[bool, ...]


def loop_lanes(records: Iterable[dict[str, Any]]) -> tuple[list[LoopLane], float | None]:
    """The async loop of each process ([] for a sync run) and the baseline loop's mean
    step (None without one), for the loop's figure."""
    records = list(records)
    steps = {r["process"]: r for r in records if r.get("type") == "steps" and r["loop"] == "async"}
    if not steps:
        return [], None
    t0 = min(min(r["start_ns"], default=0) for r in steps.values())
    lanes = []
    for proc in sorted(steps):
        cks = sorted((r for r in records if r.get("type") == "checkpoint"
                      and r["process"] == proc), key=lambda r: r["iteration"])
        lanes.append(LoopLane(
            proc, tuple((ns - t0) / 1e9 for ns in steps[proc]["start_ns"]),
            tuple(steps[proc]["seconds"]), tuple((c["start_ns"] - t0) / 1e9 for c in cks),
            tuple((c["resume_ns"] - t0) / 1e9 for c in cks),
            tuple(None if c["durable_ns"] is None else (c["durable_ns"] - t0) / 1e9 for c in cks),
            tuple(bool(c["ok"]) for c in cks)))
    baseline = [s for r in records if r.get("type") == "steps" and r["loop"] == "baseline"
                for s in r["seconds"]]
    return lanes, statistics.fmean(baseline) if baseline else None
