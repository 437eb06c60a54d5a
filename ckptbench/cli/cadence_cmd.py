"""`ckptbench cadence`: how often to checkpoint, from measurements or given numbers."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from ckptbench import cadence, jobmodel
from ckptbench.cadence.asynchronous import async_note, split_save
from ckptbench.cli.output_file import check_output_path, save_figure
from ckptbench.cli.plan_cmd import restore_layout_options
from ckptbench.errors import SpecError
from ckptbench.plan import Plan, build_plan
from ckptbench.plan.restore import RestorePlan, restore_plan_of
from ckptbench.progress import current, shows_progress
from ckptbench.report import plots
from ckptbench.spec import Workload, load_workload, with_restore_layout
from ckptbench.units import (
    format_bytes,
    format_duration,
    format_rate,
    parse_duration,
    parse_fraction,
    parse_rate,
    parse_size,
)


def _jsonable(value: Any) -> Any:
    """Plain JSON: inf and NaN become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _preset_epilog() -> str:
    lines = [
        "\b",
        "Failure presets (job interruptions per GPU-hour; job MTBF = 1 / (GPUs x rate)):",
    ]
    lines += [
        f"  {p.name:<8} {p.rate_per_gpu_hour:.3g}  {p.citation}"
        for p in cadence.FAILURE_PRESETS.values()
    ]
    lines += [
        "",
        "\b",
        "Examples:",
        "  ckptbench cadence --save-seconds 51 --restore-seconds 129 --mtbf 3.1h",
        "  ckptbench cadence --save-seconds 51 --restore-seconds 129 \\",
        "      --failure-preset llama3 --gpus 16384 --interval 30min --gpu-hour-price 2.5",
        "  ckptbench cadence --results run.jsonl --workload llama3-405b.toml \\",
        "      --gpus 16384 --aggregate-bandwidth 2TB/s --failure-preset rsc1",
        "",
        "See docs/cadence.md for the formulas and their sources.",
    ]
    return "\n".join(lines)


def _measurements(results: tuple[Path, ...], sized: bool) -> list[jobmodel.Measurement]:
    """The runs given with --results (sweep files expanded). Without --workload or
    --checkpoint-size the target is the run's own job, so a file that is not there means
    the target is unknown too: the error says both."""
    missing = next((p for p in results if not p.exists()), None)  # others: the reader says
    if missing is not None and not sized:
        raise SpecError(f"--results needs the target's size: give --workload or --checkpoint-size"
                        f" (--results {missing}: no such file)")
    return jobmodel.read_measurements(results)


def _target_plan(workload_path: str | None, size: str | None,
                 measured: list[jobmodel.Measurement], restore_layout: tuple[int | None, str | None]
                 ) -> tuple[float | None, Workload | None, Plan | None]:
    """Full-size checkpoint bytes of the target job, its workload and plan (if known):
    --workload, --checkpoint-size, or the measured run's own full-size workload (with the
    restore layout it ran). `restore_layout`: --restore-world-size, --restore-layout."""
    if workload_path and size:
        raise SpecError("give either --workload or --checkpoint-size, not both")
    if size:
        if restore_layout != (None, None):
            raise SpecError("--restore-world-size and --restore-layout need the target's plan:"
                            " give --workload (or --results of a run), not --checkpoint-size")
        return parse_size(size, "--checkpoint-size", default_unit="GB"), None, None
    workload = load_workload(workload_path) if workload_path else None
    if workload is None and measured:
        workload = measured[0].workload  # the run's own full-size job
    if workload is None:
        if restore_layout != (None, None):
            raise SpecError("--restore-world-size and --restore-layout need the target's plan:"
                            " give --workload")
        return None, None, None
    workload = with_restore_layout(workload, *restore_layout)
    plan = build_plan(workload)
    return float(plan.total_bytes), workload, plan


def _restart_overhead(text: str) -> float:
    """--restart-overhead: a duration, or 0 (restarts cost nothing beyond the restore)."""
    if re.fullmatch(r"\s*0*\.?0*\s*(ms|s|min|h|d)?\s*", text) and re.search(r"0", text):
        return 0.0
    return parse_duration(text, "--restart-overhead", "s")


