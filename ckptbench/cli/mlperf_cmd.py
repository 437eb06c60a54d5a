"""`ckptbench mlperf`: an MLPerf Storage v2.0 checkpointing run, reported both ways."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ckptbench.measure import build_request, measure
from ckptbench.mlperf import CHECKPOINTS, GIB, Comparison, compare, facts, rules
from ckptbench.records import read_records
from ckptbench.report import table as report_table
from ckptbench.units import parse_size


def _row(table: Table, c: Comparison) -> None:
    for way, stat, what in (
            ("MLPerf v2.0", c.mlperf, "rank 0's clock, no fsync, tensor bytes"),
            ("MLPerf v2.0 + fsync", c.mlperf_with_fsync, "rank 0's clock as run here"),
            ("ckptbench", c.ckptbench, "all ranks to the commit, fsync" if c.phase == "save"
             else "manifest to the last rank's read, verified")):
        table.add_row(c.phase, way, f"{stat.mean:.3f}", f"{stat.stdev:.3f}",
                      f"{max(stat.seconds):.3f}" if stat.seconds else "-", what)
    table.add_row(c.phase, "ratio MLPerf / ckptbench", f"{c.ratio:.2f}x", "", "", "")


def render(comparisons: list[Comparison], lines: list[str]) -> None:
    console = report_table.console_for(report_table.output_width(False, None))
    table = Table(title="MLPerf Storage v2.0 way vs ckptbench way (GiB/s = 2^30 B/s, "
                        "mean and stdev over checkpoints)")
    for col in ("phase", "way", "GiB/s mean", "stdev", "max s", "what is timed"):
        table.add_column(col, justify="left" if col in ("phase", "way", "what is timed")
                         else "right")
    for c in comparisons:
        _row(table, c)
    console.print(table)
    c0 = comparisons[0]
    click.echo(f"tensor bytes per checkpoint: {c0.tensor_bytes / GIB:.3f} GiB; torch.save "
               f"containers: {c0.container_bytes / GIB:.3f} GiB "
               f"(+{c0.container_bytes - c0.tensor_bytes} B)")
    click.echo("CLOSED-submission rules (mlpstorage v2.0):")
    for line in lines:
        click.echo(f"  {line}")


@click.command("mlperf")
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--target", default="ckptbench-data", show_default=True,
              help="Where checkpoints go (a directory or URL, as for `run`).")
@click.option("--iterations", type=click.IntRange(min=1), default=CHECKPOINTS, show_default=True,
              help="Checkpoints written and read (CLOSED: 10).")
@click.option("--scale", type=click.IntRange(min=1), default=1, show_default=True,
              help="Divide every model dimension by F (not a CLOSED run).")
@click.option("--ranks", default=None, help="Plan ranks to run, e.g. 0-7 (subset mode).")
@click.option("--block-size", default="8MiB", show_default=True, help="Bytes per write/read call.")
@click.option("--cache", type=click.Choice(["auto", "none"]), default="auto", show_default=True,
              help="auto: evict before reading (cold); none: read what the page cache holds, "
                   "as DLIO does in one invocation.")
@click.option("--results", type=click.Path(dir_okay=False), default=None,
              help="Results file [default: results/<workload>-<run id>-mlperf.jsonl].")
@click.option("--json", "as_json", is_flag=True, help="Print both views and the rules as JSON.")
def mlperf_command(workload: str, target: str, iterations: int, scale: int, ranks: str | None,
                   block_size: str, cache: str, results: str | None, as_json: bool) -> None:
    """Run WORKLOAD (an MLPerf llama3 workload) as MLPerf Storage v2.0 does: DLIO's
    torch.save files, one thread per rank, and report it MLPerf's way next to ckptbench's,
    with the ratio and the CLOSED rules the run breaks."""
    req = build_request(workload, target, scale=scale, ranks=ranks, iterations=iterations,
                        threads=1, format="torch-save", cache=cache,
                        block_size=parse_size(block_size, "--block-size"))
    path = Path(results) if results else \
        Path("results") / f"{req.workload.name}-{req.options.run_id}-mlperf.jsonl"
    measure(req, path)
    records = list(read_records(path))
    tensor_bytes = req.plan.bytes_of_ranks(req.ranks)
    comparisons = [compare(records, p, tensor_bytes) for p in ("save", "restore")]
    lines = [r.line() for r in rules(facts(
        records, workload=req.workload.name, world_size=req.plan.world_size,
        ranks=len(req.ranks), scale=scale, iterations=iterations,
        bytes_per_checkpoint=comparisons[0].container_bytes))]
    if as_json:
        out: dict[str, Any] = {"results": str(path), "phases": [
            {"phase": c.phase, "ratio": c.ratio, "tensor_bytes": c.tensor_bytes,
             "container_bytes": c.container_bytes,
             **{way: {"gibps_mean": s.mean, "gibps_stdev": s.stdev, "gibps": s.gibps,
                      "seconds": s.seconds}
                for way, s in (("mlperf", c.mlperf), ("mlperf_with_fsync", c.mlperf_with_fsync),
                               ("ckptbench", c.ckptbench))}} for c in comparisons],
            "rules": lines}
        click.echo(json.dumps(out, indent=2))
        return
    render(comparisons, lines)
    click.echo(f"results: {path}")


COMMANDS = [mlperf_command]
