"""`ckptbench levels` and `ckptbench simulate`: the multi-level cadence (node memory,
peers, storage) against failure classes that each take some copies with them, in closed
form and simulated."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from ckptbench.cadence import classes as fc
from ckptbench.cadence import levels_job as lv_job
from ckptbench.cadence import levels_plan as lv_plan
from ckptbench.cadence import restart as rs
from ckptbench.cadence import scoped
from ckptbench.cadence.formulas import positive
from ckptbench.cadence.levels_job import LevelsJob, Restarts, describe, levels_job
from ckptbench.cadence.levels_report import levels_figure
from ckptbench.cadence.levels_scale import TierScaling, parse_footing, tier_scaling
from ckptbench.cli.footing_options import footing_option_list
from ckptbench.cli.output_file import check_output_path, save_figure
from ckptbench.errors import SpecError
from ckptbench.progress import current, shows_progress
from ckptbench.records import read_records
from ckptbench.report import levels_figures
from ckptbench.report.tiers import measured_levels
from ckptbench.simulate import Failures, Topology, simulate
from ckptbench.spec import load_workload
from ckptbench.units import (
    format_bytes,
    format_duration,
    format_rate,
    parse_duration,
    parse_rate,
    parse_size,
)


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
    footing, memory = options["footing"], options["node_memory_bandwidth"]
    if path is None or at_run:
        for given, flag in ((footing is not None, "--footing"),
                            (memory is not None, "--node-memory-bandwidth"),
                            (network is not None, "--node-network"),
                            (at_run and path is None, "--at-run-size"),
                            (workload is not None, "--workload"),
                            (options["aggregate_bandwidth"] is not None,
                             "--aggregate-bandwidth")):
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
    scaling = tier_scaling(path, options["gpus"], options["gpus_per_node"],
                           parse_footing(footing, memory, network),
                           workload=load_workload(workload) if workload else None,
                           workload_path=workload, force=options["force"],
                           ceiling=None if options["aggregate_bandwidth"] is None else parse_rate(
                               options["aggregate_bandwidth"], "--aggregate-bandwidth"))
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
        *footing_option_list("With --tiers-results"),
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
        click.option("--force", is_flag=True,
                     help="Replace a file or link at --plot; with --tiers-results, use what "
                          "is refused otherwise (a storage measurement `cadence --results` "
                          "refuses for the job, scaled levels in an order no hardware "
                          "produces), printed as warnings."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text."),
    ]):
        func = option(func)
    return func


def _plan_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options that shape the answer's rules and its planning figures (both commands)."""
    for option in reversed([
        click.option("--rules", type=click.Choice(lv_job.RULES), default="stated",
                     show_default=True,
                     help="stated: each failure pays its own scope's restart and restores "
                          "from the newest copy that survived it (docs/cadence.md, The rules); "
                          "scr: LLNL SCR-model's rules, as a reference."),
        click.option("--aggregate-bandwidth", metavar="BW", default=None,
                     help="With --tiers-results: the storage's aggregate bandwidth for the "
                          "whole job, e.g. 2TB/s (bare number: GB/s), capping the storage "
                          "level the job model scales [default: storage keeps up with any "
                          "number of nodes]."),
        click.option("--step-seconds", metavar="DUR", default=None,
                     help="Seconds of one training step: each level's interval is then also "
                          "given in steps."),
        click.option("--node-state", metavar="SIZE", default=None,
                     help="The state one node holds (its ranks' shards, one copy; bare "
                          "number: GB), for the host memory and network each level needs per "
                          "node [default: from --tiers-results, else not shown]."),
        click.option("--peer-replicas", type=int, default=None,
                     help="Nodes holding a replica of each node's part of a node- or group-"
                          "scope copy [default: the tiered run's, else 1]."),
        click.option("--group-nodes", type=int, default=32, show_default=True,
                     help="Nodes a group failure takes (an aligned block; 32: one scalable "
                          "unit of NVIDIA's DGX SuperPOD, behind one set of leaf switches)."),
    ]):
        func = option(func)
    return func


def _scaling_json(scaling: TierScaling | None) -> dict[str, Any]:
    return {} if scaling is None else {"scaling": scaling.to_dict()}