def _job_model(measured: list[jobmodel.Measurement], plan: Plan | None,
               checkpoint_bytes: float | None, gpus: int | None, gpus_per_node: int,
               ceiling: float | None, workload_path: str | None, restart: float | None,
               need_restore: bool, force: bool) -> jobmodel.JobEstimate:
    """The whole job's C and R from the run whose ranks per node match the target's."""
    if checkpoint_bytes is None:
        raise SpecError("--results needs the target's size: give --workload or --checkpoint-size")
    if gpus is None:
        raise SpecError("--results needs the target's GPU count: give --gpus or --workload")
    rplan: RestorePlan | None = None
    if plan is not None and need_restore and gpus == plan.world_size:
        rplan = restore_plan_of(plan)  # the job restarting on its restore layout
    target = jobmodel.from_plan(plan, gpus_per_node, gpus, ceiling, workload_path, rplan) \
        if plan is not None else \
        jobmodel.uniform("checkpoint", checkpoint_bytes, gpus, gpus_per_node, ceiling)
    return jobmodel.estimate(
        jobmodel.choose(measured, target.ranks_per_node), target,
        restart_overhead_s=cadence.DEFAULT_RESTART_OVERHEAD_S if restart is None else restart,
        restart_source=cadence.RESTART_OVERHEAD_SOURCE if restart is None else "given",
        need_restore=need_restore, force=force)


@dataclass(frozen=True)
class CadenceArgs:
    """The cadence command's flags, as click parses them."""

    results: tuple[Path, ...]
    workload_path: str | None
    checkpoint_size: str | None
    gpus: int | None
    gpus_per_node: int
    aggregate_bandwidth: str | None
    restore_world_size: int | None
    restore_layout: str | None
    save_seconds: str | None
    restore_seconds: str | None
    restart_overhead: str | None
    blocking_seconds: str | None
    interference: str | None
    mtbf: str | None
    failure_preset: str | None
    components: tuple[str, ...]
    interval: str | None
    gpu_hour_price: float | None
    target_goodput: str
    plot: Path | None
    force: bool
    as_json: bool


@click.command("cadence", epilog=_preset_epilog())
@click.option("--results", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Results file of `ckptbench run` or sweep file of `ckptbench sweep`, scaled to "
                   "the target by the job model; repeatable: the run with the target's ranks "
                   "per node is used.")
@click.option("--workload", "workload_path", metavar="FILE",
              help="Target job's workload (model, layout, world size): checkpoint bytes and GPUs.")
@click.option("--checkpoint-size", metavar="SIZE",
              help="Target checkpoint size instead of --workload, e.g. 5.2TB (bare number: GB).")
@click.option("--gpus", type=int, help="GPUs of the target job [default: the workload's world_size].")
@click.option("--gpus-per-node", type=int, default=8, show_default=True,
              help="GPUs per host: nodes for bandwidth scaling and per-host failure rates.")
@click.option("--aggregate-bandwidth", metavar="BW",
              help="Storage ceiling for the whole job, e.g. 2TB/s (bare number: GB/s). Caps the "
                   "per-node scaling and bounds bytes per interval.")
@restore_layout_options
@click.option("--save-seconds", metavar="DUR",
              help="Save time C (bare number: seconds); overrides the measured one.")
@click.option("--restore-seconds", metavar="DUR",
              help="Restore time (bare number: seconds); overrides the measured one.")
@click.option("--restart-overhead", metavar="DUR",
              help="Relaunch time added to every restore (scheduler, init; bare number: seconds) "
                   f"[default with --results: {cadence.DEFAULT_RESTART_OVERHEAD_S:g} s, see "
                   "docs/cadence.md].")
@click.option("--blocking-seconds", metavar="DUR",
              help="Asynchronous saves: the blocking part; the rest of the save time is the "
                   "persist time, a lower bound on the interval [default: measured by a "
                   "--mode async --results].")
@click.option("--interference", metavar="FRACTION",
              help="Asynchronous saves: how much slower training steps run during the persist "
                   "(0.1 or 10%%); charged to goodput [default: measured by a --mode async "
                   "--results].")
@click.option("--mtbf", metavar="DUR",
              help="Job mean time between interruptions (bare number: hours; inf = none).")
