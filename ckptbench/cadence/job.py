"""What the job will see, from one results file: the run's full-size workload (in the
run record) as the target, the job model's C and R by part, and the interval and
goodput the cadence model gives them under a published failure rate (a preset).

The report shows it beside what was measured (``report --failure-preset``); the same
steps as ``cadence --results`` with the run's own workload, no options to learn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptbench.cadence.answer import (
    DEFAULT_RESTART_OVERHEAD_S,
    RESTART_OVERHEAD_SOURCE,
    CadenceReport,
    CheckpointCost,
    analyze,
)
from ckptbench.cadence.failures import FAILURE_PRESETS, failure_model
from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.jobmodel import (
    AsyncMeasurement,
    JobEstimate,
    PhaseEstimate,
    Target,
    estimate,
    from_plan,
)
from ckptbench.jobmodel.measured import Measurement, read_results
from ckptbench.jobmodel.model import MODELLED
from ckptbench.report.table import Column, Grid
from ckptbench.spec import Workload
from ckptbench.units import format_duration, format_size

DEFAULT_GPUS_PER_NODE = 8  # as `cadence --gpus-per-node`


def split_measured(save_s: float, measured: AsyncMeasurement | None,
                   bytes_per_gpu: float | None) -> tuple[float, float, float]:
    """(blocking C, persist L, interference) of a save of `save_s`: an async run's blocking
    time, scaled to the job's bytes per GPU, is C and the rest of the save the persist;
    its interference below 0 is noise (0). A sync run: (save_s, 0, 0)."""
    if measured is None or not bytes_per_gpu:
        return save_s, 0.0, 0.0
    blocking = min(save_s, measured.blocking_for(bytes_per_gpu))
    return blocking, save_s - blocking, max(0.0, measured.interference or 0.0)


@dataclass(frozen=True)
class JobAnswer:
    """One run's answer for its full-size job."""

    path: str
    workload: str
    gpus: int
    checkpoint_bytes: float
    mtbf_source: str
    job: JobEstimate
    cadence: CadenceReport

    def to_dict(self) -> dict[str, Any]:
        """The answer as ``report --json`` prints it."""
        c, rec, restore = self.cadence.cost, self.cadence.recommended, self.job.restore
        return {"workload": self.workload, "gpus": self.gpus,
                "checkpoint_bytes": self.checkpoint_bytes, "save_s": c.save_s,
                "save_parts_s": _parts(self.job.save), "restore_s": c.restore_s,
                "restore_parts_s": {**(_parts(restore) if restore else {}),
                                    "restart": self.job.restart_overhead_s},
                "persist_s": c.persist_s, "interference": c.interference,
                "mtbf_s": self.cadence.mtbf_s, "mtbf_source": self.mtbf_source,
                "interval_s": rec.interval_s, "goodput": rec.goodput,
                "shares": self.job.share_totals(),
                "warnings": [w.message for w in self.job.warnings]}

    def modelled(self) -> str:
        """The modelled share of C and of R, in a cell."""
        out = []
        for phase, kinds in self.job.share_totals().items():
            total = sum(kinds.values())
            out.append(f"{'C' if phase == 'save' else 'R'} "
                       f"{100 * kinds[MODELLED] / total if total else 0:.0f} %")
        return ", ".join(out)


def _parts(p: PhaseEstimate) -> dict[str, float]:
    """A phase's seconds by part: the data (slowest node or storage ceiling), then what
    the job pays once (the metadata; by name where the run recorded named parts)."""
    once = p.parts or {"metadata": p.metadata_s}
    return {"data": p.data_s, **once}


def job_target(workload: Workload, gpus: int | None, gpus_per_node: int) -> Target:
    """The full-size job of `workload` at `gpus` (default its world size): its plan's
    bytes per node and, at its own world size, its restore plan (R for the job restarting
    on its restore layout, read by its DCP plan, as `cadence` does)."""
    from ckptbench.plan import build_plan
    from ckptbench.plan.restore import restore_plan_of

    plan = build_plan(workload)
    n = gpus or plan.world_size
    rplan = restore_plan_of(plan) if n == plan.world_size else None
    return from_plan(plan, gpus_per_node, n, restore_plan=rplan)


def run_job(m: Measurement, gpus: int | None, gpus_per_node: int,
            workload: Workload | None = None) -> JobEstimate:
    """The job model's estimate for `workload`'s job, by default the full-size job the run
    was measured for, forced (cautions travel with it); R adds cadence's default restart
    (``restore.total_s``: the restore alone). SpecError when there is no workload."""
    workload = workload or m.workload
    if workload is None:
        raise SpecError(f"results {m.path}: the run record has no full-size workload "
                        "(written by an older ckptbench)")
    return estimate(m, job_target(workload, gpus, gpus_per_node),
                    restart_overhead_s=DEFAULT_RESTART_OVERHEAD_S,
                    restart_source=RESTART_OVERHEAD_SOURCE, force=True, source="results")


