"""`ckptbench levels` and `ckptbench simulate`: the multi-level cadence (node memory,
peers, storage) against failure classes that each take some copies with them, in closed
form and simulated."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ckptbench.cadence import classes as fc
from ckptbench.cadence import multilevel as ml
from ckptbench.cadence import restart as rs
from ckptbench.cadence.levels_job import LevelsJob, Restarts, describe, levels_job
from ckptbench.cadence.levels_report import levels_figure
from ckptbench.cadence.levels_scale import (
    NODE_NETWORK_BPS,
    NODE_NETWORK_SOURCE,
    TierScaling,
    parse_network,
    tier_scaling,
)
from ckptbench.cli.output_file import check_output_path, save_figure
from ckptbench.errors import SpecError
from ckptbench.progress import current, shows_progress
from ckptbench.records import read_records
from ckptbench.report import levels_figures
from ckptbench.report.tiers import measured_levels
from ckptbench.simulate import Failures, simulate
from ckptbench.spec import load_workload
from ckptbench.units import format_duration


def _job(options: dict[str, Any]) -> tuple[LevelsJob, TierScaling | None]:
    if options["plot"] is not None:  # before any work
        check_output_path(options["plot"], "--plot", ".png", options["force"])
    texts, scaling = _level_texts(options)
    classes = fc.classes_from(options["preset"], [fc.parse_class(t)
                                                  for t in options["class_texts"]])
    measured = options["measured_start"]
    mechanisms = rs.with_overrides(options["part_texts"], rs.MECHANISMS if measured is None
                                   else rs.with_measured_start(_startup(measured), measured))
    return levels_job(texts, classes, options["gpus"], options["gpus_per_node"],
                      Restarts(mechanisms, rs.by_scope(options["restart_texts"])),
                      options["schedule_text"]), scaling


def _level_texts(options: dict[str, Any]) -> tuple[list[str], TierScaling | None]:
    """The levels given, or a tiered run's, scaled to the job (or at the run's size)."""
    texts, path = list(options["level_texts"]), options["tiers_results"]
    network, at_run, workload = (options["node_network"], options["at_run_size"],
                                 options["workload"])
    if path is None or at_run:
        for given, flag in ((network is not None, "--node-network"),
                            (at_run and path is None, "--at-run-size"),
                            (workload is not None, "--workload")):
            if given:
                raise SpecError(f"{flag}: allowed only with --tiers-results and without "
                                "--at-run-size (it is how a tiered run's levels are scaled "
                                "to the job)")
    if path is None:
        if not texts:
            raise SpecError("--level is required (NAME:SAVE:RESTORE:SCOPE, repeatable), or "
                            "--tiers-results RUN.jsonl of a `ckptbench run --tiers`")
        return texts, None
    if texts:
        raise SpecError("--tiers-results and --level: allowed: one of them (the levels "
                        "measured, or the levels given)")
    if at_run:
        return measured_levels(path), None
    if options["gpus"] < 1 or options["gpus_per_node"] < 1:
        raise SpecError("--gpus and --gpus-per-node must be integers >= 1")
    rate = parse_network(network) if network is not None else NODE_NETWORK_BPS
    scaling = tier_scaling(path, options["gpus"], options["gpus_per_node"], rate,
                           NODE_NETWORK_SOURCE if network is None else f"--node-network {network}",
                           workload=load_workload(workload) if workload else None)
    return scaling.texts(), scaling


def _startup(path: str) -> dict[str, Any]:
    """The startup record of a run's results file (runner.startup)."""
    found = next((r for r in read_records(path) if r.get("type") == "startup"), None)
    if found is None:
        raise SpecError(f"--measured-start {path}: no startup record; allowed: a results file "
                        "of `ckptbench run` (this version or later)")
    return found


_EXAMPLE = ("--level memory:3s:30s:process --level peer:5s:90s:node \\\n"
            "      --level storage:60s:15min:job --failure-classes llama3 --gpus 16384")
