"""`ckptbench plan WORKLOAD`: what each rank writes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from ckptbench.fields import parse_ranks
from ckptbench.plan import Plan, build_plan
from ckptbench.plan.export import iter_plan_json, iter_restore_json, restore_summary, summary
from ckptbench.plan.restore import build_restore_plan
from ckptbench.progress import current, shows_progress
from ckptbench.spec import (
    load_workload,
    scaled,
    with_restore_layout,
)
from ckptbench.units import format_bytes

F = TypeVar("F", bound=Callable[..., Any])


def restore_layout_options(f: F) -> F:
    """--restore-world-size and --restore-layout: the [restore] table from the command line."""
    f = click.option("--restore-layout", default=None, metavar="KEY=N,...",
                     help="Restore layout keys (world_size, tp, pp, dp_replicate, ep), e.g. "
                          "world_size=6,tp=2 [default: the workload's [restore], else its "
                          "[parallel]].")(f)
    f = click.option("--restore-world-size", type=int, default=None, metavar="N",
                     help="Restart on N ranks (the restore layout's world_size).")(f)
    return f


def _mesh(world: int, mesh: dict[str, int]) -> str:
    return (f"world {world:,} = pp {mesh['pp']} x dp_replicate {mesh['dp_replicate']} x "
            f"dp_shard {mesh['dp_shard']} x tp {mesh['tp']}"
            + (f", ep {mesh['ep']}" if mesh["ep"] > 1 else ""))


_size = format_bytes  # '3.691 TiB', '360.2 KiB': binary, four significant digits


def plan_rows(plan_summary: dict[str, Any], full_bytes: int | None, scale: int) -> list[tuple[str, str]]:
    """The plan table's (label, value) rows; `full_bytes`: the unscaled total when scaled."""
    s = plan_summary
    mesh = s["mesh"]
    rb = s["rank_bytes"]
    lf = s["largest_file"]
    rows = [
        ("model / layout", f"{s['model']} / {s['layout']} ({s['files_grouping']} files)"),
        ("mesh", _mesh(s["world_size"], mesh)),
        ("total", f"{s['total_bytes']:,} B ({_size(s['total_bytes'])})"),
        ("files / chunks", f"{s['files']:,} / {s['chunks']:,} (+ manifest {s['manifest']})"),
        ("bytes per rank", f"min {_size(rb['min'])}, median {_size(rb['median'])}, "
                           f"max {_size(rb['max'])}"),
        ("largest file", f"{lf['path']} ({lf['bytes']:,} B, {_size(lf['bytes'])})"),
    ]
    if full_bytes is not None:
        rows.insert(3, ("scale", f"every model dimension / {scale} (the layout kept): "
                                 f"{_size(s['total_bytes'])} of {_size(full_bytes)} at full size"))
    return rows


@click.command("plan")
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the plan as ckptbench.plan/1 JSON.")
@click.option("--ranks", default=None, help="With --json: per-chunk detail only for these ranks (e.g. 0,3 or 0-7).")
@click.option("--scale", type=click.IntRange(min=1), default=1, show_default=True,
              help="Preview `run --scale F`: every model dimension divided by F, the layout kept.")
@click.option("--restore", "restore", is_flag=True,
              help="What each rank of the restore layout reads (ckptbench.restoreplan/1 with --json).")
@restore_layout_options
@shows_progress("plan", "building the plan")
def plan_command(workload: str, as_json: bool, ranks: str | None, scale: int, restore: bool,
                 restore_world_size: int | None, restore_layout: str | None) -> None:
    """Print what each rank writes for WORKLOAD (a TOML workload file); with --restore,
    what each rank of the restore layout reads."""
    full = with_restore_layout(load_workload(workload), restore_world_size, restore_layout)
    plan = build_plan(scaled(full, scale))
    if restore:
        _print_restore(plan, as_json, ranks)
        return
    selected = parse_ranks(ranks, plan.world_size) if ranks else None
    current().phase("writing the plan")
    if as_json:
        out = sys.stdout
        for piece in iter_plan_json(plan, selected):
            out.write(piece)
        return
    s = summary(plan)
    full_bytes = build_plan(full).total_bytes if scale > 1 else None
    rows = plan_rows(s, full_bytes, scale)
    # Labels never wrap; values wrap at spaces, so the table fits the terminal (80
    # columns in a pipe) without cutting a number.
    table = Table(title=f"plan: {s['workload']}" + (f" at scale 1/{scale}" if scale > 1 else ""),
                  show_header=False)
    table.add_column(style="bold", no_wrap=True, min_width=max(len(k) for k, _ in rows))
    table.add_column(overflow="fold")
    for label, value in rows:
        table.add_row(label, value)
    Console().print(table)


def _print_restore(plan: Plan, as_json: bool, ranks: str | None) -> None:
    current().phase("building the restore plan")
    rplan = build_restore_plan(plan)
    current().phase("writing the restore plan")
    selected = parse_ranks(ranks, rplan.world_size) if ranks else None
    if as_json:
        sys.stdout.writelines(iter_restore_json(rplan, selected))
        return
    s = restore_summary(rplan)
    table = Table(title=f"restore plan: {plan.workload.name}", show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    how = "DCP's default load planner" if s["source"] == "dcp" else "DLIO: own files"
    table.add_row("reads as", how)
    table.add_row("restore mesh", _mesh(s["world_size"], s["mesh"]))
    table.add_row("checkpoint", f"{s['checkpoint_bytes']:,} B ({_size(s['checkpoint_bytes'])})")
    table.add_row("read, all ranks", f"{s['read_bytes']:,} B ({_size(s['read_bytes'])}) in "
                  f"{s['reads']:,} reads")
    table.add_row("amplification", f"{s['amplification']:.3f}x (bytes read / checkpoint bytes)")
    rb = s["rank_bytes"]
    table.add_row("per rank min/med/max",
                  f"{_size(rb['min'])} / {_size(rb['median'])} / {_size(rb['max'])}")
    bf = s["busiest_file"]
    table.add_row("busiest file", f"{bf['path']}: {bf['readers']:,} readers "
                  f"(median {s['file_readers_median']:g})")
    Console().print(table)


COMMANDS = [plan_command]
