"""`ckptbench run`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ckptbench.backends import IOHints, open_backend
from ckptbench.cli.async_options import async_options, loop_options
from ckptbench.cli.backend_options import backend_options, options_for_target, typed_backend_flags
from ckptbench.cli.plan_cmd import apply_restore_layout, restore_layout_options
from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.fields import parse_ranks
from ckptbench.formats import FORMATS, check_format
from ckptbench.measure import measure, run_status
from ckptbench.payload import MODES
from ckptbench.plan import build_plan
from ckptbench.report import table
from ckptbench.runner import Launcher, RunOptions, RunRequest, new_run_id, open_launcher
from ckptbench.runner.options import PLANNED_RESTORE, LoopOptions
from ckptbench.runner.signals import exit_status, signal_name, stop_on_signals
from ckptbench.spec import load_workload, scaled
from ckptbench.units import parse_duration, parse_size


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


def stall_timeout_option(f: Any) -> Any:
    """--stall-timeout, for every command that moves checkpoint bytes (run, restore)."""
    return click.option(
        "--stall-timeout", default="120s", show_default=True,
        help="Fail the run when a rank moves no byte for this long while saving or "
             "restoring, or stays stopped (SIGSTOP) this long (e.g. 30s, 10min; off: "
             "never). Raise it for very slow storage.")(f)


@contextlib.contextmanager
def stopped_as(what: str, results: Path) -> Iterator[None]:
    """A signal (Ctrl-C, SIGTERM, SIGHUP: runner.signals) that stopped `what` becomes one
    line naming it, and exit status 128 + the signal."""
    try:
        yield
    except KeyboardInterrupt as exc:
        kept = f"; records so far: {results}" if results.exists() else ""
        raise Stopped(f"stopped by {signal_name(exc)}: {what}{kept}", exit_status(exc)) from None


def parse_stall_timeout(text: str) -> float:
    """--stall-timeout: a duration, or off (0 means off too)."""
    if text.strip().lower() in ("off", "0", "0s"):
        return 0.0
    return parse_duration(text, "--stall-timeout")


RESTORE_PLANS = ("dcp", "files")


@click.command("run")
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--target", default="ckptbench-data", show_default=True,
              help="Where checkpoints go: a directory, file://..., s3://bucket/prefix, or an fsspec URL.")
@click.option("--iterations", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--scale", type=click.IntRange(min=1), default=1, show_default=True,
              help="Divide every model dimension by F (keeps the layout): for small machines.")
@click.option("--ranks", default=None, help="Run a subset of the plan's ranks, e.g. 0-7 (MLPerf subset mode).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="I/O threads per rank [default: the workload's checkpoint.threads].")
@click.option("--block-size", default="8MiB", show_default=True, help="Bytes per write/read call.")
@click.option("--payload", type=click.Choice(MODES), default="random", show_default=True,
              help="random: incompressible; realistic: values shaped like trained weights/moments.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Payload seed (0 or more): the same seed writes the same bytes.")
@click.option("--prefill", default="64MiB", show_default=True,
              help="Payload generated per rank before the clock starts (bounds memory).")
@click.option("--keep", is_flag=True, help="Keep the checkpoints written (default: delete them).")
@click.option("--clean-debris", is_flag=True,
              help="Remove what interrupted runs left on the target (only the names each run "
                   "recorded; without it, it is reported).")
@click.option("--no-restore", is_flag=True, help="Measure saves only.")
@click.option("--no-verify", is_flag=True,
              help="Diagnostic (--format raw): restores read every byte without checking it; "
                   "the results record them as unverified.")
@click.option("--cache", type=click.Choice(["auto", "none"]), default="auto", show_default=True,
              help="auto: evict the checkpoint from caches before restoring.")
@click.option("--restore-shift", type=int, default=None,
              help="Rank r restores the files of rank r+N (IOR -C): no rank reads its own cache "
                   "[default: 0; under MPI on several nodes the plan ranks per node].")
@click.option("--results", type=click.Path(dir_okay=False), default=None,
              help="Results file (JSON Lines) [default: results/<workload>-<run id>.jsonl].")
@click.option("--launcher", type=click.Choice(["auto", "local", "mpi"]), default="auto",
              show_default=True,
              help="auto: MPI ranks when started by mpirun/srun (needs mpi4py), else local processes.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="raw", show_default=True,
              help="raw: the plan's files; zarr: zarr v3 sharded arrays; torch-dcp: DCP's writer (needs torch).")
@click.option("--codec", default="none", show_default=True,
              help="zarr only: none, zstd[:level=N], lz4[:acceleration=N], blosc[:cname=C,clevel=N,"
                   "shuffle=byte|bit|none]; any takes inner_chunks=N (inner chunks per shard).")
@click.option("--restore-plan", type=click.Choice(RESTORE_PLANS), default=None,
              help="dcp: each rank of the restore layout reads what DCP's load planner gives "
                   "it (replicas, resharding); files: each rank reads back its own files "
                   "[default: dcp with --format raw, else files].")
@restore_layout_options
@stall_timeout_option
@async_options
@backend_options
@click.option("--json", "as_json", is_flag=True,
              help="Print the summary as JSON, alone on stdout (progress and banner: stderr).")
@width_options
def run_command(workload: str, target: str, iterations: int, scale: int, ranks: str | None,
                threads: int | None, block_size: str, payload: str, seed: int,
                prefill: str, keep: bool, clean_debris: bool, no_restore: bool, cache: str, restore_shift: int | None,
                results: str | None, launcher: str, fmt: str, codec: str, stall_timeout: str,
                as_json: bool, wide: bool, width: int | None, restore_plan: str | None,
                restore_world_size: int | None, restore_layout: str | None, mode: str,
                no_verify: bool, **values: Any) -> None:  # backends' read as typed_backend_flags
    """Save and restore WORKLOAD's checkpoint on TARGET, measured; write a results file.

    --mode async: checkpoints of a synthetic training loop instead (ITERATIONS of them),
    measured for what the loop waits, the time until durable and the slowdown of training.
    """
    backend_flags = typed_backend_flags(click.get_current_context())
    options_for_target(target, backend_flags)  # a misplaced flag: refused before anything runs
    loop = loop_options(values, mode, click.get_current_context())
    launch = open_launcher(launcher)
    # Local runs stop on SIGTERM/SIGHUP as on Ctrl-C; MPI ranks leave that to mpirun/srun.
    with quiet_unless_root(launch), stop_on_signals(launch.kind == "local"):
        _run(launch, workload, target, iterations, scale, ranks, threads, block_size, payload,
             seed, prefill, keep, no_restore, cache, restore_shift, results, as_json,
             backend_flags, fmt=fmt, codec=codec, stall_timeout=stall_timeout,
             width=table.output_width(wide, width), clean_debris=clean_debris,
             restore=RestoreChoice(restore_plan, restore_world_size, restore_layout),
             mode=mode, loop=loop, verify=not no_verify)


@dataclass(frozen=True)
class RestoreChoice:
    """The command line's restore plan and restore layout."""

    plan: str | None = None
    world_size: int | None = None
    layout: str | None = None

    def resolve(self, fmt: str) -> str:
        """The restore plan to run: dcp for the raw and torch-dcp formats unless asked
        otherwise; a restore layout only with it (files restore on the training layout)."""
        if self.plan == "dcp" and fmt not in PLANNED_RESTORE:
            raise SpecError(f"--restore-plan dcp needs --format {' or '.join(PLANNED_RESTORE)} "
                            f"(--format {fmt} reads back its own files); allowed here: "
                            "--restore-plan files")
        plan = self.plan or ("dcp" if fmt in PLANNED_RESTORE else "files")
        given = ("--restore-world-size" if self.world_size is not None else
                 "--restore-layout" if self.layout is not None else None)
        if plan == "files" and given:
            why = ("--restore-plan files" if self.plan else
                   f"--format {fmt} reads back its own files")
            raise SpecError(f"{given} needs --restore-plan dcp ({why}: each rank reads back the "
                            f"files it wrote, on the training layout); allowed: drop {given}")
        return plan


