"""`ckptbench sweep`: one workload at several ranks per node, so the per-node curve (and
where the node saturates) is measured rather than assumed.

Each point runs the workload's first K plan ranks on this node, in process (the library's
`build_request` + `measure`, as `ckptbench run` does), into its own results file; under
mpirun or srun, K MPI ranks on every node of the launch (the first K x nodes plan ranks;
the node's other processes wait). A sweep file lists the points for `ckptbench cadence
--results`, which uses the point whose ranks per node match the target's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ckptbench import jobmodel
from ckptbench.backends import BackendOptions
from ckptbench.cli.backend_options import backend_options, options_for_target, typed_backend_flags
from ckptbench.cli.output_file import check_output_path, save_figure
from ckptbench.cli.run_cmd import quiet_unless_root
from ckptbench.cli.run_options import GroupedCommand, run_options, settings
from ckptbench.errors import SpecError
from ckptbench.measure import build_request, measure_per_node
from ckptbench.report import plots, throughput
from ckptbench.runner import Launcher, RunRequest, new_run_id, open_launcher
from ckptbench.runspec import read_benchmark_file, request_options
from ckptbench.spec import Workload, load_workload
from ckptbench.units import CONVENTION, format_bytes, gbps


def parse_counts(text: str, world_size: int) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]: distinct, each from 1 to the workload's world size."""
    counts: list[int] = []
    for part in text.split(","):
        try:
            k = int(part)
        except ValueError:
            raise SpecError(f"--ranks-per-node {text!r}: {part.strip()!r} is not an integer"
                            " (allowed: e.g. 1,2,4,8)") from None
        if not 1 <= k <= world_size:
            raise SpecError(f"--ranks-per-node {text!r}: {k} is outside 1-{world_size}"
                            f" (the workload's world_size)")
        if k not in counts:
            counts.append(k)
    return sorted(counts)


def render(console: Console, points: list[jobmodel.SweepPoint],
           measured: list[jobmodel.Measurement]) -> None:
    """The per-node curve (per node, data only, and per rank at each point), each point's
    throughput as `run` prints it, and where the node saturates."""
    table = Table(title="per-node curve")
    for col in ("ranks/node", "bytes/rank", "save\nthroughput\nGB/s",
                "save GB/s\nper node,\ndata only", "per rank", "restore\nthroughput\nGB/s",
                "restore GB/s\nper node,\ndata only", "per rank"):
        table.add_column(col, justify="right")
    for p in points:
        k = p.ranks_per_node
        restore = p.restore_node_bytes_per_s
        table.add_row(str(k), format_bytes(p.bytes_per_rank), gbps(p.save_bytes_per_s),
                      gbps(p.save_node_bytes_per_s), gbps(p.save_node_bytes_per_s / k),
                      gbps(p.restore_bytes_per_s), gbps(restore),
                      gbps(None if restore is None else restore / k))
    console.print(table)
    for p, m in zip(points, measured, strict=True):
        for measured_phase in (m.save, m.restore):
            if measured_phase is not None and measured_phase.headline:
                console.print(f"{p.ranks_per_node} rank(s) per node: {measured_phase.headline}",
                              markup=False, highlight=False, soft_wrap=True)
    console.print(f"{throughput.DEFINITION}. {throughput.PER_NODE_DEFINITION}; per rank: per"
                  f" node / ranks per node. {CONVENTION}.", markup=False, highlight=False)
    for phase in ("save", "restore"):
        knee = jobmodel.saturation(points, phase)
        if knee is not None:
            console.print(f"{phase}: the node saturates at about {knee.ranks_per_node} ranks per"
                          f" node (more ranks add < {100 * (jobmodel.sweep.SATURATION_GAIN - 1):.0f} %"
                          " per node)")


def plot_curve(path: Path, points: list[jobmodel.SweepPoint], title: str,
               force: bool = False) -> None:
    """Per-node GB/s against ranks per node, written to a new .png (or replaced: force)."""
    restore = [(p.restore_node_bytes_per_s or 0) / 1e9 for p in points] \
        if all(p.restore_node_bytes_per_s for p in points) else None
    save_figure(plots.per_node_figure([p.ranks_per_node for p in points],
                                      [p.save_node_bytes_per_s / 1e9 for p in points],
                                      restore, title), path, force)