def job_answer(path: str | Path, preset: str, gpus: int | None = None,
               gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> JobAnswer:
    """The answer for the job `path`'s run was measured for (SpecError, one line, when
    the results cannot give one: no workload recorded, no restore, ...)."""
    if preset not in FAILURE_PRESETS:
        raise SpecError(f"--failure-preset {preset!r} is not known; allowed: "
                        f"{', '.join(FAILURE_PRESETS)}")
    m = read_results(path, "results")
    job = run_job(m, gpus, gpus_per_node)
    n, plan_bytes = job.target.gpus, job.target.total_bytes
    assert job.restore_s is not None  # estimate refuses a run without restores
    save, persist, interference = split_measured(job.save_s, m.asynchronous, plan_bytes / n)
    cost = CheckpointCost(save, job.restore_s, persist, interference)
    model = failure_model(preset=preset, gpus=n, gpus_per_host=gpus_per_node)
    report = analyze(cost, model.mtbf_s, gpus=n, checkpoint_bytes=plan_bytes)
    return JobAnswer(str(path), m.workload_name, n, plan_bytes, model.source, job, report)


def _by_part(parts: dict[str, float], extra: dict[str, float] | None = None) -> str:
    items = {**parts, **(extra or {})}
    return ", ".join(f"{k} {v:.3g}" for k, v in items.items())


def job_grid(answers: list[JobAnswer | str]) -> Grid:
    """One row per run (#1, #2, ... as in the summary): the job, C and R by part, the
    persist, the recommended interval and its goodput; a run without an answer is a
    note saying why."""
    several = len(answers) > 1
    names = [f"#{i}" for i in range(1, len(answers) + 1)] if several else [""]
    rows, notes = [], []
    for name, a in zip(names, answers, strict=True):
        lead = (name,) if several else ()
        if isinstance(a, str):
            notes.append(f"{name + ': ' if name else ''}no job answer: {a}")
            continue
        c, job, rec = a.cadence.cost, a.job, a.cadence.recommended
        restore = job.restore
        assert restore is not None
        rows.append((
            *lead, a.workload, str(a.gpus), format_size(a.checkpoint_bytes), f"{c.save_s:.3g}",
            _by_part(_parts(job.save)), f"{c.restore_s:.3g}",
            _by_part(_parts(restore), {"restart": job.restart_overhead_s}),
            a.modelled(), f"{c.persist_s:.3g}", format_duration(a.cadence.mtbf_s),
            format_duration(rec.interval_s), f"{100 * rec.goodput:.2f} %"))
        notes += [f"{name + ': ' if name else ''}measured vs modelled: {text}"
                  for text in job.describe_shares()]
        notes += [f"{name + ': ' if name else ''}caution: {w.message}" for w in job.warnings]
    cols = ([Column("run", key=True, numeric=False)] if several else []) + [
        Column("job", numeric=False), Column("GPUs"), Column("checkpoint"),
        Column("C s", "save"), Column("C by part, s", numeric=False), Column("R s", "restore"),
        Column("R by part, s", numeric=False), Column("modelled", numeric=False),
        Column("persist s", "async"),
        Column("MTBF"), Column("interval", "best"), Column("goodput")]
    sources = sorted({a.mtbf_source for a in answers if not isinstance(a, str)})
    notes.append("Each run's own full-size workload as the job, by the job model (the slowest "
                 "of its nodes from the measured spread; what is paid once as measured; R adds "
                 f"a restart of {DEFAULT_RESTART_OVERHEAD_S:g} s, cadence's default, "
                 "docs/cadence.md); "
                 "C: the blocking save (async: the snapshot, the rest is the persist, charged "
                 "with its interference); interval: the optimum of the cadence model, raised "
                 "to the persist; goodput: the share of time that trains at that interval. "
                 f"Failures: {'; '.join(sources) or 'none'}.")
    return Grid("what the job will see", tuple(cols), tuple(rows), tuple(notes))


def job_answers(paths: list[str], preset: str, gpus: int | None = None
                ) -> list[JobAnswer | str]:
    """Each results file's answer, or the one line saying why it has none."""
    out: list[JobAnswer | str] = []
    for p in paths:
        try:
            out.append(job_answer(p, preset, gpus))
        except CkptbenchError as exc:
            out.append(str(exc))
    return out
