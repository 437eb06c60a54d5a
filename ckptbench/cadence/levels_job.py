"""A multi-level job as `ckptbench levels`, `simulate` and `report` describe it.

Levels (``NAME:SAVE:RESTORE:SCOPE[:PERSIST[:INTERFERENCE]]``, given or measured by a
tiered run), failure classes, the restart mechanism that follows each scope, bounded
before any work; the answer under the stated rules (``cadence.scoped``: each failure
pays its own scope's restart) or SCR's (``cadence.multilevel``: each level's restore
carries the rate-weighted mean restart of the failures that need it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from ckptbench.cadence import classes as fc
from ckptbench.cadence import multilevel as ml
from ckptbench.cadence import restart as rs
from ckptbench.cadence import scoped
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


RULES = ("stated", "scr")
MAX_GPUS = 1 << 24  # 16,777,216
MAX_GPUS_PER_NODE = 1024
MAX_SECONDS = 30 * 86400.0  # a save, restore or restart part longer than 30 days is a typo
MIN_JOB_MTBF_S = 60.0  # failures every minute or more often: no schedule can help


@dataclass(frozen=True)
class LevelsJob:
    """Levels, classes, restarts and the schedule asked about, for one job size.

    ``levels`` restore their copy only: the stated rules add each failure's own restart
    (``kinds``). SCR's rules charge each level the rate-weighted mean restart of the
    failures that need it (``restart_s``, added in ``scr_levels``)."""

    levels: tuple[ml.Level, ...]  # restore_s: the copy's restore, no restart
    scopes: tuple[str, ...]
    restart_s: tuple[float, ...]  # SCR: per level, the mean restart of the failures needing it
    alone: ml.Level  # SCR: the last level alone, its restore with the mean restart of all
    mechanisms: Mapping[str, rs.Mechanism]
    chosen: Mapping[str, str]  # scope -> mechanism
    classes: tuple[fc.FailureClass, ...]
    rates: list[float]  # per level: the failures it is the cheapest to survive (1/s)
    kinds: tuple[scoped.Kind, ...]  # per class, as the stated rules see it
    needs: tuple[int, ...]  # per class: the level it needs (0-based)
    schedule: ml.Schedule | None
    gpus: int
    gpus_per_node: int

    @property
    def scr_levels(self) -> tuple[ml.Level, ...]:
        return tuple(replace(lv, restore_s=lv.restore_s + r)
                     for lv, r in zip(self.levels, self.restart_s, strict=True))

    def restart_of(self, c: fc.FailureClass) -> rs.Mechanism:
        return self.mechanisms[self.chosen[c.scope]]


@dataclass(frozen=True)
class Restarts:
    """How the job restarts: the mechanisms (parts overridden) and which follows a scope."""

    mechanisms: Mapping[str, rs.Mechanism]
    chosen: Mapping[str, str]


def _bounded(levels: Sequence[ml.Level], classes: Sequence[fc.FailureClass], gpus: int,
             gpus_per_node: int, mechanisms: Mapping[str, rs.Mechanism]) -> None:
    """Refuse, before any work, inputs no schedule can answer sensibly (one line each)."""
    if isinstance(gpus, bool) or not 1 <= gpus <= MAX_GPUS:
        raise SpecError(f"--gpus {gpus}: allowed: 1 to {MAX_GPUS:,}")
    if isinstance(gpus_per_node, bool) or not 1 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        raise SpecError(f"--gpus-per-node {gpus_per_node}: allowed: 1 to {MAX_GPUS_PER_NODE}")
    for lv in levels:
        for what, value in (("SAVE", lv.save_s), ("RESTORE", lv.restore_s),
                            ("PERSIST", lv.persist_s)):
            if not value <= MAX_SECONDS:
                raise SpecError(f"--level {lv.name} {what} {format_duration(value)}: allowed: "
                                f"at most {format_duration(MAX_SECONDS)}")
        if not lv.interference <= 100.0:
            raise SpecError(f"--level {lv.name} INTERFERENCE {lv.interference:g}: allowed: at "
                            "most 100 (steps 101 times slower)")
    for m in mechanisms.values():
        if not m.seconds <= MAX_SECONDS:
            raise SpecError(f"restart {m.name}: {format_duration(m.seconds)}; allowed: at most "
                            f"{format_duration(MAX_SECONDS)} (--restart-part)")
    total = math.fsum(c.per_second(gpus, gpus_per_node) for c in classes)
    if not total <= 1.0 / MIN_JOB_MTBF_S:
        raise SpecError(f"failure classes: the job would fail every {format_duration(1 / total)}"
                        f" at {gpus:,} GPUs; allowed: a job MTBF of at least "
                        f"{format_duration(MIN_JOB_MTBF_S)} (check each rate's unit: per "
                        "GPU-, host- or job-hour)")


def levels_job(level_texts: Sequence[str], classes: Sequence[fc.FailureClass], gpus: int,
               gpus_per_node: int, restarts: Restarts | None = None,
               schedule_text: str | None = None) -> LevelsJob:
    parsed = [parse_level(t) for t in level_texts]
    levels = tuple(lv for lv, _ in parsed)
    scopes = tuple(s for _, s in parsed)
    how = restarts or Restarts(rs.MECHANISMS, rs.by_scope(()))
    _bounded(levels, classes, gpus, gpus_per_node, how.mechanisms)
    rates = fc.severity_rates(scopes, classes, gpus, gpus_per_node)
    needs = tuple(fc.assign(scopes, classes))
    restart = rs.per_level(scopes, classes, gpus, gpus_per_node, how.mechanisms, how.chosen)
    last = levels[-1]
    alone = replace(last, restore_s=last.restore_s + rs.per_level(
        scopes[-1:], classes, gpus, gpus_per_node, how.mechanisms, how.chosen)[0])
    kinds = tuple(scoped.Kind(c.per_second(gpus, gpus_per_node), n,
                              how.mechanisms[how.chosen[c.scope]].seconds)
                  for c, n in zip(classes, needs, strict=True))
    schedule = parse_schedule(schedule_text, len(levels)) if schedule_text else None
    if schedule is not None:
        ml.check_runnable(levels, schedule)
    return LevelsJob(levels, scopes, tuple(restart), alone, how.mechanisms, how.chosen,
                     tuple(classes), rates, kinds, needs, schedule, gpus, gpus_per_node)


@dataclass(frozen=True)
class RulesAnswer:
    """The answer under one set of rules: the optimum, the last level alone and the
    schedule asked about, and how each is scored (for curves)."""

    rules: str
    answer: ml.LevelsAnswer
    score: Callable[[ml.Schedule], float]


def answer(job: LevelsJob, rules: str = "stated") -> RulesAnswer:
    """The optimum under `rules` (stated: ``scoped``; scr: ``multilevel``), the last level
    alone, and the efficiency of the schedule asked about."""
    if rules not in RULES:
        raise SpecError(f"--rules {rules!r}: allowed: {', '.join(RULES)}")
    if rules == "scr":
        levels = job.scr_levels
        result = ml.answer(levels, job.rates, job.schedule, job.alone)
        return RulesAnswer(rules, result, lambda s: ml.efficiency(levels, job.rates, s))
    best = scoped.optimum(job.levels, job.kinds)
    alone_kinds = [replace(k, need=0) for k in job.kinds]
    alone = scoped.optimum(job.levels[-1:], alone_kinds)
    named = None if job.schedule is None else ml.Optimum(
        job.schedule, scoped.efficiency(job.levels, job.kinds, job.schedule))
    result = ml.LevelsAnswer(job.levels, tuple(job.rates), best, alone, named)
    return RulesAnswer(rules, result, lambda s: scoped.efficiency(job.levels, job.kinds, s))


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
