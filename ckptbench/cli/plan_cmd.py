"""`ckptbench plan WORKLOAD`: what each rank writes."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from ckptbench.plan import build_plan
from ckptbench.plan.export import iter_plan_json, summary
from ckptbench.spec import load_workload, parse_ranks


def _gib(n: float) -> str:
    return f"{n / 2**30:,.3f} GiB"


@click.command("plan")
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the plan as ckptbench.plan/1 JSON.")
@click.option("--ranks", default=None, help="With --json: per-chunk detail only for these ranks (e.g. 0,3 or 0-7).")
def plan_command(workload: str, as_json: bool, ranks: str | None) -> None:
    """Print what each rank writes for WORKLOAD (a TOML workload file)."""
    plan = build_plan(load_workload(workload))
    selected = parse_ranks(ranks, plan.world_size) if ranks else None
    if as_json:
        out = sys.stdout
        for piece in iter_plan_json(plan, selected):
            out.write(piece)
        return
    s = summary(plan)
    table = Table(title=f"plan: {s['workload']}", show_header=False)
    table.add_column(style="bold")
    table.add_column(no_wrap=True)
    mesh = s["mesh"]
    table.add_row("model / layout", f"{s['model']} / {s['layout']} ({s['files_grouping']} files)")
    table.add_row("mesh", f"world {s['world_size']:,} = pp {mesh['pp']} x dp_replicate "
                  f"{mesh['dp_replicate']} x dp_shard {mesh['dp_shard']} x tp {mesh['tp']}"
                  + (f", ep {mesh['ep']}" if mesh["ep"] > 1 else ""))
    table.add_row("total", f"{s['total_bytes']:,} B ({_gib(s['total_bytes'])})")
    table.add_row("files / chunks", f"{s['files']:,} / {s['chunks']:,} (+ manifest {s['manifest']})")
    rb = s["rank_bytes"]
    table.add_row("bytes per rank min / median / max",
                  f"{_gib(rb['min'])} / {_gib(rb['median'])} / {_gib(rb['max'])}")
    lf = s["largest_file"]
    table.add_row("largest file", f"{lf['path']} ({lf['bytes']:,} B, {_gib(lf['bytes'])})")
    Console().print(table)


COMMANDS = [plan_command]
