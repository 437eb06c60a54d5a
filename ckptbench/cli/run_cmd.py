"""`ckptbench run`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ckptbench.backends import BackendOptions, backend_class
from ckptbench.cli.backend_options import backend_options, options_for_target, typed_backend_flags
from ckptbench.cli.run_options import GroupedCommand, run_options, settings
from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.measure import build_request, measure, run_status
from ckptbench.plan.bounds import (
    BYTES_PER_READ,
    check_restore_size,
    plan_bytes,
    plan_items,
    restore_reads,
)
from ckptbench.plan.restore import restore_plan_of
from ckptbench.progress import Status
from ckptbench.records import environment
from ckptbench.redact import redact
from ckptbench.replay import Recorded, differences, overridden, read_recorded
from ckptbench.report import table
from ckptbench.report.tiers_table import render_tiers
from ckptbench.runner import Launcher, RunRequest, open_launcher
from ckptbench.runner.restore_setup import restore_setup
from ckptbench.runner.scheduler import job_text
from ckptbench.runner.signals import exit_status, say_on_signal, signal_name, stop_on_signals
from ckptbench.runspec import read_benchmark_file, request_options
from ckptbench.spec import Workload, load_workload, scaled, with_restore_layout
from ckptbench.units import format_size


def width_options(f: Any) -> Any:
    """--wide and --width: how wide the tables may be (default: the terminal's; 80 in a
    pipe, as under mpirun)."""
    f = click.option("--width", type=click.IntRange(min=40), default=None,
                     help="Fit tables in this many columns [default: the terminal's, 80 in a pipe].")(f)
    return click.option("--wide", is_flag=True,
                        help="Tables as wide as they need (logs, pipes read later), never split.")(f)


class Stopped(CkptbenchError):
    """The run was stopped by a signal, after removing what it wrote (exit 128 + signal)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def quiet_unless_root(launcher: Launcher) -> Iterator[None]:
    """On MPI ranks other than 0, an error rank 0 also reports ends the process with its
    exit status and no output (errors of one rank alone are printed where they happen,
    before the job is aborted)."""
    if launcher.root:
        yield
        return
    try:
        yield
    except CkptbenchError as exc:
        raise SystemExit(exc.exit_code) from None


@contextlib.contextmanager
def stopped_as(what: str, results: Path) -> Iterator[None]:
    """A signal (Ctrl-C, SIGTERM, SIGHUP: runner.signals) that stopped `what` becomes one
    line naming it, and exit status 128 + the signal."""
    try:
        yield
    except KeyboardInterrupt as exc:
        kept = f"; records so far: {results}" if results.exists() else ""
        raise Stopped(f"stopped by {signal_name(exc)}: {what}{kept}", exit_status(exc)) from None


@click.command("run", cls=GroupedCommand)
@click.argument("workload", type=click.Path(dir_okay=False), required=False)
@click.option("--replay", type=click.Path(dir_okay=False), metavar="RESULTS.jsonl",
              help="Run again what a results file records (its workload, run options, target "
                   "and backend options); flags given change those; what differs on this "
                   "machine is printed first.")
@run_options("run")
@backend_options
def run_command(workload: str | None, replay: str | None, **_values: Any) -> None:
    """Save and restore WORKLOAD's checkpoint on TARGET, measured; write a results file.

    WORKLOAD is a workload file, whose [run] table (any option below, by its name:
    block_size = "4MiB") sets options the command line overrides, or a benchmark file
    holding [run] alone with workload = "path". --mode async: checkpoints of a synthetic
    training loop instead (ITERATIONS of them), measured for what the loop waits, the time
    until durable and the slowdown of training.
    """
    ctx = click.get_current_context()
    flags = typed_backend_flags(ctx)
    if workload is not None and replay is not None:
        raise SpecError(f"WORKLOAD {workload} and --replay {replay}: a replay runs the workload "
                        "its results file records; allowed: one of them")
    if workload is None and replay is None:
        raise SpecError("missing WORKLOAD; allowed: a workload or benchmark file, or --replay "
                        "RESULTS.jsonl")
    recorded = read_recorded(replay) if replay else None
    if recorded is not None:
        run = settings(ctx, "run", recorded.settings, f"{replay}: run_options")
        source: str | Workload = recorded.workload
        backend = replayed_backend_options(recorded, run["target"], flags)
    else:
        bench = read_benchmark_file(str(workload))
        run = settings(ctx, "run", bench.table, f"{bench.path}: [run]")
        source = str(bench.workload)
        backend = options_for_target(run["target"], flags)  # refused before anything runs
    launch = open_launcher(run["launcher"])
    # Local runs stop on SIGTERM/SIGHUP as on Ctrl-C and clean up; MPI ranks end at once
    # (runner.signals), MPI rank 0 with one line.
    if launch.kind != "local" and launch.root:
        say_on_signal(lambda name: stopped_line(name, run["target"]))
    with quiet_unless_root(launch), stop_on_signals(launch.kind == "local"):
        req, status = planned_request(source, backend, run, launch)
        if recorded is not None and launch.root:
            _say_differences(recorded, req, run)
        _run(launch, req, run, status)


# Planning said before it starts (ckptbench.plan.bounds' estimates): from about a second
# of work on, the user is told what is planned and what it will take, then every few
# seconds how long it has run (ckptbench.progress).
PLAN_NOTICE_ITEMS = 2_000_000  # a plan's items (1-3 s: Llama 3.1 405B on 16,384 ranks)
RESTORE_NOTICE_READS = 2_000_000  # a restore plan's estimated reads


