"""Output that fits where it goes: JSON alone on stdout, tables within 80 columns in a
pipe (and under mpirun) with every number whole, the full width when asked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from ckptbench.plan import build_plan
from ckptbench.report import load
from ckptbench.report.table import Column, Grid, render, split, table_width
from ckptbench.spec import load_workload, scaled
from tests.report.conftest import ROOT, TINY, Runs, ckptbench
from tests.runner.test_mpi import mpirun, needs_mpi

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def lines(text: str) -> list[str]:
    return [ANSI.sub("", line) for line in text.splitlines()]


def whole(value: str, text: str) -> bool:
    """`value` appears with no digit or point glued to either side (not cut, not a part)."""
    return re.search(rf"(?<![\d.]){re.escape(value)}(?![\d.])", text) is not None


def summary_numbers(path: Path) -> list[str]:
    """The numbers a summary table must show, as it formats them."""
    out = []
    for s in load(str(path))["summary"]:
        lat = s["latency"].get("write" if s["phase"] == "save" else "read") or \
            s["latency"]["write_shard" if s["phase"] == "save" else "read_shard"]
        out += [f"{s['throughput_bytes_per_s'] / 1e9:.3f}", f"{s['seconds']:.3f}",
                f"{s['throughput_min'] / 1e9:.3f}-{s['throughput_max'] / 1e9:.3f}",
                f"{s['slowest_rank_seconds_max']:.3f}", f"{s['first_to_last_gap_s_median']:.3f}",
                f"{lat['p50_s'] * 1e3:.2f}", f"{lat['p99_s'] * 1e3:.2f}"]
    return out


def assert_fits(text: str, width: int) -> None:
    shown = lines(text)
    too_wide = [line for line in shown if len(line) > width]
    assert not too_wide, f"{len(too_wide)} lines wider than {width}: {too_wide[0]!r}"
    assert "…" not in text, "a cell was cut"


def test_run_json_is_alone_on_stdout(three_runs: Runs) -> None:
    for done in three_runs.printed[:2]:
        out = json.loads(done.stdout)  # nothing before or after the JSON
        assert set(out) == {"results", "summary"}
        assert [s["phase"] for s in out["summary"]] == ["save", "restore"]
        assert "tiny: 4 of 4 ranks" in done.stderr and "tiny:" not in done.stdout


def test_run_table_fits_a_pipe_and_names_its_statistics(three_runs: Runs) -> None:
    out = three_runs.printed[2].stdout
    assert_fits(out, 80)
    for value in summary_numbers(three_runs.paths[2]):
        assert whole(value, out), value
    assert "med" in out and "worst" in out and "median over iterations" in out
    assert "stored bytes" in out  # the zarr run's stored-bytes table
    assert out.rstrip().endswith(f"results: {three_runs.paths[2]}")


def test_report_of_three_runs_fits_80_columns_with_the_options_that_differ(three_runs: Runs) -> None:
    done = ckptbench("report", *map(str, three_runs.paths))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert_fits(out, 80)
    assert "(1 of " in out  # too wide for 80 columns: split, not cut
    for path in three_runs.paths:
        for value in summary_numbers(path):
            assert whole(value, out), (path.name, value)
    header = " ".join(lines(out)[:6])
    assert re.search(r"\bio\b", header) and "format" in header
    assert all(v in out for v in ("buffered", "direct", "zarr"))
    assert "same in all runs: workload=tiny" in out.replace("\n", " ")


def test_report_wide_and_width(three_runs: Runs) -> None:
    wide = ckptbench("report", *map(str, three_runs.paths), "--wide").stdout
    assert "(1 of " not in wide and max(len(x) for x in lines(wide)) > 80
    assert "…" not in wide
    for value in summary_numbers(three_runs.paths[0]):
        assert whole(value, wide), value
    assert_fits(ckptbench("report", *map(str, three_runs.paths), "--width", "100").stdout, 100)


def test_split_tables_fit_every_width_and_show_each_column_once() -> None:
    cols = (Column("run", key=True, numeric=False), Column("phase", key=True, numeric=False),
            *(Column(f"n{i}", "med") for i in range(12)), Column("text", numeric=False))
    rows = tuple(("#1", "restore", *(f"{123456.789 * (i + 1):.3f}" for i in range(12)),
                  "fadvise+drop_caches and more words") for _ in range(3))
    grid = Grid("title", cols, rows, ("a note " * 30,))
    for width in range(40, 260, 9):
        parts = split(grid, width)
        assert all({0, 1} <= {i for i, _ in p} for p in parts)
        assert sorted(i for p in parts for i, _ in p if i > 1) == list(range(2, len(cols)))
        assert all(table_width([w for _, w in p]) <= width for p in parts)
        console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
        render(console, grid, width)
        text = console.export_text()
        assert_fits(text, width)
        assert all(whole(v, text) for v in rows[0][2:14])


def test_plan_fits_80_columns_and_previews_a_scaled_run() -> None:
    for name in ("llama4-maverick-ep.toml", "mlperf-llama3-1t.toml"):  # the widest rows
        done = ckptbench("plan", str(ROOT / "workloads" / name))
        assert done.returncode == 0, done.stderr
        assert_fits(done.stdout, 80)
        assert whole(f"{build_plan(load_workload(ROOT / 'workloads' / name)).total_bytes:,}",
                     done.stdout)
    small = build_plan(scaled(load_workload(TINY), 2)).total_bytes
    assert small < build_plan(load_workload(TINY)).total_bytes
    done = ckptbench("plan", str(TINY), "--scale", "2")
    assert "scale 1/2" in done.stdout and whole(f"{small:,}", done.stdout)
    assert json.loads(ckptbench("plan", str(TINY), "--scale", "2", "--json").stdout)["total_bytes"] == small


@needs_mpi
@pytest.mark.slow
def test_under_mpirun_json_is_alone_and_the_table_is_plain_and_fits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done, _ = mpirun(2, str(TINY), "--target", str(tmp_path / "t"), "--results",
                     str(tmp_path / "a.jsonl"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["results"] == str(tmp_path / "a.jsonl")
    # The last line names the results file as given: a short one, whatever tmp_path is
    # (a path is never wrapped, and pytest-xdist's are long).
    monkeypatch.chdir(tmp_path)
    done, _ = mpirun(2, str(TINY), "--target", "t", "--results", "b.jsonl")
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout  # mpirun hands ranks a pseudo-terminal: no styles
    assert_fits(done.stdout, 80)
    for value in summary_numbers(tmp_path / "b.jsonl"):
        assert whole(value, done.stdout), value
