"""Asynchronous checkpoints for the cadence answer: the blocking part of the save, the
persist after it (the interval's floor) and the interference, given (`cadence
--blocking-seconds`, `--interference`) or measured by a `ckptbench run --mode async`
(docs/cadence.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ckptbench.cadence.answer import CheckpointCost
from ckptbench.cadence.job import split_measured
from ckptbench.errors import SpecError
from ckptbench.jobmodel import AsyncMeasurement
from ckptbench.units import format_bytes, parse_duration


@dataclass(frozen=True)
class AsyncCost:
    """The save split into blocking C and persist L, the interference charged, and the
    async run they were measured by (None: given, or a sync save)."""

    save_s: float
    persist_s: float
    interference: float
    measured: AsyncMeasurement | None


def split_save(save_s: float, measured: AsyncMeasurement | None, blocking_seconds: str | None,
               interference: str | None, bytes_per_gpu: float | None) -> AsyncCost:
    """--blocking-seconds splits the save time given or measured; else an async run's
    blocking time, scaled to the job's bytes per GPU, does (its save time is the
    persist's). --interference wins over the run's measured one (below 0: noise, 0)."""
    blocking, persist_s, slowdown = split_measured(save_s, measured, bytes_per_gpu)
    if blocking_seconds:
        blocking = parse_duration(blocking_seconds, "--blocking-seconds", "s")
        if blocking > save_s:
            raise SpecError(f"--blocking-seconds must be <= the save time ({save_s:.3g} s)")
        persist_s = save_s - blocking
    if interference:
        slowdown = parse_ratio(interference, "--interference")
    elif measured is not None and not bytes_per_gpu:
        slowdown = max(0.0, measured.interference or 0.0)
    return AsyncCost(blocking, persist_s, slowdown, measured)


def parse_ratio(text: str, option: str) -> float:
    """A slowdown >= 0 from '0.12' or '12%' (above 1: more than twice as slow)."""
    body = text.strip()
    try:
        value = float(body.removesuffix("%")) / (100.0 if body.endswith("%") else 1.0)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise SpecError(f"{option} {text!r} must be >= 0, e.g. 0.1 or 10%")
    return value


def async_note(cost: CheckpointCost, measured: AsyncMeasurement | None,
               bytes_per_gpu: float | None) -> str:
    """The interference charged, and where an async run's figures come from."""
    text = ""
    if cost.interference:
        text += (f"; training {100 * cost.interference:.3g} % slower while persisting: charged"
                 f" {cost.effective_save_s - cost.save_s:.3g} s per checkpoint")
    if measured is not None and bytes_per_gpu:
        text += (f"\nasynchronous run {measured.source}: blocking {measured.blocking_s:.3g} s"
                 f" for {format_bytes(measured.bytes_per_process)} of state per process, scaled"
                 f" to {format_bytes(bytes_per_gpu)} per GPU; its save time is the"
                 " persist (the interval's floor); interference "
                 + ("not measurable in that run (its steps slowed more than the persists"
                    " lasted: the machine's load drifted), charged as 0"
                    if measured.interference is None else
                    f"{100 * measured.interference:+.3g} % measured"))
    return text
