"""`ckptbench report`: parse, call the library (report, cadence.job), render."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import click

from ckptbench.cadence.failures import FAILURE_PRESETS
from ckptbench.cadence.job import JobAnswer, job_answers, job_grid
from ckptbench.cadence.levels_report import TierCadence, tier_cadences
from ckptbench.cadence.levels_scale import STATED_FOOTING, Footing, parse_footing
from ckptbench.cli.footing_options import footing_option_list
from ckptbench.cli.output_file import check_output_path, write_bytes
from ckptbench.cli.run_cmd import width_options
from ckptbench.errors import SpecError
from ckptbench.progress import current, shows_progress
from ckptbench.report import load, table
from ckptbench.report.tiers_table import render_tiers, tier_grids


def footing_options(f: Any) -> Any:
    """--footing, --node-memory-bandwidth and --node-network: how a tiered run's levels are
    scaled to the job (as in `levels`), passed on as one `footing` tuple of their texts."""
    @functools.wraps(f)
    def packed(*args: Any, footing: str | None, node_memory_bandwidth: str | None,
               node_network: str | None, **kwargs: Any) -> Any:
        return f(*args, footing=(footing, node_memory_bandwidth, node_network), **kwargs)

    for option in reversed(footing_option_list("With --failure-preset, for a tiered run")):
        packed = option(packed)
    return packed


@click.command("report")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print summaries and per-iteration figures as JSON.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Also write a self-contained HTML report (figures inside) to this file; "
                   "-: to standard output, instead of the table.")
@click.option("--plots", "plots_dir", type=click.Path(file_okay=False), default=None,
              help="Also write each figure as a PNG into this directory.")
@click.option("--force", is_flag=True,
              help="Replace a file or link at --html and the PNGs in --plots (never an input).")
@click.option("--failure-preset", type=click.Choice(list(FAILURE_PRESETS)), default=None,
              help="Add what the job will see: each run's full-size workload as the job, "
                   "interrupted at this published rate (as `cadence --failure-preset`): C and R "
                   "by part, the interval and the goodput.")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="With --failure-preset: the job's GPUs [default: the workload's world_size].")
@footing_options
@width_options
@shows_progress("report", "reading the results")
def report_command(results: tuple[str, ...], as_json: bool, html_path: str | None,
                   plots_dir: str | None, force: bool, failure_preset: str | None,
                   gpus: int | None, footing: tuple[str | None, str | None, str | None],
                   wide: bool, width: int | None) -> None:
    """Summarize one or more results files (several: side by side, labelled by the options
    that differ); --html and --plots draw each run's timeline, throughput and latency;
    --failure-preset adds what the job will see."""
    from ckptbench.report.data import load_runs

    page_out = html_path == "-"
    if page_out and as_json:
        raise SpecError("--html - and --json both write to standard output; allowed: one of them")
    if gpus is not None and failure_preset is None:
        raise SpecError("--gpus needs --failure-preset (the job's failures); allowed: add "
                        f"--failure-preset {next(iter(FAILURE_PRESETS))}, or drop --gpus")
    scaled_by = _footing(*footing, failure_preset)
    inputs = [Path(p) for p in results]
    if html_path and not page_out:  # refused before anything is read or drawn
        check_output_path(Path(html_path), "--html", None, force, inputs)
    draw = bool(html_path or plots_dir)
    runs = load_runs(results) if draw else []  # the op columns only when drawing
    loaded = [r.view for r in runs] if draw else [load(p) for p in results]
    if draw:
        from ckptbench.report import figures

        for where, option in ((html_path and not page_out and Path(html_path).parent,
                               f"--html {html_path}:"), (plots_dir, "--plots")):
            if where:
                figures.output_dir(where, option)  # refused before minutes of drawing
        for png in figures.plot_paths(runs, plots_dir) if plots_dir else ():
            check_output_path(png, "--plots", ".png", force, inputs)
    current().phase("modelling the job" if failure_preset else "printing the summary")
    answers = job_answers(list(results), failure_preset, gpus) if failure_preset else None
    cadences = tier_cadences(loaded, failure_preset, gpus, scaled_by) if failure_preset else []
    closed = None
    try:
        if as_json:
            click.echo(json.dumps(_json(loaded, answers), indent=2))
        elif not page_out:
            w = table.output_width(wide, width)
            console = table.console_for(w)
            _print_tables(console, loaded, (answers, cadences), w)
    except table.ClosedOutput as exc:  # the page and the plots are still written
        closed = exc
    except BrokenPipeError:
        closed = table.closed_stdout("the JSON")
    if draw:
        _draw(runs, html_path, plots_dir, force, (answers, cadences))
    if closed is not None:
        raise closed


def _footing(footing: str | None, memory: str | None, network: str | None,
             failure_preset: str | None) -> Footing:
    """--footing, --node-memory-bandwidth and --node-network as the footing a tiered run's
    levels are scaled to the job on (levels_scale.parse_footing)."""
    if footing is None and memory is None and network is None:
        return STATED_FOOTING
    if failure_preset is None:
        flag = next(f for f, v in (("--footing", footing), ("--node-memory-bandwidth", memory),
                                   ("--node-network", network)) if v is not None)
        raise SpecError(f"{flag} needs --failure-preset (it scales a tiered run's levels to "
                        f"the job); allowed: add --failure-preset llama3, or drop {flag}")
    return parse_footing(footing, memory, network)


def _print_tables(console: Any, loaded: list[dict[str, Any]],
                  job: tuple[list[JobAnswer | str] | None, list[TierCadence]],
                  width: int | None) -> None:
    """The summary, the tiers and their cadence, and what the job will see."""
    answers, cadences = job
    table.render_summary(console, loaded, width)
    render_tiers(console, loaded, width)
    for cadence in cadences:
        table.render(console, cadence.grid, width)
    if answers is not None:
        table.render(console, job_grid(answers), width)


def _json(loaded: list[dict[str, Any]], answers: list[JobAnswer | str] | None) -> list[Any]:
    out = [{k: v for k, v in r.items() if k != "run"} for r in loaded]
    for entry, a in zip(out, answers or [], strict=False):
        entry["job"] = {"error": a} if isinstance(a, str) else a.to_dict()
    return out


def _draw(runs: Any, html_path: str | None, plots_dir: str | None, force: bool,
          job: tuple[list[JobAnswer | str] | None, list[TierCadence]]) -> None:
    """--html (a file created exclusively, or - for standard output) and --plots: the
    figures drawn once."""
    from ckptbench.report import figures, html

    current().phase("drawing the figures")
    drawn = figures.draw(runs)
    if html_path:
        current().phase("writing the page")
        answers, cadences = job
        tiers = [grid for run in runs for grid in tier_grids(run.view)]
        tiers += [c.grid for c in cadences]
        page = html.render_html(drawn, job_grid(answers) if answers is not None else None,
                                (tiers, [c.picture(f"levels-{i}")
                                         for i, c in enumerate(cadences, 1)]))
        if html_path == "-":
            table.write_stdout(page.encode("utf-8"), "the page (--html -)")
        else:
            write_bytes(Path(html_path), "--html", force, page.encode("utf-8"))
            click.echo(f"html report: {html_path}", err=True)
    for path, png in figures.plot_files(drawn, plots_dir) if plots_dir else ():
        write_bytes(path, "--plots", force, png)
        click.echo(f"plot: {path}", err=True)


COMMANDS = [report_command]
