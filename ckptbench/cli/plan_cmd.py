"""`ckptbench plan WORKLOAD`: what each rank writes."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ckptbench.plan import build_plan
from ckptbench.plan.export import iter_plan_json, summary
from ckptbench.spec import load_workload, parse_ranks, scaled
from ckptbench.units import format_size


def _size(n: float) -> str:
    """'3.691 TiB', '360.2 KiB': four significant digits at any scale."""
    text = format_size(n)
    number = text.rstrip("KMGTPEiB")
    return f"{number} {text[len(number):]}"


def plan_rows(plan_summary: dict[str, Any], full_bytes: int | None, scale: int) -> list[tuple[str, str]]:
    """The plan table's (label, value) rows; `full_bytes`: the unscaled total when scaled."""
    s = plan_summary
    mesh = s["mesh"]
    rb = s["rank_bytes"]
    lf = s["largest_file"]
    rows = [
        ("model / layout", f"{s['model']} / {s['layout']} ({s['files_grouping']} files)"),
        ("mesh", f"world {s['world_size']:,} = pp {mesh['pp']} x dp_replicate "
                 f"{mesh['dp_replicate']} x dp_shard {mesh['dp_shard']} x tp {mesh['tp']}"
                 + (f", ep {mesh['ep']}" if mesh["ep"] > 1 else "")),
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
def plan_command(workload: str, as_json: bool, ranks: str | None, scale: int) -> None:
    """Print what each rank writes for WORKLOAD (a TOML workload file)."""
    full = load_workload(workload)
    plan = build_plan(scaled(full, scale))
    selected = parse_ranks(ranks, plan.world_size) if ranks else None
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


COMMANDS = [plan_command]