def _print_levels(job: LevelsJob, scaling: TierScaling | None, rules: str) -> None:
    for level, scope, rate, restart in zip(job.levels, job.scopes, job.rates, job.restart_s,
                                           strict=True):
        persist = "" if not level.persist_s else (
            f" + persist {format_duration(level.persist_s)}"
            + (f" at {100 * level.interference:.3g} % slower steps" if level.interference else ""))
        charged = (f"restart + restore {format_duration(level.restore_s + restart):>8} (restart "
                   f"{format_duration(restart)}, the mean of the failures needing it)"
                   if rules == "scr" else f"restore {format_duration(level.restore_s):>8}")
        click.echo(f"{level.name:<10} save {format_duration(level.save_s):>8}{persist}  "
                   f"{charged}  survives {scope:<7}  {rate * 86400:8.3g} failures/day need it")
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
    return {"restart_s_per_level_scr": list(job.restart_s), "by_scope": job.chosen,
            "mechanisms": {n: {**job.mechanisms[n].parts(), "seconds": job.mechanisms[n].seconds,
                               "source": job.mechanisms[n].source} for n in used}}


def _node_state(options: dict[str, Any], scaling: TierScaling | None) -> float | None:
    if options["node_state"] is not None:
        return float(parse_size(options["node_state"], "--node-state", "GB"))
    return scaling.job.node_bytes if scaling is not None else None


def _replicas(options: dict[str, Any], scaling: TierScaling | None) -> int:
    k = options["peer_replicas"]
    if k is None:
        return scaling.run.replicas if scaling is not None and scaling.run.replicas else 1
    if not 1 <= k <= 64:
        raise SpecError(f"--peer-replicas {k}: allowed: 1 to 64")
    return int(k)


def _step_seconds(options: dict[str, Any]) -> float | None:
    text = options["step_seconds"]
    return None if text is None else positive(
        "--step-seconds", parse_duration(text, "--step-seconds", "s"))


def _plan_lines(plans: Sequence[lv_plan.LevelPlan]) -> list[str]:
    out = []
    for p in plans:
        steps = "" if p.steps is None else f", {p.steps:,.0f} steps"
        needs = ""
        if p.host_memory_bytes is not None:
            needs = "; per node: host memory " + (format_bytes(p.host_memory_bytes)
                                                  if p.host_memory_bytes else "none")
            if p.network_Bps:
                needs += f", network {format_rate(p.network_Bps)} on average"
        out.append(f"  {p.name:<10} every {format_duration(p.compute_s)} of compute "
                   f"({format_duration(p.wall_s)} wall{steps}){needs}")
    return out


def _loss_lines(found: scoped.Breakdown, losses: Sequence[lv_plan.ClassLoss]) -> list[str]:
    out = [f"time lost (stated rules, exact): saves {100 * found.blocking:.2f} %, rework "
           f"{100 * found.rework:.2f} %, restarts {100 * found.restart:.2f} %, restores "
           f"{100 * found.restore:.2f} %"]
    out.append("by class (failures/day; lost: rework + restart + restore):")
    for c in sorted(losses, key=lambda c: -c.total):
        if c.per_day <= 0:
            continue
        out.append(f"  {c.name:<24} {c.per_day:7.3g}/day  {c.scope:<7} reads {c.reads:<8} "
                   f"restart {c.restart:<11} lost {100 * c.total:.3f} % = "
                   f"{100 * c.lost['rework']:.3f} + {100 * c.lost['restart']:.3f} + "
                   f"{100 * c.lost['restore']:.3f}")
    return out


SCR_DIFFERS_PP = 0.5  # print SCR's answer beside the stated rules' past this difference


