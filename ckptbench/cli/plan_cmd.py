"""`ckptbench plan WORKLOAD`: what each rank writes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from ckptbench.plan import Plan, build_plan
from ckptbench.plan.export import iter_plan_json, iter_restore_json, restore_summary, summary
from ckptbench.plan.restore import build_restore_plan
from ckptbench.spec import (
    Workload,
    load_workload,
    parse_layout_overrides,
    parse_ranks,
    with_restore,
)

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


def apply_restore_layout(workload: Workload, world_size: int | None,
                         layout: str | None) -> Workload:
    """The workload with the command line's restore layout applied (checked, one line)."""
    overrides = parse_layout_overrides(layout) if layout else {}
    option = "--restore-layout" if layout else "--restore-world-size"
    if world_size is not None:
        overrides["world_size"] = world_size
        option = "--restore-world-size" if not layout else option
    return with_restore(workload, overrides, option)


def _mesh(world: int, mesh: dict[str, int]) -> str:
    return (f"world {world:,} = pp {mesh['pp']} x dp_replicate {mesh['dp_replicate']} x "
            f"dp_shard {mesh['dp_shard']} x tp {mesh['tp']}"
            + (f", ep {mesh['ep']}" if mesh["ep"] > 1 else ""))


def _table(title: str) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(no_wrap=True)
    return table


def _gib(n: float) -> str:
    return f"{n / 2**30:,.3f} GiB"


@click.command("plan")
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the plan as ckptbench.plan/1 JSON.")
@click.option("--ranks", default=None, help="With --json: per-chunk detail only for these ranks (e.g. 0,3 or 0-7).")
@click.option("--restore", "restore", is_flag=True,
              help="What each rank of the restore layout reads (ckptbench.restoreplan/1 with --json).")
@restore_layout_options
def plan_command(workload: str, as_json: bool, ranks: str | None, restore: bool,
                 restore_world_size: int | None, restore_layout: str | None) -> None:
    """Print what each rank writes for WORKLOAD (a TOML workload file); with --restore,
    what each rank of the restore layout reads."""
    w = apply_restore_layout(load_workload(workload), restore_world_size, restore_layout)
    plan = build_plan(w)
    if restore:
        _print_restore(plan, as_json, ranks)
        return
    selected = parse_ranks(ranks, plan.world_size) if ranks else None
    if as_json:
        sys.stdout.writelines(iter_plan_json(plan, selected))
        return
    s = summary(plan)
    table = _table(f"plan: {s['workload']}")
    table.add_row("model / layout", f"{s['model']} / {s['layout']} ({s['files_grouping']} files)")
    table.add_row("mesh", _mesh(s["world_size"], s["mesh"]))
    table.add_row("total", f"{s['total_bytes']:,} B ({_gib(s['total_bytes'])})")
    table.add_row("files / chunks", f"{s['files']:,} / {s['chunks']:,} (+ manifest {s['manifest']})")
    rb = s["rank_bytes"]
    table.add_row("bytes per rank min / median / max",
                  f"{_gib(rb['min'])} / {_gib(rb['median'])} / {_gib(rb['max'])}")
    lf = s["largest_file"]
    table.add_row("largest file", f"{lf['path']} ({lf['bytes']:,} B, {_gib(lf['bytes'])})")
    Console().print(table)


def _print_restore(plan: Plan, as_json: bool, ranks: str | None) -> None:
    rplan = build_restore_plan(plan)
    selected = parse_ranks(ranks, rplan.world_size) if ranks else None
    if as_json:
        sys.stdout.writelines(iter_restore_json(rplan, selected))
        return
    s = restore_summary(rplan)
    table = _table(f"restore plan: {plan.workload.name}")
    how = "DCP's default load planner" if s["source"] == "dcp" else "DLIO: own files"
    table.add_row("reads as", how)
    table.add_row("restore mesh", _mesh(s["world_size"], s["mesh"]))
    table.add_row("checkpoint", f"{s['checkpoint_bytes']:,} B ({_gib(s['checkpoint_bytes'])})")
    table.add_row("read, all ranks", f"{s['read_bytes']:,} B ({_gib(s['read_bytes'])}) in "
                  f"{s['reads']:,} reads")
    table.add_row("amplification", f"{s['amplification']:.3f}x (bytes read / checkpoint bytes)")
    rb = s["rank_bytes"]
    table.add_row("per rank min/med/max",
                  f"{_gib(rb['min'])} / {_gib(rb['median'])} / {_gib(rb['max'])}")
    bf = s["busiest_file"]
    table.add_row("busiest file", f"{bf['path']}: {bf['readers']:,} readers "
                  f"(median {s['file_readers_median']:g})")
    console = Console()
    (console if console.is_terminal else Console(width=120)).print(table)


COMMANDS = [plan_command]
