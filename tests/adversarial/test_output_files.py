"""Output files never overwrite anything (issue 29, family 2, and sweep --plot of family 10).

`report --html`, `report --plots`, `cadence --plot` and `sweep --plot` create their files
exclusively: never over an existing file or through a link unless --force (which replaces
the link, never writes through it), never over an input of the same command (not even
with --force), checked before the work (a sweep refuses its plot before sweeping).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .lifecycle import TINY, run
from .runs import one_line

VICTIM = "the user's file\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("out")
    path = base / "r.jsonl"
    r = run("run", str(TINY), "--target", str(base / "t"), "--results", str(path), cwd=base)
    assert r.returncode == 0, r.stderr
    return path


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_text(VICTIM)
    return v


def test_report_html_over_its_own_results_is_refused_even_with_force(results: Path,
                                                                     tmp_path: Path) -> None:
    before = results.read_bytes()
    for force in ((), ("--force",)):
        r = run("report", str(results), "--html", str(results), *force, cwd=tmp_path)
        one_line(r, 2, "--html", "an input of this command")
        assert results.read_bytes() == before


@pytest.mark.parametrize("what", ["file", "link"])
def test_report_html_never_overwrites_nor_writes_through_a_link(results: Path, tmp_path: Path,
                                                                what: str) -> None:
    v = _victim(tmp_path)
    page = tmp_path / "page.html"
    if what == "file":
        page.write_text(VICTIM)
    else:
        page.symlink_to(v)
    r = run("report", str(results), "--html", str(page), cwd=tmp_path)
    one_line(r, 2, "--html", "exists there", "--force")
    assert v.read_text() == VICTIM and page.read_text() == VICTIM
    r = run("report", str(results), "--html", str(page), "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert v.read_text() == VICTIM  # a link is replaced, never written through
    assert not page.is_symlink() and page.read_text().startswith("<!DOCTYPE html>")


def test_report_plots_never_overwrite_a_png_nor_write_through_a_link(results: Path,
                                                                     tmp_path: Path) -> None:
    v = _victim(tmp_path)
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / f"{results.stem}-timeline.png").symlink_to(v)
    (plots / f"{results.stem}-latency.png").write_text(VICTIM)
    r = run("report", str(results), "--plots", str(plots), cwd=tmp_path)
    one_line(r, 2, "--plots", "exists there")
    assert v.read_text() == VICTIM
    assert (plots / f"{results.stem}-latency.png").read_text() == VICTIM
    assert sorted(p.name for p in plots.iterdir()) == [f"{results.stem}-latency.png",
                                                      f"{results.stem}-timeline.png"]


def test_cadence_plot_over_its_results_is_refused_even_with_force(results: Path,
                                                                  tmp_path: Path) -> None:
    png = tmp_path / "r.png"
    png.symlink_to(results)
    before = results.read_bytes()
    r = run("cadence", "--results", str(results), "--workload", str(TINY), "--mtbf", "1h",
            "--plot", str(png), "--force", cwd=tmp_path)
    one_line(r, 2, "--plot", "an input of this command")
    assert results.read_bytes() == before


@pytest.mark.parametrize("name", ["p.txt", "p.png"])
def test_sweep_refuses_its_plot_before_sweeping(tmp_path: Path, name: str) -> None:
    """A plot name that is not .png (a PNG would land in p.txt), or one that exists, is
    refused before the first point runs (nothing written, quickly)."""
    plot = tmp_path / name
    if name == "p.png":
        plot.write_text(VICTIM)
    out = tmp_path / "sweep"
    start = time.monotonic()
    r = run("sweep", str(TINY), "--ranks-per-node", "1,2", "--iterations", "1", "--target",
            str(tmp_path / "t"), "--out", str(out), "--plot", str(plot), cwd=tmp_path)
    one_line(r, 2, "--plot", str(plot))
    assert time.monotonic() - start < 60
    assert not out.exists() and not (tmp_path / "t").exists()
    assert name == "p.txt" or plot.read_text() == VICTIM
