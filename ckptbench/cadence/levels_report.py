"""The multi-level cadence of a tiered run, as `report` shows it: a table of the levels
with the optimum schedule, and the figure of efficiency against each level's interval.

A tiered run (``run --tiers``) measures each level's blocking save and restart
(``report.tiers``' ``tier_levels``); with failure classes and the job's GPUs (``report
--failure-preset CLASSES --gpus N``) the stated rules (``cadence.scoped``) give the schedule
that maximizes efficiency, as ``ckptbench levels --tiers-results`` does: the levels scaled
from the run's size to the job's (``levels_scale``), the measured ones beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptbench.cadence import classes as fc
from ckptbench.cadence import multilevel as ml
from ckptbench.cadence.job import DEFAULT_GPUS_PER_NODE
from ckptbench.cadence.levels_job import (
    LevelsJob,
    RulesAnswer,
    answer,
    describe,
    levels_job,
    optimum_marks,
)
from ckptbench.cadence.levels_scale import STATED_FOOTING, Footing, TierScaling, tier_scaling
from ckptbench.errors import CkptbenchError
from ckptbench.report import levels_figures
from ckptbench.report.table import Column, Grid
from ckptbench.report.tiers import LEVELS
from ckptbench.units import format_duration

if TYPE_CHECKING:  # matplotlib only when a page is drawn: every command imports this module
    from ckptbench.report.figures import Picture


def levels_figure(job: LevelsJob, found: RulesAnswer) -> Any:
    """Efficiency against each level's interval, the optimum starred (a matplotlib figure)."""
    best, alone = found.answer.best, found.answer.last_level_only
    title = (f"{job.gpus} GPUs: {describe(best, job.levels)}\n"
             f"efficiency {100 * best.efficiency:.2f} % ({found.rules} rules; stars: optimum)")
    return levels_figures.interval_curves(
        ml.level_curves(job.levels, found.score, best), optimum_marks(job, best),
        (job.levels[-1].name, alone.schedule.compute_s, alone.efficiency)
        if len(job.levels) > 1 else None, title)


def run_levels(view: dict[str, Any]) -> list[str] | None:
    """The levels a run's tier summaries hold (None: not a tiered run)."""
    found = next((r for r in view.get("tiers", []) if r.get("type") == LEVELS), None)
    return [str(lv) for lv in found["levels"]] if found and found.get("levels") else None


def levels_answer(texts: Sequence[str], preset: str, gpus: int
                  ) -> tuple[LevelsJob, RulesAnswer] | None:
    """The job and the answer under the stated rules for a run's levels (None: `preset`
    has no failure classes with scopes)."""
    if preset not in fc.CLASS_PRESETS:
        return None
    job = levels_job(texts, fc.CLASS_PRESETS[preset][1], gpus, DEFAULT_GPUS_PER_NODE)
    return job, answer(job)


@dataclass(frozen=True)
class Scaled:
    """How a run's levels were brought to the job: the scaling, or why they were not."""

    scaling: TierScaling | None
    why_not: str = ""


def _restarts_needing(job: LevelsJob, level: int) -> str:
    """The restarts of the failures that need `level` (each pays its own)."""
    found = sorted({job.restart_of(c).seconds for c, n in zip(job.classes, job.needs,
                                                              strict=True) if n == level})
    return "-".join(format_duration(s) for s in (found[:1] + found[-1:] if len(found) > 1
                                                  else found)) or "-"


def levels_grid(label: str, preset: str, job: LevelsJob, found: RulesAnswer,
                scaled: Scaled | None = None) -> Grid:
    """One row per level: what it costs (at the run and scaled to the job), what it
    survives, how often it is needed, and its interval at the optimum."""
    result = found.answer
    marks = optimum_marks(job, result.best)
    scaling = scaled.scaling if scaled else None
    at_run = {lv.name: lv for lv in scaling.levels} if scaling else {}
    rows = []
    for k, (lv, scope, rate) in enumerate(zip(job.levels, job.scopes, job.rates, strict=True)):
        run = at_run.get(lv.name)
        measured = (format_duration(run.measured_save_s), format_duration(run.measured_restore_s)
                    ) if run else ("-", "-")
        rows.append((lv.name, measured[0], format_duration(lv.save_s), measured[1],
                     format_duration(lv.restore_s), _restarts_needing(job, k), scope,
                     f"{rate * 86400:.3g}", format_duration(marks[lv.name][0])))
    best, alone = result.best, result.last_level_only
    notes = [f"optimum ({found.rules} rules, docs/cadence.md): {describe(best, job.levels)}: "
             f"efficiency {100 * best.efficiency:.2f} %"]
    if len(job.levels) > 1:
        notes.append(f"{job.levels[-1].name} alone: every "
                     f"{format_duration(alone.schedule.compute_s)}: efficiency "
                     f"{100 * alone.efficiency:.2f} %")
    notes += scaling.lines() if scaling else [
        "the levels as this run measured them, not scaled to the job: "
        + (scaled.why_not if scaled and scaled.why_not else "no scaling asked")]
    notes.append(f"failure classes {preset} at {job.gpus} GPUs; restarts by the default "
                 "mechanisms (`ckptbench levels --tiers-results` to change them).")
    return Grid(f"{label}: multi-level cadence", (
        Column("level", key=True, numeric=False), Column("save", "at run"), Column("save", "job"),
        Column("restore", "at run"), Column("restore", "job"),
        Column("restart", "of the failures needing it"), Column("survives", numeric=False), Column("needed per day"),
        Column("interval at optimum")), tuple(rows), tuple(notes))


@dataclass(frozen=True)
class TierCadence:
    """One tiered run's multi-level cadence: its table, and its figure when drawn."""

    grid: Grid
    job: LevelsJob
    result: RulesAnswer

    def picture(self, name: str) -> Picture:
        from ckptbench.report.figures import Picture, png

        fig = levels_figure(self.job, self.result)
        return Picture(name, "Multi-level cadence", "Efficiency against each level's interval "
                       "(the compute between two of its checkpoints); stars: the optimum "
                       "schedule, the hollow circle: the last level alone.", png(fig))


REPORT_FORCED = ("report shows them and refuses nothing; `ckptbench levels --tiers-results` "
                 "refuses them without --force")


def tier_cadences(views: Sequence[dict[str, Any]], preset: str, gpus: int | None,
                  footing: Footing = STATED_FOOTING) -> list[TierCadence]:
    """The cadence of every tiered run among `views` (none when `preset` has no classes),
    its levels scaled to the job on `footing`, forced (what `levels` refuses is shown as a
    caution: REPORT_FORCED); `gpus`: the job's, or (None) each run's plan's world size."""
    out = []
    for view in views:
        texts = run_levels(view)
        size = gpus or int(view.get("run", {}).get("plan", {}).get("world_size", 0))
        if not texts or size <= 0 or preset not in fc.CLASS_PRESETS:
            continue
        try:
            scaling = tier_scaling(str(view.get("path")), size, DEFAULT_GPUS_PER_NODE,
                                   footing, "results", force=True, forced=REPORT_FORCED)
            scaled = Scaled(scaling)
            texts = scaling.texts()
        except CkptbenchError as exc:
            scaled = Scaled(None, str(exc))
        answer = levels_answer(texts, preset, size)
        if answer is not None:
            label = str(view.get("run", {}).get("run_id") or view.get("path", "run"))
            out.append(TierCadence(levels_grid(label, preset, *answer, scaled), *answer))
    return out