@click.command("sweep", cls=GroupedCommand)
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--ranks-per-node", "counts", default="1,2,4,8", show_default=True,
              help="Points of the sweep: each runs the workload's first K plan ranks on this "
                   "node (under mpirun/srun: K ranks on each node, at most the processes "
                   "started per node).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the results files and the sweep file "
                   "[default: results/<workload>-sweep-<time>].")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG of GB/s per node (data only) against ranks per node (a new "
                   ".png file).")
@click.option("--force", is_flag=True, help="Replace a file or link at --plot.")
@run_options("sweep")
@backend_options
def sweep_command(workload: str, counts: str, out: Path | None, plot_path: Path | None,
                  force: bool, **_values: Any) -> None:
    """Run WORKLOAD at several ranks per node; one results file per point and a sweep file.
    The workload file's [run] table sets the options it takes (as for `run`)."""
    if plot_path is not None:  # refused before the sweep, not after it
        check_output_path(plot_path, "--plot", ".png", force, [Path(workload)])
    ctx = click.get_current_context()
    bench = read_benchmark_file(workload)
    opts = settings(ctx, "sweep", bench.table, f"{bench.path}: [run]")
    backend = options_for_target(opts["target"], typed_backend_flags(ctx))
    full = load_workload(bench.workload)
    ks = parse_counts(counts, full.parallel.world_size)
    launch = open_launcher(opts["launcher"])
    with quiet_unless_root(launch):
        out = launch.share(out or Path("results") / f"{full.name}-sweep-"
                           f"{time.strftime('%Y%m%d-%H%M%S')}")
        sweep_file = out / f"{full.name}-sweep.jsonl"
        if sweep_file.exists():
            raise SpecError(f"--out {out}: holds a sweep already (never overwritten)")
        points = _measure_points(launch, full, ks, opts, backend, out)
    if not launch.root:
        return
    scale = opts["scale"]
    jobmodel.write_sweep(sweep_file, {"workload": full.name, "scale": scale,
                                      "iterations": opts["iterations"],
                                      "target": opts["target"]}, points)
    if plot_path is not None:
        plot_curve(plot_path, points, full.name + (f", scale {scale}" if scale > 1 else ""),
                   force)
    if opts["json"]:
        click.echo(json.dumps({"sweep": str(sweep_file),
                               "points": [p.__dict__ for p in points]}, indent=2))
        return
    console = Console()
    if plot_path is not None:
        click.echo(f"plot written to {plot_path}")
    render(console if console.is_terminal else Console(width=120), points,
           [jobmodel.read_results(out / p.results, "sweep") for p in points])
    click.echo(f"sweep: {sweep_file}")


def _measure_points(launch: Launcher, full: Workload, ks: list[int], opts: dict[str, Any],
                    backend: BackendOptions, out: Path) -> list[jobmodel.SweepPoint]:
    """Collective: each point measured into its own results file (process 0's points)."""
    points: list[jobmodel.SweepPoint] = []
    for k in ks:
        name = f"{full.name}-rpn{k}.jsonl"

        def request(ranks: list[int], k: int = k) -> RunRequest:
            if len(ranks) > full.parallel.world_size:
                raise SpecError(f"--ranks-per-node {k}: {len(ranks) // k} nodes x {k} = "
                                f"{len(ranks)} ranks, the workload has "
                                f"{full.parallel.world_size}; allowed: at most "
                                f"{full.parallel.world_size * k // len(ranks)} per node")
            return build_request(full, command="sweep", ranks=ranks, backend_options=backend,
                                 run_id=f"{new_run_id()}-rpn{k}", **request_options(opts))
        if launch.root:
            click.echo(f"{full.name}: {k} rank(s) per node, {opts['iterations']} iteration(s) "
                       f"-> {out / name}", err=True)
        measure_per_node(launch, k, request, out / name, "sweep")
        if launch.root:
            points.append(jobmodel.SweepPoint.of(jobmodel.read_results(out / name, "sweep"),
                                                 name))
    return points


COMMANDS = [sweep_command]