_PRESETS = ["\b", "Failure class presets:"] + [
    f"  {name:<8} {source}" for name, (source, _) in fc.CLASS_PRESETS.items()]


def _epilog(command: str) -> str:
    return "\n".join([*_PRESETS, "", "\b", "Example:", f"  ckptbench {command} {_EXAMPLE}", "",
                      "See docs/cadence.md (multi-level cadence and simulation)."])


def _job_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options both commands take (declared once)."""
    for option in reversed([
        click.option("--tiers-results", type=click.Path(dir_okay=False), default=None,
                     metavar="RUN.jsonl",
                     help="The levels a `run --tiers` measured (memory, peer, storage), "
                          "scaled to the job (its workload at --gpus, --gpus-per-node; "
                          "docs/cadence.md), instead of --level."),
        click.option("--node-network", metavar="BW|measured", default=None,
                     help="With --tiers-results: a node's network bandwidth, for the peer tier "
                          "scaled to the job (400Gb/s, 3.2Tb/s, 50GB/s; a lowercase b: bits; "
                          "measured: the run's own transport) [default: 400Gb/s, a node's host "
                          "network in NVIDIA's HGX reference architecture; docs/cadence.md]."),
        click.option("--workload", metavar="FILE.toml", default=None,
                     help="With --tiers-results: the job's workload, its plan at --gpus giving "
                          "the bytes per node the levels are scaled to [default: the run's own "
                          "full-size workload]."),
        click.option("--at-run-size", is_flag=True,
                     help="With --tiers-results: the levels as the run measured them, not "
                          "scaled to the job."),
        click.option("--level", "level_texts", multiple=True,
                     metavar="NAME:SAVE:RESTORE:SCOPE",
                     help="A checkpoint level, cheapest first: blocking save and restore time "
                          "(bare number: seconds) and the widest failure scope its copy survives"
                          f" ({', '.join(fc.SCOPES)}). Repeatable."),
        click.option("--failure-classes", "preset", metavar="PRESET|FILE.toml",
                     help=f"Failure classes with their scopes: {', '.join(fc.CLASS_PRESETS)}, "
                          "or a TOML file of [[class]] tables (name, scope, rate per unit-hour, "
                          "unit)."),
        click.option("--failure-class", "class_texts", multiple=True,
                     metavar="NAME:SCOPE:RATE[:UNIT]",
                     help="A failure class: its scope, rate per unit-hour, unit gpu|host|job "
                          "(default gpu). Repeatable; adds to --failure-classes."),
        click.option("--gpus", type=int, required=True, help="GPUs of the job."),
        click.option("--gpus-per-node", type=int, default=8, show_default=True,
                     help="GPUs per host, for per-host failure rates."),
        click.option("--schedule", "schedule_text", metavar="DUR[:V1,...]",
                     help="A schedule: compute between checkpoints (bare number: minutes) and, "
                          "per level below the top, its checkpoints before the next level's."),
        click.option("--restart", "restart_texts", multiple=True, metavar="SCOPE=MECHANISM",
                     help="How the job restarts after a failure of a scope: "
                          f"{', '.join(rs.MECHANISMS)} [default: "
                          + ", ".join(f"{k}={v}" for k, v in rs.DEFAULT_BY_SCOPE.items())
                          + "]. Repeatable."),
        click.option("--measured-start", "measured_start", metavar="RESULTS.jsonl",
                     help="Set the start part of the relaunches (warm-spare, replacement) to "
                          "what a run measured: process start and imports plus its ranks' "
                          "set-up (CUDA and NCCL initialisation not included); "
                          "--restart-part still overrides it."),
        click.option("--restart-part", "part_texts", multiple=True, metavar="MECHANISM.PART=DUR",
                     help=f"A part of a restart mechanism ({', '.join(rs.PARTS)}), e.g. "
                          "warm-spare.reschedule=2min. Repeatable."),
        click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
                     help="Write a PNG (a new .png file): levels: efficiency against each "
                          "level's interval, optimum marked; simulate: the goodput histogram."),
        click.option("--force", is_flag=True, help="Replace a file or link at --plot."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text."),
    ]):
        func = option(func)
    return func


def _scaling_json(scaling: TierScaling | None) -> dict[str, Any]:
    return {} if scaling is None else {"scaling": scaling.to_dict()}


def _print_levels(job: LevelsJob, scaling: TierScaling | None) -> None:
    for level, scope, rate, restart in zip(job.levels, job.scopes, job.rates, job.restart_s,
                                           strict=True):
        persist = "" if not level.persist_s else (
            f" + persist {format_duration(level.persist_s)}"
            + (f" at {100 * level.interference:.3g} % slower steps" if level.interference else ""))
        click.echo(f"{level.name:<10} save {format_duration(level.save_s):>8}{persist}  restart + "
                   f"restore {format_duration(level.restore_s):>8} (restart "
                   f"{format_duration(restart)})  survives {scope:<7}  "
                   f"{rate * 86400:8.3g} failures/day need it")
    used = dict.fromkeys(job.chosen[c.scope] for c in job.classes)
    for name in used:
        m = job.mechanisms[name]
        scopes = ", ".join(s for s, n in job.chosen.items() if n == name)
        parts = ", ".join(f"{p} {format_duration(v)}" for p, v in m.parts().items())
        click.echo(f"restart {name} ({scopes}): {format_duration(m.seconds)} = {parts}")
    for line in scaling.lines() if scaling is not None else ():
        click.echo(line)


def _restarts_json(job: LevelsJob) -> dict[str, Any]:
    used = dict.fromkeys(job.chosen[c.scope] for c in job.classes)
    return {"restart_s_per_level": list(job.restart_s), "by_scope": job.chosen,
            "mechanisms": {n: {**job.mechanisms[n].parts(), "seconds": job.mechanisms[n].seconds,
                               "source": job.mechanisms[n].source} for n in used}}


@click.command("levels", epilog=_epilog("levels"))
@_job_options
@shows_progress("levels", "finding the optimum")
def levels_command(**options: Any) -> None:
    """Multi-level checkpoint cadence (LLNL SCR's model): the schedule that maximizes
    efficiency when cheap copies survive some failures and storage survives all."""
    job, scaling = _job(options)
    result = ml.answer(job.levels, job.rates, job.schedule, job.alone)
    if options["plot"] is not None:
        _plot_levels(options["plot"], options["force"], job, result)
    if options["as_json"]:
        click.echo(json.dumps({"gpus": job.gpus, **result.to_dict(),
                               "restarts": _restarts_json(job), **_scaling_json(scaling)},
                               indent=2))
        return
    _print_levels(job, scaling)
    best, alone = result.best, result.last_level_only
    click.echo(f"optimum: {describe(best, job.levels)} -> efficiency "
               f"{100 * best.efficiency:.2f} %")
    if len(job.levels) > 1:
        click.echo(f"{job.levels[-1].name} alone: every {format_duration(alone.schedule.compute_s)}"
                   f" -> efficiency {100 * alone.efficiency:.2f} %")
    if result.named is not None:
        click.echo(f"your schedule: {describe(result.named, job.levels)} -> efficiency "
                   f"{100 * result.named.efficiency:.2f} %")


def _plot_levels(path: Path, force: bool, job: LevelsJob, result: ml.LevelsAnswer) -> None:
    save_figure(levels_figure(job, result), path, force)


NODE_LOSING_SCOPES = ("node", "group")


def _fewer_nodes(text: str | None) -> tuple[float, float]:
    if text is None:
        return 0.0, 1.0
    share_text, _, factor_text = text.partition(":")
    try:
        share, factor = float(share_text), float(factor_text)
    except ValueError:
        share = factor = math.nan
    if not (0.0 <= share <= 1.0 and 1.0 <= factor < math.inf):
        raise SpecError(f"--fewer-nodes {text!r}: allowed: SHARE:FACTOR with SHARE from 0 to 1 "
                        "and FACTOR at least 1, e.g. 0.3:1.865")
    return share, factor


@click.command("simulate", epilog=_epilog("simulate"))
@_job_options
@click.option("--days", type=float, default=54.0, show_default=True,
              help="Length of the run (Llama 3's: 54 days).")
@click.option("--replicas", type=int, default=1000, show_default=True,
              help="Runs simulated (goodput mean and spread over them).")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option("--weibull-shape", type=float, default=1.0, show_default=True,
              help="Shape of the time between failures of each class (1: exponential; < 1: "
                   "failures cluster).")
@click.option("--fewer-nodes", "fewer_text", metavar="SHARE:FACTOR",
              help="Restarts onto fewer nodes: the SHARE (0-1) of node and group failures "
                   "that find no spare restart on the nodes left and read a resharded restore "
                   "plan, FACTOR times as long as the level's own restore (the plan's "
                   "amplification: `ckptbench restore --restore-world-size` measures it).")
@shows_progress("simulate", "finding the optimum")
def simulate_command(**options: Any) -> None:
    """Simulate the whole run under a schedule (default: the optimum of `ckptbench levels`):
    goodput over replicas and the time lost by cause and by failure class."""
    job, scaling = _job(options)
    schedule = job.schedule or ml.optimum(job.levels, job.rates).schedule
    needs = fc.assign(job.scopes, job.classes)
    share, factor = _fewer_nodes(options["fewer_text"])
    failures = [Failures(c.name, c.per_second(job.gpus, job.gpus_per_node), level,
                         share if c.scope in NODE_LOSING_SCOPES else 0.0)
                for c, level in zip(job.classes, needs, strict=True)]
    # the copy's restore (the level's restore less its restart) takes FACTOR times as long
    extra = [(factor - 1.0) * (lv.restore_s - r) for lv, r in zip(job.levels, job.restart_s,
                                                                   strict=True)]
    current().phase(f"simulating {options['replicas']} runs of {options['days']:g} days")
    run = simulate(job.levels, failures, schedule, options["days"] * 86400.0,
                   options["replicas"], options["seed"], options["weibull_shape"],
                   reshard_extra_s=extra)
    if options["plot"] is not None:
        title = (f"{run.replicas} runs of {options['days']:g} days, {job.gpus} GPUs\n"
                 f"{describe(schedule, job.levels)}")
        save_figure(levels_figures.goodput_histogram(run.goodput, run.analytic, title),
                    options["plot"], options["force"])
    if options["as_json"]:
        click.echo(json.dumps({"gpus": job.gpus, "schedule": {
            "compute_s": schedule.compute_s, "counts": list(schedule.counts)},
            **run.to_dict(), "restarts": _restarts_json(job), **_scaling_json(scaling)},
            indent=2))
        return
    _print_levels(job, scaling)
    click.echo(f"schedule: {describe(schedule, job.levels)}")
    click.echo(f"goodput over {run.replicas} runs of {options['days']:g} days: mean "
               f"{100 * run.mean:.2f} % (99 % CI +-{100 * run.ci99:.2f}), p5 "
               f"{100 * run.percentile(5):.2f} %, p95 {100 * run.percentile(95):.2f} %"
               + ("" if run.analytic is None else
                  f"; the model's efficiency {100 * run.analytic:.2f} %"))
    click.echo(f"time lost: saves {100 * run.blocking:.2f} %, work redone "
               f"{100 * run.rework:.2f} %, restores {100 * run.restore:.2f} %; "
               f"{run.failures_per_replica:.1f} failures per run")
    worst = sorted(run.by_class.items(), key=lambda kv: -kv[1])[:5]
    click.echo("lost by class: " + ", ".join(f"{name} {100 * share:.2f} %"
                                              for name, share in worst if share > 0))


COMMANDS = [levels_command, simulate_command]