def _run(launch: Launcher, workload: str, target: str, iterations: int, scale: int, ranks: str | None,
         threads: int | None, block_size: str, payload: str, seed: int, prefill: str, keep: bool,
         no_restore: bool, cache: str, restore_shift: int | None, results: str | None,
         as_json: bool, backend_flags: dict[str, Any], fmt: str = "raw",
         codec: str = "none", stall_timeout: str = "120s", width: int | None = 80,
         restore: RestoreChoice = RestoreChoice(), clean_debris: bool = False,
         mode: str = "sync", loop: LoopOptions | None = None, verify: bool = True) -> None:
    if not verify and fmt != "raw":
        raise SpecError(f"--no-verify needs --format raw (--format {fmt} always verifies); "
                        "allowed: drop --no-verify, or --format raw")
    full = apply_restore_layout(load_workload(workload), restore.world_size, restore.layout)
    restore_plan = restore.resolve(fmt)
    run_workload = scaled(full, scale)
    plan = build_plan(run_workload)
    selected = parse_ranks(ranks, plan.world_size) if ranks else list(range(plan.world_size))
    codec_spec = check_format(fmt, codec, plan, selected)
    run_id = new_run_id()
    options = RunOptions(
        iterations=iterations, threads=threads or run_workload.checkpoint.threads,
        block_size=parse_size(block_size, "--block-size"), payload=payload, seed=seed, keep=keep,
        restore=not no_restore, prefill_bytes=parse_size(prefill, "--prefill"), cache=cache,
        run_id=run_id, restore_shift=restore_shift or 0,
        format=fmt, codec=codec_spec.text() if fmt == "zarr" else "none",
        stall_timeout=parse_stall_timeout(stall_timeout), restore_plan=restore_plan, clean_debris=clean_debris,
        mode=mode, loop=loop or LoopOptions(), verify=verify,
    )
    ck = run_workload.checkpoint
    hints = IOHints(block_size=options.block_size, threads=options.threads,
                    stripe_size=ck.stripe_size, stripe_count=ck.stripe_count,
                    ranks_per_host=len(selected))
    backend = open_backend(target, options_for_target(target, backend_flags), hints)
    results_path = Path(results) if results else Path("results") / f"{full.name}-{run_id}.jsonl"
    per_iter = plan.bytes_of_ranks(selected)
    req = RunRequest(workload=full, plan=plan, ranks=selected, backend=backend, options=options,
                     scale=scale, restore_shift_auto=restore_shift is None)

    def banner() -> None:
        click.echo(f"{full.name}: {len(selected)} of {plan.world_size} ranks, "
                   f"{per_iter / 2**30:.3f} GiB per checkpoint, {iterations} iteration(s) -> {target}"
                   + ("" if verify else " (restores NOT verified: --no-verify)"),
                   err=True)  # stdout: the results alone
    with run_status(req, "run", launch) as status:
        done = "kept what it finished" if keep else "removed what it wrote"
        with stopped_as(f"the run {done} on {target}", results_path):
            outcome = measure(req, results_path, launch, on_progress=status,
                              on_start=banner, on_notice=lambda line: status.note(
                                  f"ckptbench: note: {line}"))
    if outcome is None:  # MPI ranks other than 0 print nothing
        return
    if as_json:
        extra = {"async": outcome["async"]} if outcome.get("async") else {}
        click.echo(json.dumps({"results": str(results_path), "summary": outcome["summary"],
                               **extra}, indent=2))
    else:
        table.render_summary(table.console_for(width, plain=launch.kind == "mpi"), [outcome], width)
        click.echo(f"results: {results_path}")


COMMANDS = [run_command]