def planned_request(source: str | Workload, backend: BackendOptions, run: dict[str, Any],
                    launch: Launcher) -> tuple[RunRequest, Status]:
    """build_request, the restore plan the run will use and the run's progress (its totals
    come from that plan), with what takes long said before it starts (process 0 alone)
    and what the run's own bounds would stop later (memory, --stall-timeout) refused up
    front, in one line."""
    with contextlib.ExitStack() as stack:
        status: list[Status] = []

        def say(text: str) -> None:
            if not status:
                status.append(stack.enter_context(Status("run", enabled=launch.root)))
            status[0].phase(text, at_once=True)

        setup = ""
        full = _estimated(source, run)
        if full is not None and plan_items(full) >= PLAN_NOTICE_ITEMS:
            say(f"planning {full.parallel.world_size:,} ranks (about {plan_items(full):,} "
                f"items, an estimated {format_size(plan_bytes(full))}) ...")
        req = build_request(source, backend_options=backend, **request_options(run))
        try:
            if req.options.uses_restore_plan:
                w = req.plan.workload
                reads = restore_reads(w)
                if reads >= RESTORE_NOTICE_READS:
                    check_restore_size(w)  # refused before the line that announces it
                    say(f"planning the restore of {w.restore_parallel.world_size:,} ranks "
                        f"(about {reads:,} reads at most, an estimated "
                        f"{format_size(reads * BYTES_PER_READ)}) ...")
                restore_plan_of(req.plan)  # built once: the run's processes share it
                setup = restore_setup(req, launch)
            progress = run_status(req, "run", launch)  # its per-rank totals: seconds too
        except BaseException:
            req.backend.release()
            raise
    if setup and launch.root:  # after the planning's last line: this is the run's
        click.echo(f"ckptbench: note: {setup}", err=True)
    return req, progress


def _estimated(source: str | Workload, run: dict[str, Any]) -> Workload | None:
    """The workload as the run will plan it (scaled), for the estimates alone; None when
    it does not validate (build_request then says why, in one line)."""
    try:
        full = source if isinstance(source, Workload) else load_workload(source)
        return scaled(with_restore_layout(full, run["restore_world_size"],
                                          run["restore_layout"]), run["scale"])
    except CkptbenchError:
        return None


def stopped_line(signal: str, target: str) -> str:
    """What MPI rank 0 says when a signal ends the run (scancel, a time limit, Ctrl-C to
    mpirun): by whom, and what stays on the target."""
    return (f"stopped by {signal}{job_text()}; what the run wrote stays on {redact(target)} with its "
            "intent record: the next run there reports it, --clean-debris removes it")


def replayed_backend_options(recorded: Recorded, target: str, flags: dict[str, Any]
                             ) -> BackendOptions:
    """The recorded backend options, with the flags given laid over them."""
    typed = options_for_target(target, flags).to_dict()
    cls = backend_class(target)
    names = {cls.Options.cli_fields()[flag][0] for flag in flags}
    return cls.Options.from_mapping({**recorded.backend_options,
                                     **{k: typed[k] for k in names}}, cls.name)


def _say_differences(recorded: Recorded, req: RunRequest, run: dict[str, Any]) -> None:
    lines = [f"given: {line}" for line in overridden(recorded.settings, request_options(run))]
    lines += differences(recorded.environment, environment(req.backend.describe()))
    click.echo(f"replay of {recorded.path} ({recorded.command}, ckptbench "
               f"{recorded.environment.get('ckptbench')}): "
               + ("nothing recorded differs here" if not lines else
                  f"{len(lines)} difference(s) from the record"), err=True)
    for line in lines:
        click.echo(f"  {line}", err=True)


def _run(launch: Launcher, req: RunRequest, run: dict[str, Any], progress: Status) -> None:
    """Measure `req` with its progress on stderr (`progress`: run_status's); print the
    summary (a table, or JSON)."""
    full, plan, options = req.workload, req.plan, req.options
    target = run["target"]
    results_path = Path(run["results"]) if run["results"] else \
        Path("results") / f"{full.name}-{options.run_id}.jsonl"
    per_iter = plan.bytes_of_ranks(req.ranks)
    width = table.output_width(run["wide"], run["width"])

    def banner() -> None:
        click.echo(f"{full.name}: {len(req.ranks)} of {plan.world_size} ranks, "
                   f"{per_iter / 2**30:.3f} GiB per checkpoint, {options.iterations} "
                   f"iteration(s) -> {target}"
                   + ("" if options.verify else " (restores NOT verified: --no-verify)"),
                   err=True)  # stdout: the results alone
    with progress as status:
        done = "kept what it finished" if options.keep else "removed what it wrote"
        with stopped_as(f"the run {done} on {target}", results_path):
            outcome = measure(req, results_path, launch, on_progress=status,
                              on_start=banner, on_notice=lambda line: status.note(
                                  f"ckptbench: note: {line}"))
    if outcome is None:  # MPI ranks other than 0 print nothing
        return
    if run["json"]:
        extra = {k: outcome[k] for k in ("async", "tiers") if outcome.get(k)}
        click.echo(json.dumps({"results": str(results_path), "summary": outcome["summary"],
                               **extra}, indent=2))
    else:
        console = table.console_for(width, plain=launch.kind == "mpi")
        table.render_summary(console, [outcome], width)
        render_tiers(console, [outcome], width)
        click.echo(f"results: {results_path}")


COMMANDS = [run_command]