@click.option("--failure-preset", type=str, metavar="NAME",
              help=f"Published failure rate: {', '.join(cadence.FAILURE_PRESETS)} (see below).")
@click.option("--component", "components", multiple=True, metavar="NAME=RATE[:PER_HOST]",
              help="A failure rate per unit-hour; PER_HOST units per host, else one per GPU "
                   "('host'/'node': one per host). Repeatable; adds to --failure-preset.")
@click.option("--interval", metavar="DUR",
              help="Your current checkpoint interval (bare number: minutes).")
@click.option("--gpu-hour-price", type=float, help="Price of a GPU-hour, for the cost per day.")
@click.option("--target-goodput", default="95%", show_default=True,
              help="Inverse question: the save time and bandwidth that reach this goodput.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG of goodput against interval, optimum marked (a new .png file).")
@click.option("--force", is_flag=True,
              help="Proceed where cadence refuses: use a measurement that cannot stand for the "
                   "target (ranks per node, bytes per rank, tiny files, too few samples; its "
                   "warnings are printed with the answer), and replace a file or link at --plot.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@shows_progress("cadence", "reading the results")
def cadence_command(**flags: Any) -> None:
    """Optimal checkpoint interval (Young, Daly, exact) and the goodput it buys.

    C and R come from a results file scaled to the target job by the job model (the
    slowest of its nodes, the storage ceiling, metadata, restart; R for the job restarting
    on its restore layout, read by its DCP restore plan), or are given directly; the job
    MTBF is given, or computed from a preset or component rates.
    """
    a = CadenceArgs(**flags)
    gpus = a.gpus
    if a.plot is not None:
        check_output_path(a.plot, "--plot", ".png", a.force, a.results)
    if gpus is not None and gpus < 1:
        raise SpecError(f"--gpus = {gpus} must be an integer >= 1")
    if a.gpus_per_node < 1:
        raise SpecError(f"--gpus-per-node = {a.gpus_per_node} must be an integer >= 1")
    if a.gpu_hour_price is not None and not (a.gpu_hour_price >= 0 and math.isfinite(a.gpu_hour_price)):
        raise SpecError(f"--gpu-hour-price = {a.gpu_hour_price} must be >= 0")
    target = parse_fraction(a.target_goodput, "--target-goodput")
    measured = _measurements(a.results, bool(a.workload_path or a.checkpoint_size)) if a.results else []
    checkpoint_bytes, workload, plan = _target_plan(a.workload_path, a.checkpoint_size, measured,
                                                    (a.restore_world_size, a.restore_layout))
    if gpus is None and workload is not None:
        gpus = workload.parallel.world_size
    ceiling = parse_rate(a.aggregate_bandwidth, "--aggregate-bandwidth") \
        if a.aggregate_bandwidth else None
    restart = _restart_overhead(a.restart_overhead) if a.restart_overhead else None

    job = None
    if measured and (a.save_seconds is None or a.restore_seconds is None):
        current().phase("modelling the job")
        job = _job_model(measured, plan, checkpoint_bytes, gpus, a.gpus_per_node, ceiling,
                         a.workload_path, restart, need_restore=a.restore_seconds is None,
                         force=a.force)
    save_s = parse_duration(a.save_seconds, "--save-seconds", "s") if a.save_seconds else (
        job.save_s if job else None)
    restore_s = parse_duration(a.restore_seconds, "--restore-seconds", "s") + (restart or 0.0) \
        if a.restore_seconds else (job.restore_s if job else None)
    if save_s is None or restore_s is None:
        missing = "--save-seconds" if save_s is None else "--restore-seconds"
        raise SpecError(f"{missing} is required (or --results with measurements)")
    per_gpu = checkpoint_bytes / gpus if checkpoint_bytes and gpus else None
    split = split_save(save_s, _asynchronous_run(job, measured), a.blocking_seconds,
                       a.interference, per_gpu)
    cost = cadence.CheckpointCost(split.save_s, restore_s, split.persist_s, split.interference)

    current().phase("finding the interval")
    model = cadence.failure_model(
        mtbf_s=parse_duration(a.mtbf, "--mtbf", "h", allow_inf=True) if a.mtbf else None,
        preset=a.failure_preset,
        components=[cadence.parse_component(c) for c in a.components],
        gpus=gpus,
        gpus_per_host=a.gpus_per_node,
    )
    report = cadence.analyze(
        cost, model.mtbf_s, gpus=gpus,
        current_interval_s=parse_duration(a.interval, "--interval", "min") if a.interval else None,
        gpu_hour_price=a.gpu_hour_price, checkpoint_bytes=checkpoint_bytes,
        storage_bandwidth=ceiling,
    )
    max_save = cadence.required_save_seconds(target, restore_s, model.mtbf_s)
    inverse = {
        "goodput": target,
        "gpus": gpus,
        "max_save_s": max_save,
        "save_bandwidth_bytes_per_s": (
            checkpoint_bytes / max_save if checkpoint_bytes and max_save else None
        ),
    }
    if a.plot is not None:
        _plot(a.plot, report, a.force)
    if a.as_json:
        payload = {
            "cost": asdict(cost),
            "mtbf_s": model.mtbf_s,
            "mtbf_source": model.source,
            "gpus": gpus,
            "checkpoint_bytes": checkpoint_bytes,
            "job_model": None if job is None else {
                **job.to_dict(), "measurements": [m.path for m in measured]},
            "async": None if split.measured is None else asdict(split.measured),
            "failures_per_day": report.failures_per_day,
            "floor_s": report.floor_s,
            "floor_reason": report.floor_reason,
            "points": [asdict(p) for p in report.points],
            "recommended": asdict(report.recommended),
            "target": inverse,
            "plot": str(a.plot) if a.plot else None,
        }
        click.echo(json.dumps(_jsonable(payload), indent=2))
        return
    note = async_note(cost, split.measured, per_gpu)
    _print_table(report, model, job, checkpoint_bytes, inverse, a.gpu_hour_price, a.plot, note)


def _asynchronous_run(job: jobmodel.JobEstimate | None, measured: list[jobmodel.Measurement]
                      ) -> jobmodel.AsyncMeasurement | None:
    """The --mode async measurement the answer uses: the job model's run's, else (save
    and restore both given) the first run that has one."""
    if job is not None:
        return job.measurement.asynchronous
    return next((m.asynchronous for m in measured if m.asynchronous is not None), None)


def _print_table(report: cadence.CadenceReport, model: cadence.FailureModel,
                 job: jobmodel.JobEstimate | None, checkpoint_bytes: float | None,
                 inverse: dict[str, Any], price: float | None, plot: Path | None,
                 note: str = "") -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:  # pipes and files: do not squeeze the table into 80 columns
        console.width = max(console.width, 100)
    cost = report.cost
    mtbf_text = "infinite" if math.isinf(report.mtbf_s) else format_duration(report.mtbf_s)
    console.print(f"MTBF {mtbf_text} ({model.source});"
                  f" {report.failures_per_day:.3g} failures/day")
    console.print(cost.describe() + note, soft_wrap=True, markup=False)
    if job is not None:
        _print_job_model(console, job)
    if checkpoint_bytes:
        console.print(f"checkpoint size {format_bytes(checkpoint_bytes)}")

    table = Table(box=box.SIMPLE_HEAD, caption=None if price is None else f"cost at {price:g} per GPU-hour")
    table.add_column("choice", no_wrap=True)
    for header in ("interval", "goodput", "saving", "failures", "GPU-h lost/d"):
        table.add_column(header, justify="right", no_wrap=True)
    if price is not None:
        table.add_column("cost/day", justify="right", no_wrap=True)
    for p in report.points:
        row = [
            p.label + (" *" if p is report.recommended else ""),
            format_duration(p.interval_s),
            f"{100 * p.goodput:.2f} %",
            f"{100 * p.save_fraction:.2f} %",
            f"{100 * p.failure_fraction:.2f} %",
            "-" if p.gpu_hours_lost_per_day is None else f"{p.gpu_hours_lost_per_day:,.0f}",
        ]
        if price is not None:
            row.append("-" if p.cost_per_day is None else f"{p.cost_per_day:,.0f}")
        table.add_row(*row)
    console.print(table)
    best = report.recommended
    if math.isinf(report.mtbf_s):
        console.print("* no failures: any interval works, each save costs only its own time")
    else:
        floor = f" (raised to the floor: {report.floor_reason})" if best is not report.exact else ""
        console.print(f"* checkpoint every {format_duration(best.interval_s)}{floor};"
                      f" a failure costs {format_duration(best.loss_per_failure_s)} on average")
    goal = f"{100 * inverse['goodput']:.3g} % goodput"
    at = f" at {inverse['gpus']} GPUs" if inverse["gpus"] else ""
    if inverse["max_save_s"] is None:
        console.print(f"{goal}{at} is out of reach: restarts alone cap it below that")
    elif math.isinf(inverse["max_save_s"]):
        console.print(f"{goal}{at}: any save time will do when nothing fails")
    else:
        need = f"{goal}{at} needs saves of at most {inverse['max_save_s']:.3g} s (synchronous)"
        if inverse["save_bandwidth_bytes_per_s"]:
            need += f", i.e. {format_rate(inverse['save_bandwidth_bytes_per_s'])} of save bandwidth"
        console.print(need)
    if plot is not None:
        console.print(f"plot written to {plot}")


def _print_job_model(console: Any, job: jobmodel.JobEstimate) -> None:
    """The job model's inputs, its steps for save and restore, assumptions and warnings."""
    m, t = job.measurement, job.target
    size = format_bytes

    def say(text: str) -> None:  # long lines stay whole (logs, grep); no rich markup
        console.print(text, markup=False, soft_wrap=True)

    say(f"job model: {t.name}, {t.gpus:,} GPUs = {t.nodes:,} nodes x {t.ranks_per_node}"
                  f" ranks, {size(t.total_bytes)}, {size(t.bytes_per_rank)} per rank")
    say(f"  measured ({m.path}): {len(m.ranks)} ranks on {m.nodes} node(s),"
                  f" {m.ranks_per_node} per node, {size(m.bytes_per_rank)} per rank, scale"
                  f" {m.scale}, {m.save.iterations} iteration(s)")
    for measured in (m.save, m.restore):
        if measured is not None and measured.headline:
            say(f"    {measured.headline}")
    for p in (job.save, job.restore):
        if p is None:
            continue
        nodes = (t.for_restore if p.phase == "restore" else t).nodes
        line = (f"  {p.phase}: per node, data only {format_rate(p.node_bandwidth)} (geometric"
                f" mean, sigma {p.spread_sigma:.3g}, {p.samples} node samples); median node"
                f" {p.median_node_s:.3g} s, slowest of {nodes:,} nodes {p.slowest_node_s:.3g} s")
        if p.ceiling_s is not None:
            line += f", ceiling {p.ceiling_s:.3g} s" + (" (binding)" if p.capped else "")
        line += "".join(f" + {k} {v:.3g} s" for k, v in p.parts.items()) if p.parts else \
            f" + metadata {p.metadata_s:.3g} s"
        if p.phase == "restore":
            line += f" + restart {job.restart_overhead_s:.3g} s = {job.restore_s:.3g} s"
        else:
            line += f" = {p.total_s:.3g} s"
        say(line)
    say("  modelled vs measured (each part's kind; modelled ones say where their figure comes"
        " from):")
    for text in job.describe_shares():
        say(f"    {text}")
    say("  assumptions:")
    for text in job.assumptions():
        say(f"    - {text}")
    if job.warnings:
        say("  warnings (used anyway: --force):")
        for w in job.warnings:
            say(f"    ! {w.message}" + (f"; measure it with: {w.command}" if w.command else ""))


def _plot(path: Path, report: cadence.CadenceReport, force: bool) -> None:
    """Goodput against interval, the optimum and the user's interval marked; written to a
    new file (or, with `force`, replacing what is at `path`)."""
    marks = [(f"{p.label}: {format_duration(p.interval_s)}, {100 * p.goodput:.1f} %",
              p.interval_s, p.goodput, style)
             for p, style in ((report.recommended, "r*"), (report.current, "ko"))
             if p is not None and math.isfinite(p.interval_s)]
    title = f"MTBF {format_duration(report.mtbf_s)}\n{report.cost.describe()}"
    save_figure(plots.goodput_figure(cadence.plotted_curve(report), marks, report.floor_s,
                                     title), path, force)


COMMANDS: list[click.Command] = [cadence_command]
