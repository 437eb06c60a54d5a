"""A multi-level job as `ckptbench levels`, `simulate` and `report` describe it.

Levels (``NAME:SAVE:RESTORE:SCOPE[:PERSIST[:INTERFERENCE]]``, given or measured by a
tiered run), failure classes, the restart mechanism that follows each scope: the levels'
restore times then include their restarts (the rate-weighted mean of the failures that
need each level), and the model (``cadence.multilevel``) answers with the optimum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ckptbench.cadence import classes as fc
from ckptbench.cadence import multilevel as ml
from ckptbench.cadence import restart as rs
from ckptbench.errors import SpecError
from ckptbench.units import format_duration, parse_duration, parse_fraction


def parse_level(text: str) -> tuple[ml.Level, str]:
    """NAME:SAVE:RESTORE:SCOPE[:PERSIST[:INTERFERENCE]] -> the level and its scope."""
    parts = text.split(":")
    if not 4 <= len(parts) <= 6 or not parts[0].strip():
        raise SpecError(f"--level {text!r}: allowed: NAME:SAVE:RESTORE:SCOPE[:PERSIST"
                        f"[:INTERFERENCE]], e.g. memory:2s:20s:process or storage:3s:129s:job:"
                        f"51s:10% (scope {'|'.join(fc.SCOPES)})")
    name = parts[0].strip()
    save = parse_duration(parts[1], f"--level {name} SAVE", "s")
    restore = parse_duration(parts[2], f"--level {name} RESTORE", "s")
    persist = parse_duration(parts[4], f"--level {name} PERSIST", "s") if len(parts) > 4 \
        else 0.0
    interference = parse_fraction(parts[5], f"--level {name} INTERFERENCE") \
        if len(parts) > 5 else 0.0
    return ml.Level(name, save, restore, persist, interference), parts[3].strip()


def parse_schedule(text: str, levels: int) -> ml.Schedule:
    """DUR[:V1,V2,...]: compute between checkpoints, and counts per level below the top."""
    head, _, tail = text.partition(":")
    compute = parse_duration(head, "--schedule", "min")
    try:
        counts = tuple(int(v) for v in tail.split(",")) if tail else ()
    except ValueError:
        raise SpecError(f"--schedule {text!r}: allowed: DUR[:V1,V2,...], e.g. 5min:6,4 "
                        "(level-k checkpoints before each level-(k+1) one)") from None
    if len(counts) != levels - 1:
        raise SpecError(f"--schedule {text!r}: {len(counts)} counts given; allowed: one per "
                        f"level below the top ({levels - 1})")
    return ml.Schedule(compute, counts)


@dataclass(frozen=True)
class LevelsJob:
    """Levels, classes, restarts and the schedule asked about, for one job size."""

    levels: tuple[ml.Level, ...]  # restore_s: the copy's restore plus the restart
    scopes: tuple[str, ...]
    restart_s: tuple[float, ...]
    alone: ml.Level  # the last level when it is the only one (every failure restarts to it)
    mechanisms: Mapping[str, rs.Mechanism]
    chosen: Mapping[str, str]  # scope -> mechanism
    classes: tuple[fc.FailureClass, ...]
    rates: list[float]
    schedule: ml.Schedule | None
    gpus: int
    gpus_per_node: int


@dataclass(frozen=True)
class Restarts:
    """How the job restarts: the mechanisms (parts overridden) and which follows a scope."""

    mechanisms: Mapping[str, rs.Mechanism]
    chosen: Mapping[str, str]


def levels_job(level_texts: Sequence[str], classes: Sequence[fc.FailureClass], gpus: int,
               gpus_per_node: int, restarts: Restarts | None = None,
               schedule_text: str | None = None) -> LevelsJob:
    parsed = [parse_level(t) for t in level_texts]
    levels = tuple(lv for lv, _ in parsed)
    scopes = tuple(s for _, s in parsed)
    how = restarts or Restarts(rs.MECHANISMS, rs.by_scope(()))
    rates = fc.severity_rates(scopes, classes, gpus, gpus_per_node)
    restart = rs.per_level(scopes, classes, gpus, gpus_per_node, how.mechanisms, how.chosen)
    last = levels[-1]
    alone = replace(last, restore_s=last.restore_s + rs.per_level(
        scopes[-1:], classes, gpus, gpus_per_node, how.mechanisms, how.chosen)[0])
    levels = tuple(replace(lv, restore_s=lv.restore_s + r)
                   for lv, r in zip(levels, restart, strict=True))
    return LevelsJob(levels, scopes, tuple(restart), alone, how.mechanisms, how.chosen,
                     tuple(classes), rates,
                     parse_schedule(schedule_text, len(levels)) if schedule_text else None,
                     gpus, gpus_per_node)


def describe(o: ml.Optimum | ml.Schedule, levels: Sequence[ml.Level]) -> str:
    schedule = o.schedule if isinstance(o, ml.Optimum) else o
    text = f"a checkpoint every {format_duration(schedule.compute_s)} of compute"
    steps = [f"{v} {lower.name} then 1 {upper.name}" for lower, upper, v in
             zip(levels, levels[1:], schedule.counts, strict=False)]
    return text + (": " + "; ".join(steps) if steps else f" ({levels[0].name})")


def optimum_marks(job: LevelsJob, best: ml.Optimum) -> dict[str, tuple[float, float]]:
    """Per level: its interval at the optimum (compute between its checkpoints) and the
    optimum's efficiency, where the figure marks it."""
    marks, segments = {}, 1
    for k, level in enumerate(job.levels):
        marks[level.name] = (best.schedule.compute_s * segments, best.efficiency)
        if k < len(best.schedule.counts):
            segments *= best.schedule.counts[k] + 1
    return marks
