"""A report worth sharing (issue 31), on real runs a user compares (local sync, local
async, S3 on a real MinIO): short plain labels, tables that fit 1,280 px in a real
Chromium, the job's interval and goodput, the async loop's figure, and the page on
standard output with a closed pipe said in one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckptbench.report import compare
from ckptbench.report.data import load_runs
from tests.report.chromium import visit
from tests.report.conftest import Runs, ckptbench
from tests.report.test_html_report import assert_drawn, chromium  # noqa: F401 (fixture)

LABELS = ["local, sync", "local, async", "S3 (botocore), sync"]


def test_labels_are_the_differing_options_in_plain_words(mixed_runs: Runs, tmp_path: Path) -> None:
    runs = load_runs([str(p) for p in mixed_runs.paths])
    assert [r.label for r in runs] == LABELS
    page = tmp_path / "r.html"
    done = ckptbench("report", *map(str, mixed_runs.paths), "--html", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert re.findall(r"<h2>(#\d[^<]*)</h2>", text) == [f"#{i} {x}" for i, x in
                                                        enumerate(LABELS, 1)]
    assert "=-" not in text and "=-" not in done.stdout
    # the S3 run's own options are no difference from a local run's missing ones
    assert "connect-timeout" not in done.stdout and "endpoint-url" not in done.stdout
    header = next(line for line in done.stdout.splitlines() if "phase" in line)
    assert "backend" in header and "mode" in header


def test_an_option_one_run_lacks_is_said_in_words() -> None:
    old = {"workload": {"name": "tiny"}, "options": {"format": "raw"}}
    new = {**old, "options": {"format": "raw", "threads": 4}}
    assert compare.labels([old, new]) == ["threads not recorded", "4 threads"]
    local = {**old, "environment": {"target": {"backend": "local", "options": {"io": "direct"}}}}
    other = {**old, "environment": {"target": {"backend": "local", "options": {"io": "buffered"}}}}
    s3 = {**old, "environment": {"target": {"backend": "s3",
                                            "options": {"transport": "crt", "part_size": 8}}}}
    assert compare.labels([local, other, s3]) == ["local, O_DIRECT", "local, buffered",
                                                  "S3 (crt), io none on S3 (crt)"]
    assert compare.value(compare.facets(s3), "io") == "none on S3 (crt)"


def test_the_page_fits_1280_px_in_chromium(mixed_runs: Runs, tmp_path: Path,
                                           chromium: str) -> None:  # noqa: F811
    for name, extra in (("plain.html", ()), ("job.html", ("--failure-preset", "llama3"))):
        page = tmp_path / name
        done = ckptbench("report", *map(str, mixed_runs.paths), "--html", str(page), *extra)
        assert done.returncode == 0, done.stderr
        seen = visit(page, chromium, width=1280)
        assert seen.errors == []
        assert seen.layout["width"] == 1280
        assert seen.layout["over"] == [], seen.layout["over"]  # nothing wider than its box
        assert seen.layout["scrollWidth"] <= 1280
        assert "<th class=\"num\">p99 ms" in page.read_text()  # every column still there


def test_the_job_section_gives_the_cadence_answer(mixed_runs: Runs, tmp_path: Path) -> None:
    paths = list(map(str, mixed_runs.paths))
    done = ckptbench("report", *paths, "--failure-preset", "llama3", "--json")
    assert done.returncode == 0, done.stderr
    jobs = [entry["job"] for entry in json.loads(done.stdout)]
    for path, job in zip(paths, jobs, strict=True):
        alone = ckptbench("cadence", "--results", path, "--failure-preset", "llama3", "--force",
                          "--json")
        assert alone.returncode == 0, alone.stderr
        answer = json.loads(alone.stdout)
        assert job["interval_s"] == answer["recommended"]["interval_s"]
        assert job["goodput"] == answer["recommended"]["goodput"]
        assert job["save_s"] == answer["cost"]["save_s"]
        assert job["restore_s"] == answer["cost"]["restore_s"]
        assert job["persist_s"] == answer["cost"]["persist_s"]
        assert set(job["save_parts_s"]) >= {"data"} and "restart" in job["restore_parts_s"]
        # the modelled share of C and R, as `cadence` prints it: the same totals
        cadence_totals = answer["job_model"]["shares"]["totals"]
        assert job["shares"] == cadence_totals
        assert sum(job["shares"]["save"].values()) == pytest.approx(answer["job_model"]["save_s"])
        assert job["shares"]["save"]["modelled"] > 0  # DCP's coordinator at the job's chunks
    # The sync run has no persist. The async run's is its save beyond the blocking
    # snapshot, both scaled to the job: on a loaded machine the snapshot of tiny's 22 MiB
    # can take as long as its save, and the persist is then 0 (a measurement, not a bug).
    assert jobs[0]["persist_s"] == 0 and jobs[1]["persist_s"] >= 0
    table = ckptbench("report", *paths, "--failure-preset", "llama3", "--width", "100")
    assert table.returncode == 0, table.stderr
    assert "what the job will see" in table.stdout and "goodput" in table.stdout
    assert "measured vs modelled: C " in table.stdout and "modelled" in table.stdout
    page = tmp_path / "job.html"
    assert ckptbench("report", *paths, "--html", str(page), "--failure-preset", "rsc1",
                     "--gpus", "16").returncode == 0
    assert "<h2>What the job will see</h2>" in page.read_text()
    plain = tmp_path / "plain.html"
    assert ckptbench("report", *paths, "--html", str(plain)).returncode == 0
    assert "What the job will see" not in plain.read_text()  # no failure model: no section
    bad = ckptbench("report", paths[0], "--gpus", "8")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--failure-preset" in bad.stderr


def test_the_async_run_has_its_loop_figure(mixed_runs: Runs, tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    done = ckptbench("report", *map(str, mixed_runs.paths), "--plots", str(plots))
    assert done.returncode == 0, done.stderr
    loops = sorted(p.name for p in plots.glob("*-loop.png"))
    assert loops == ["async-loop.png"]  # the sync runs have no loop
    assert_drawn((plots / "async-loop.png").read_bytes())


def test_html_dash_writes_the_page_to_stdout(mixed_runs: Runs) -> None:
    done = ckptbench("report", str(mixed_runs.paths[0]), "--html", "-")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<!DOCTYPE html>") and done.stdout.endswith("</html>\n")
    assert "ckptbench results" in done.stdout  # the tables in the page, not beside it
    both = ckptbench("report", str(mixed_runs.paths[0]), "--html", "-", "--json")
    assert both.returncode == 2 and both.stderr.count("\n") == 1


def _closed_reader(*args: str) -> subprocess.CompletedProcess[str]:
    """`ckptbench ARGS` whose standard output's reader is gone before it writes."""
    p = subprocess.Popen([sys.executable, "-m", "ckptbench", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    err = p.stderr.read()
    return subprocess.CompletedProcess(p.args, p.wait(timeout=300), "", err)


def test_a_closed_pipe_is_one_line_and_the_page_is_still_written(mixed_runs: Runs,
                                                                 tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    done = _closed_reader("report", *map(str, mixed_runs.paths), "--html", str(page))
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("ckptbench: error")]
    assert len(errors) == 1 and "standard output" in errors[0] and "broken pipe" in errors[0]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert page.read_text().endswith("</html>\n")  # the page does not depend on the table
    dash = _closed_reader("report", str(mixed_runs.paths[0]), "--html", "-")
    assert dash.returncode == 1 and "Traceback" not in dash.stderr
    assert dash.stderr.count("\n") == 1 and "the page (--html -)" in dash.stderr