@click.command("levels", epilog=_epilog("levels"))
@_job_options
@_plan_options
@shows_progress("levels", "finding the optimum")
def levels_command(**options: Any) -> None:
    """Multi-level checkpoint cadence: the schedule that maximizes efficiency when cheap
    copies survive some failures and storage survives all (the stated rules, or LLNL
    SCR's with --rules scr)."""
    job, scaling = _job(options)
    rules = options["rules"]
    step_s = _step_seconds(options)
    replicas = _replicas(options, scaling)
    node_bytes = _node_state(options, scaling)
    found = lv_job.answer(job, rules)
    result = found.answer
    other = lv_job.answer(job, "scr" if rules == "stated" else "stated") \
        if len(job.levels) > 1 else None
    differs = other is not None and abs(other.answer.best.efficiency
                                        - result.best.efficiency) > SCR_DIFFERS_PP / 100
    at = result.named.schedule if result.named is not None else result.best.schedule
    plans = lv_plan.plan_levels(job, at, node_bytes, replicas, step_s)
    loss, losses = lv_plan.class_losses(job, at) if rules == "stated" else (None, [])
    if options["plot"] is not None:
        save_figure(levels_figure(job, found), options["plot"], options["force"])
    if options["as_json"]:
        out: dict[str, Any] = {"gpus": job.gpus, "rules": rules, **result.to_dict(),
                               "per_level": [p.to_dict() for p in plans],
                               "failures_per_day_by_class": {
                                   c.name: k.rate_per_s * 86400.0
                                   for c, k in zip(job.classes, job.kinds, strict=True)},
                               "restarts": _restarts_json(job), **_scaling_json(scaling)}
        if loss is not None:
            out["lost"] = loss.to_dict()
            out["lost_by_class"] = [c.to_dict() for c in losses]
        if other is not None:
            out["other_rules"] = {"rules": other.rules, "differs_by_more_than_pp": differs,
                                  "optimum": other.answer.to_dict()["optimum"]}
        click.echo(json.dumps(out, indent=2))
        return
    _print_levels(job, scaling, rules)
    best, alone = result.best, result.last_level_only
    click.echo(f"optimum ({rules} rules): {describe(best, job.levels)} -> efficiency "
               f"{100 * best.efficiency:.2f} %")
    if len(job.levels) > 1:
        click.echo(f"{job.levels[-1].name} alone: every {format_duration(alone.schedule.compute_s)}"
                   f" -> efficiency {100 * alone.efficiency:.2f} %")
    if result.named is not None:
        click.echo(f"your schedule: {describe(result.named, job.levels)} -> efficiency "
                   f"{100 * result.named.efficiency:.2f} %")
    click.echo(("at your schedule" if result.named is not None else "at the optimum")
               + ", per level:")
    for line in _plan_lines(plans):
        click.echo(line)
    if loss is not None:
        for line in _loss_lines(loss, losses):
            click.echo(line)
    if differs and other is not None:
        o = other.answer.best
        click.echo(f"{other.rules} rules: {describe(o, job.levels)} -> efficiency "
                   f"{100 * o.efficiency:.2f} % (they differ by more than {SCR_DIFFERS_PP} "
                   "percentage points: docs/cadence.md, SCR's rules)")


NODE_LOSING_SCOPES = ("node", "group")
MAX_DAYS = 3650.0
MAX_NODES = lv_job.MAX_GPUS


def _fewer_nodes(text: str | None) -> tuple[float, float]:
    if text is None:
        return 0.0, 1.0
    share_text, _, factor_text = text.partition(":")
    try:
        share, factor = float(share_text), float(factor_text)
    except ValueError:
        share = factor = math.nan
    if not (0.0 <= share <= 1.0 and 1.0 <= factor <= 1000.0):
        raise SpecError(f"--fewer-nodes {text!r}: allowed: SHARE:FACTOR with SHARE from 0 to 1 "
                        "and FACTOR from 1 to 1000, e.g. 0.3:1.865")
    return share, factor


@click.command("simulate", epilog=_epilog("simulate"))
@_job_options
@_plan_options
@click.option("--days", type=float, default=54.0, show_default=True,
              help="Length of the run (Llama 3's: 54 days).")
@click.option("--replicas", type=int, default=1000, show_default=True,
              help="Runs simulated (goodput mean and spread over them).")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option("--weibull-shape", type=float, default=1.0, show_default=True,
              help="Shape of the time between failures of each class (1: exponential; < 1: "
                   "failures cluster; 0.2 to 10).")
@click.option("--fewer-nodes", "fewer_text", metavar="SHARE:FACTOR",
              help="Restarts onto fewer nodes: the SHARE (0-1) of node and group failures "
                   "that find no spare restart on the nodes left and read a resharded restore "
                   "plan, FACTOR times as long as the level's own restore (the plan's "
                   "amplification: `ckptbench restore --restore-world-size` measures it).")
