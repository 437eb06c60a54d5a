"""`ckptbench run` and `ckptbench report`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from ckptbench import report as report_mod
from ckptbench.backends import IOHints, open_backend
from ckptbench.cli.async_table import async_options, loop_options, render_async
from ckptbench.cli.backend_options import backend_options, options_for_target, typed_backend_flags
from ckptbench.errors import CkptbenchError
from ckptbench.formats import FORMATS, check_format
from ckptbench.measure import measure
from ckptbench.payload import MODES
from ckptbench.plan import build_plan
from ckptbench.runner import Launcher, RunOptions, RunRequest, new_run_id, open_launcher
from ckptbench.runner.async_mode import check_async
from ckptbench.runner.options import LoopOptions
from ckptbench.spec import load_workload, parse_ranks, scaled
from ckptbench.units import parse_size


def _gbps(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:.3f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def wide_console() -> Console:
    """A console that does not squeeze the results table when output is not a terminal."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def render_summary(console: Console, loaded: list[dict[str, Any]]) -> None:
    table = Table(title="ckptbench results (throughput in GB/s = 1e9 B/s; median over iterations)")
    for col in ("run", "phase", "iters", "GiB", "GB/s median", "min-max", "rank GB/s min",
                "slowest rank s", "gap s", "op p50/p99 ms", "cache"):
        table.add_column(col, justify="right" if col not in ("run", "phase", "cache") else "left")
    for res in loaded:
        name = res["run"].get("workload", {}).get("name", "?")
        for s in res["summary"]:
            op = "write" if s["phase"] == "save" else "read"
            if op not in s["latency"] and f"{op}_shard" in s["latency"]:
                op = f"{op}_shard"  # the zarr format
            lat = s["latency"].get(op, {})
            table.add_row(
                name, s["phase"], str(s["iterations"]), f"{s['bytes'] / 2**30:.3f}",
                _gbps(s["throughput_bytes_per_s"]),
                f"{_gbps(s['throughput_min'])}-{_gbps(s['throughput_max'])}",
                _gbps(s["rank_throughput_min_bytes_per_s"]), f"{s['slowest_rank_seconds_max']:.3f}",
                f"{s['first_to_last_gap_s_median']:.3f}",
                f"{op} {_ms(lat.get('p50_s'))}/{_ms(lat.get('p99_s'))}", str(s["cache"] or "-"),
            )
        for e in res["errors"]:
            table.add_row(name, e["phase"], str(e["iteration"]), "", "FAILED", "", "", "", "", e["message"][:60], "")
    console.print(table)
    render_storage(console, loaded)
    render_async(console, loaded)


def render_storage(console: Console, loaded: list[dict[str, Any]]) -> None:
    """Logical vs stored bytes and throughput, for runs whose format records stored bytes."""
    rows = [(res, s) for res in loaded for s in res["summary"] if "stored_bytes" in s]
    if not rows:
        return
    table = Table(title="stored bytes (zarr: after the codec; GB/s median over iterations)")
    for col in ("run", "phase", "codec", "logical GiB", "stored GiB", "ratio", "logical GB/s",
                "stored GB/s"):
        table.add_column(col, justify="left" if col in ("run", "phase", "codec") else "right")
    for res, s in rows:
        ratio = s.get("compression_ratio")
        table.add_row(res["run"].get("workload", {}).get("name", "?"), s["phase"],
                      str(res["run"].get("options", {}).get("codec", "-")),
                      f"{s['bytes'] / 2**30:.3f}", f"{s['stored_bytes'] / 2**30:.3f}",
                      "-" if ratio is None else f"{ratio:.3f}",
                      _gbps(s["throughput_bytes_per_s"]), _gbps(s["stored_throughput_bytes_per_s"]))
    console.print(table)


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
@click.option("--no-restore", is_flag=True, help="Measure saves only.")
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
@async_options
@backend_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def run_command(workload: str, target: str, iterations: int, scale: int, ranks: str | None,
                threads: int | None, block_size: str, payload: str, seed: int,
                prefill: str, keep: bool, no_restore: bool, cache: str, restore_shift: int | None,
                results: str | None, launcher: str, fmt: str, codec: str, as_json: bool,
                mode: str, **values: Any) -> None:  # backends' read as typed_backend_flags
    """Save and restore WORKLOAD's checkpoint on TARGET, measured; write a results file.

    --mode async: checkpoints of a synthetic training loop instead (ITERATIONS of them),
    measured for what the loop waits, the time until durable and the slowdown of training.
    """
    backend_flags = typed_backend_flags(click.get_current_context())
    options_for_target(target, backend_flags)  # a misplaced flag: refused before anything runs
    loop = loop_options(values, mode, click.get_current_context())
    launch = open_launcher(launcher)
    with quiet_unless_root(launch):  # under MPI only rank 0 prints
        _run(launch, workload, target, iterations, scale, ranks, threads, block_size, payload,
             seed, prefill, keep, no_restore, cache, restore_shift, results, as_json,
             backend_flags, fmt=fmt, codec=codec, mode=mode, loop=loop)


def _run(launch: Launcher, workload: str, target: str, iterations: int, scale: int, ranks: str | None,
         threads: int | None, block_size: str, payload: str, seed: int, prefill: str, keep: bool,
         no_restore: bool, cache: str, restore_shift: int | None, results: str | None,
         as_json: bool, backend_flags: dict[str, Any], fmt: str = "raw",
         codec: str = "none", mode: str = "sync", loop: LoopOptions | None = None) -> None:
    full = load_workload(workload)
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
        mode=mode, loop=loop or LoopOptions(),
    )
    check_async(plan, options)
    ck = run_workload.checkpoint
    hints = IOHints(block_size=options.block_size, threads=options.threads,
                    stripe_size=ck.stripe_size, stripe_count=ck.stripe_count)
    backend = open_backend(target, options_for_target(target, backend_flags), hints)
    results_path = Path(results) if results else Path("results") / f"{full.name}-{run_id}.jsonl"
    per_iter = plan.bytes_of_ranks(selected)
    total = per_iter * iterations * (1 if no_restore else 2)
    console = Console(stderr=True, quiet=not launch.root)
    req = RunRequest(workload=full, plan=plan, ranks=selected, backend=backend, options=options,
                     scale=scale, restore_shift_auto=restore_shift is None)

    def banner() -> None:
        click.echo(f"{full.name}: {len(selected)} of {plan.world_size} ranks, "
                   f"{per_iter / 2**30:.3f} GiB per checkpoint, {iterations} iteration(s) -> {target}")
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=console,
                  transient=True, disable=not launch.root) as progress:
        task = progress.add_task("save+restore" if not no_restore else "save", total=total)
        outcome = measure(req, results_path, launch,
                          on_progress=lambda n: progress.advance(task, n), on_start=banner)
    if outcome is None:  # MPI ranks other than 0 print nothing
        return
    loaded = [outcome]
    if as_json:
        click.echo(json.dumps({"results": str(results_path), "summary": loaded[0]["summary"]}, indent=2))
    else:
        render_summary(wide_console(), loaded)
        click.echo(f"results: {results_path}")


@click.command("report")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print summaries and per-iteration figures as JSON.")
def report_command(results: tuple[str, ...], as_json: bool) -> None:
    """Summarize one or more results files (several: side by side)."""
    loaded = [report_mod.load(p) for p in results]
    if as_json:
        click.echo(json.dumps([{k: v for k, v in r.items() if k != "run"} for r in loaded], indent=2))
        return
    render_summary(wide_console(), loaded)


COMMANDS = [run_command, report_command]
