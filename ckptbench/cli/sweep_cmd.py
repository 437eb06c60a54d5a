"""`ckptbench sweep`: one workload at several ranks per node, so the per-node curve (and
where the node saturates) is measured rather than assumed.

Each point runs the workload's first K plan ranks on this node, in process (the library's
`build_request` + `measure`, as `ckptbench run` does), into its own results file; a sweep
file lists them for `ckptbench cadence --results`, which uses the point whose ranks per
node match the target's.
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
from ckptbench.cli.backend_options import backend_options, options_for_target, typed_backend_flags
from ckptbench.cli.output_file import check_output_path, save_figure
from ckptbench.errors import SpecError
from ckptbench.measure import build_request, measure, run_status
from ckptbench.payload import MODES
from ckptbench.report import throughput
from ckptbench.runner import new_run_id
from ckptbench.spec import load_workload
from ckptbench.units import CONVENTION, format_bytes, gbps, parse_size


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
    """Per-node GB/s against ranks per node (log 2), with linear scaling from the first point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [p.ranks_per_node for p in points]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    save = [p.save_node_bytes_per_s / 1e9 for p in points]
    ax.plot(ks, save, "o-", label="save")
    if all(p.restore_node_bytes_per_s for p in points):
        ax.plot(ks, [(p.restore_node_bytes_per_s or 0) / 1e9 for p in points], "s-", label="restore")
    ax.plot(ks, [save[0] * k / ks[0] for k in ks], "k:", label="save, linear from the first point")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("ranks per node")
    ax.set_ylabel("GB/s per node, data only")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    save_figure(fig, path, force)


@click.command("sweep")
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--ranks-per-node", "counts", default="1,2,4,8", show_default=True,
              help="Points of the sweep: each runs the workload's first K plan ranks on this node.")
@click.option("--target", default="ckptbench-data", show_default=True,
              help="Where checkpoints go (as for `ckptbench run`).")
@click.option("--iterations", type=click.IntRange(min=1), default=jobmodel.MIN_SAMPLES,
              show_default=True, help="Iterations per point (the job model's spread needs 5).")
@click.option("--scale", type=click.IntRange(min=1), default=1, show_default=True,
              help="Divide every model dimension by F (keeps the layout).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="I/O threads per rank [default: the workload's checkpoint.threads].")
@click.option("--block-size", default="8MiB", show_default=True, help="Bytes per write/read call.")
@click.option("--payload", type=click.Choice(MODES), default="random", show_default=True)
@click.option("--cache", type=click.Choice(["auto", "none"]), default="auto", show_default=True,
              help="auto: evict the checkpoint from caches before restoring.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the results files and the sweep file "
                   "[default: results/<workload>-sweep-<time>].")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG of GB/s per node (data only) against ranks per node (a new "
                   ".png file).")
@click.option("--force", is_flag=True, help="Replace a file or link at --plot.")
@backend_options
@click.option("--json", "as_json", is_flag=True, help="Print the sweep's points as JSON.")
def sweep_command(workload: str, counts: str, target: str, iterations: int, scale: int,
                  threads: int | None, block_size: str, payload: str, cache: str,
                  out: Path | None, plot_path: Path | None, force: bool, as_json: bool,
                  **_backend_values: Any) -> None:  # read as typed_backend_flags
    """Run WORKLOAD at several ranks per node; one results file per point and a sweep file."""
    if plot_path is not None:  # refused before the sweep, not after it
        check_output_path(plot_path, "--plot", ".png", force, [Path(workload)])
    given = typed_backend_flags(click.get_current_context())
    backend = options_for_target(target, given)
    full = load_workload(workload)
    ks = parse_counts(counts, full.parallel.world_size)
    out = out or Path("results") / f"{full.name}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    sweep_file = out / f"{full.name}-sweep.jsonl"
    if sweep_file.exists():
        raise SpecError(f"--out {out}: holds a sweep already (never overwritten)")
    options: dict[str, Any] = dict(iterations=iterations,
                                   block_size=parse_size(block_size, "--block-size"),
                                   payload=payload, cache=cache)
    if threads:
        options["threads"] = threads
    points: list[jobmodel.SweepPoint] = []
    measured: list[jobmodel.Measurement] = []
    for k in ks:
        name = f"{full.name}-rpn{k}.jsonl"
        req = build_request(workload, target, scale=scale, ranks=list(range(k)),
                            backend_options=backend, run_id=f"{new_run_id()}-rpn{k}", **options)
        click.echo(f"{full.name}: {k} rank(s) per node, {iterations} iteration(s) -> {out / name}",
                   err=True)
        with run_status(req, f"sweep, {k} rank(s) per node") as status:
            measure(req, out / name, on_progress=status)
        measured.append(jobmodel.read_results(out / name, "sweep"))
        points.append(jobmodel.SweepPoint.of(measured[-1], name))
    jobmodel.write_sweep(sweep_file, {"workload": full.name, "scale": scale,
                                      "iterations": iterations, "target": target}, points)
    if plot_path is not None:
        plot_curve(plot_path, points, full.name + (f", scale {scale}" if scale > 1 else ""),
                   force)
    if as_json:
        click.echo(json.dumps({"sweep": str(sweep_file),
                               "points": [p.__dict__ for p in points]}, indent=2))
        return
    console = Console()
    if plot_path is not None:
        click.echo(f"plot written to {plot_path}")
    render(console if console.is_terminal else Console(width=120), points, measured)
    click.echo(f"sweep: {sweep_file}")


COMMANDS = [sweep_command]