@shows_progress("simulate", "finding the optimum")
def simulate_command(**options: Any) -> None:
    """Simulate the whole run event by event under the stated rules (schedule: the
    optimum of `ckptbench levels`, or --schedule): goodput over replicas and the time lost
    by cause and by failure class."""
    days = options["days"]
    if not 0.0 < days <= MAX_DAYS:
        raise SpecError(f"--days {days:g}: allowed: more than 0, at most {MAX_DAYS:g}")
    if options["rules"] != "stated":
        raise SpecError("--rules scr: allowed only for `ckptbench levels`; `simulate` plays "
                        "out the stated rules (docs/cadence.md), SCR's are a reference model")
    job, scaling = _job(options)
    group_nodes = options["group_nodes"]
    if not 1 <= group_nodes <= MAX_NODES:
        raise SpecError(f"--group-nodes {group_nodes}: allowed: 1 to {MAX_NODES:,}")
    share, factor = _fewer_nodes(options["fewer_text"])
    topology = Topology(nodes=math.ceil(job.gpus / job.gpus_per_node), group_nodes=group_nodes,
                        peer_replicas=_replicas(options, scaling))
    failures = [Failures(c.name, k.rate_per_s, c.scope, k.restart_s,
                         share if c.scope in NODE_LOSING_SCOPES else 0.0)
                for c, k in zip(job.classes, job.kinds, strict=True)]
    schedule = job.schedule or scoped.optimum(job.levels, job.kinds).schedule
    exact = scoped.efficiency(job.levels, job.kinds, schedule) \
        if options["weibull_shape"] == 1.0 and share == 0.0 else None
    current().phase(f"simulating {options['replicas']} runs of {days:g} days")
    run = simulate(job.levels, job.scopes, failures, schedule, days * 86400.0, topology,
                   options["replicas"], options["seed"], options["weibull_shape"],
                   reshard_factor=factor if share > 0 else 1.0)
    if options["plot"] is not None:
        title = (f"{run.replicas} runs of {days:g} days, {job.gpus} GPUs\n"
                 f"{describe(schedule, job.levels)}")
        save_figure(levels_figures.goodput_histogram(run.goodput, exact, title),
                    options["plot"], options["force"])
    if options["as_json"]:
        click.echo(json.dumps({"gpus": job.gpus, "rules": "stated", "schedule": {
            "compute_s": schedule.compute_s, "counts": list(schedule.counts)},
            "topology": {"nodes": topology.nodes, "group_nodes": topology.group_nodes,
                         "peer_replicas": topology.peer_replicas},
            **run.to_dict(), "exact_efficiency": exact, "restarts": _restarts_json(job),
            **_scaling_json(scaling)}, indent=2))
        return
    _print_levels(job, scaling, "stated")
    click.echo(f"schedule: {describe(schedule, job.levels)}")
    click.echo(f"nodes: {topology.nodes:,} ({job.gpus_per_node} GPUs each), a group failure "
               f"takes {topology.group_nodes}, peer copies on {topology.peer_replicas} other "
               "node(s)")
    click.echo(f"goodput over {run.replicas} runs of {days:g} days: mean "
               f"{100 * run.mean:.2f} % (99 % CI +-{100 * run.ci99:.2f}), p5 "
               f"{100 * run.percentile(5):.2f} %, p95 {100 * run.percentile(95):.2f} %"
               + ("" if exact is None else
                  f"; the exact model (failures by scope) {100 * exact:.2f} %"))
    click.echo(f"time lost: saves {100 * run.blocking:.2f} %, work redone "
               f"{100 * run.rework:.2f} %, restarts {100 * run.restart:.2f} %, restores "
               f"{100 * run.restore:.2f} %; {run.failures_per_replica:.1f} failures per run")
    worst = sorted(run.by_class.items(), key=lambda kv: -_lost(kv[1]))[:5]
    click.echo("lost by class: " + ", ".join(
        f"{name} {100 * _lost(lost):.2f} % ({lost['failures_per_day']:.3g}/day)"
        for name, lost in worst if _lost(lost) > 0))
    click.echo("restores read: " + ", ".join(f"{name} {n:,}"
                                             for name, n in run.restores_by_level.items()))


def _lost(by: dict[str, float]) -> float:
    return by["rework"] + by["restart"] + by["restore"]


COMMANDS = [levels_command, simulate_command]
