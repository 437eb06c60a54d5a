"""`ckptbench mlperf`: an MLPerf Storage v2.0 checkpointing run, reported both ways."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ckptbench.cli.run_cmd import quiet_unless_root
from ckptbench.cli.run_options import GroupedCommand, run_options, settings
from ckptbench.measure import build_request, measure, run_status
from ckptbench.mlperf import GIB, Comparison, compare, facts, rules
from ckptbench.records import read_records
from ckptbench.report import summarize, throughput
from ckptbench.report import table as report_table
from ckptbench.runner import RunRequest, open_launcher
from ckptbench.runner.signals import stop_on_signals
from ckptbench.runspec import read_benchmark_file, request_options


def _row(table: Table, c: Comparison) -> None:
    for way, stat, what in (
            ("MLPerf v2.0", c.mlperf, "rank 0's clock, no fsync, tensor bytes"),
            ("MLPerf v2.0 + fsync", c.mlperf_with_fsync, "rank 0's clock as run here"),
            ("ckptbench", c.ckptbench, "its throughput: all ranks to the commit, fsync"
             if c.phase == "save" else "its throughput: manifest to the last read, verified")):
        table.add_row(c.phase, way, f"{stat.mean:.3f}", f"{stat.stdev:.3f}",
                      f"{max(stat.seconds):.3f}" if stat.seconds else "-", what)
    table.add_row(c.phase, "ratio MLPerf / ckptbench", f"{c.ratio:.2f}x", "", "", "")


def render(comparisons: list[Comparison], lines: list[str], sequence: str,
           headlines: list[str]) -> None:
    console = report_table.console_for(report_table.output_width(False, None))
    table = Table(title="MLPerf Storage v2.0 way vs ckptbench way (GiB/s = 2^30 B/s, mean "
                        "and population stdev over checkpoints, as DLIO reports them)")
    for col in ("phase", "way", "GiB/s mean", "stdev", "max s", "what is timed"):
        table.add_column(col, justify="left" if col in ("phase", "way", "what is timed")
                         else "right")
    for c in comparisons:
        _row(table, c)
    console.print(table)
    click.echo("ckptbench's throughput, as `ckptbench run` and `report` print it (GB/s = 1e9 B/s):")
    for line in headlines:
        click.echo(f"  {line}")
    c0 = comparisons[0]
    click.echo(f"sequence: {sequence}; tensor bytes per checkpoint: "
               f"{c0.tensor_bytes / GIB:.3f} GiB; torch.save containers: "
               f"{c0.container_bytes / GIB:.3f} GiB (+{c0.container_bytes - c0.tensor_bytes} B)")
    click.echo("CLOSED-submission rules (mlpstorage v2.0):")
    for line in lines:
        click.echo(f"  {line}")


def report(req: RunRequest, path: Path, scale: int, as_json: bool) -> None:
    """Both ways and the rules, from the results file the run wrote (process 0)."""
    records = list(read_records(path))
    tensor_bytes = req.plan.bytes_of_ranks(req.ranks)
    comparisons = [compare(records, p, tensor_bytes) for p in ("save", "restore")]
    lines = [r.line() for r in rules(facts(
        records, workload=req.workload.name, world_size=req.plan.world_size,
        ranks=len(req.ranks), scale=scale, iterations=req.options.iterations,
        bytes_per_checkpoint=comparisons[0].container_bytes))]
    summaries = [r for r in records if r.get("type") == "summary"] or summarize(records)
    if not as_json:
        render(comparisons, lines, req.options.sequence, throughput.headlines(summaries))
        click.echo(f"results: {path}")
        return
    out: dict[str, Any] = {"results": str(path), "sequence": req.options.sequence, "phases": [
        {"phase": c.phase, "ratio": c.ratio, "tensor_bytes": c.tensor_bytes,
         "container_bytes": c.container_bytes,
         **{way: {"gibps_mean": s.mean, "gibps_stdev": s.stdev, "gibps": s.gibps,
                  "seconds": s.seconds}
            for way, s in (("mlperf", c.mlperf), ("mlperf_with_fsync", c.mlperf_with_fsync),
                           ("ckptbench", c.ckptbench))}} for c in comparisons],
        "throughput_bytes_per_s": {s["phase"]: s["throughput_bytes_per_s"] for s in summaries},
        "rules": lines}
    click.echo(json.dumps(out, indent=2))


@click.command("mlperf", cls=GroupedCommand)
@click.argument("workload", type=click.Path(dir_okay=False))
@run_options("mlperf")
def mlperf_command(workload: str, **_values: Any) -> None:
    """Run WORKLOAD (an MLPerf llama3 workload) as MLPerf Storage v2.0 does: DLIO's
    torch.save files, one thread per rank, all checkpoints written and then read, and report
    it MLPerf's way next to ckptbench's, with the ratio and the CLOSED rules the run breaks.
    The workload file's [run] table sets the options it takes (as for `run`)."""
    bench = read_benchmark_file(workload)
    opts = settings(click.get_current_context(), "mlperf", bench.table, f"{bench.path}: [run]")
    launch = open_launcher(opts["launcher"])
    with quiet_unless_root(launch), stop_on_signals(launch.kind == "local"):
        req = build_request(bench.workload, command="mlperf", threads=1, format="torch-save",
                            **request_options(opts))
        path = Path(opts["results"]) if opts["results"] else \
            Path("results") / f"{req.workload.name}-{req.options.run_id}-mlperf.jsonl"
        with run_status(req, "mlperf", launch) as status:
            outcome = measure(req, path, launch, on_progress=status, on_start=lambda:
                              click.echo(f"mlperf: {req.workload.name}, {opts['iterations']} "
                                         f"checkpoint(s) ({opts['sequence']}) -> "
                                         f"{opts['target']}", err=True))
        if outcome is not None:  # None: MPI ranks other than 0
            report(req, path, opts["scale"], opts["json"])


COMMANDS = [mlperf_command]
