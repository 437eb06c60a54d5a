"""The HTML report opened in a real headless Chromium (DevTools over a pipe): no console
error, nothing fetched but the page and its inline images, every figure decoded, a
screenshot that is not blank; the PNG files of --plots checked by size and pixels."""

from __future__ import annotations

import base64
import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.report.chromium import find_chromium, visit
from tests.report.conftest import Runs, ckptbench

FIGURES = ("timeline", "throughput", "ranks", "latency", "iterations")


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = find_chromium()
    if binary is None:
        if os.environ.get("CKPTBENCH_SKIP_BROWSER") == "1":
            pytest.skip("no chromium and CKPTBENCH_SKIP_BROWSER=1")
        pytest.fail("no chromium on PATH: run .ci/setup (apt-get install chromium) or set "
                    "CKPTBENCH_SKIP_BROWSER=1", pytrace=False)
    return binary


def gray(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float64)


def assert_drawn(png: bytes, min_bytes: int = 10_000) -> None:
    """A picture with something in it: not tiny, not one flat colour, not all white."""
    assert len(png) >= min_bytes, len(png)
    px = gray(png)
    assert px.std() > 20, px.std()
    assert (px < 200).mean() > 0.02, (px < 200).mean()
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3).astype(np.int32)
    colours = np.unique((rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2])
    assert len(colours) > 30  # lines, text and colours, not a flat fill


def test_html_report_of_three_runs_in_a_real_browser(three_runs: Runs, tmp_path: Path,
                                                     chromium: str) -> None:
    page_path, plots = tmp_path / "out" / "report.html", tmp_path / "plots"
    done = ckptbench("report", *map(str, three_runs.paths), "--html", str(page_path),
                     "--plots", str(plots), "--json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == 3  # JSON alone on stdout; files named on stderr
    text = page_path.read_text()
    assert "<script" not in text and not re.search(r"https?://", text)

    page = visit(page_path, chromium)
    assert page.errors == []
    assert {u for u in page.requests if not u.startswith("data:image/png;base64,")} == \
        {page_path.resolve().as_uri()}
    assert len(page.images) == 3 * len(FIGURES) + 1  # each run's figures and the comparison
    assert all(i["complete"] and i["width"] >= 600 and i["height"] >= 200 for i in page.images)
    shot = gray(page.screenshot)
    assert shot.shape[0] > 3000 and shot.shape[1] == 1280
    assert_drawn(page.screenshot)

    pngs = sorted(plots.glob("*.png"))
    assert {p.name for p in pngs} == {f"{path.stem}-{f}.png" for path in three_runs.paths
                                      for f in FIGURES} | {"compare.png"}
    for p in pngs:
        assert_drawn(p.read_bytes())
        assert base64.b64encode(p.read_bytes()).decode() in text  # the same figures inline


def test_one_run_report_has_its_figures_and_no_comparison(three_runs: Runs, tmp_path: Path) -> None:
    page = tmp_path / "one.html"
    done = ckptbench("report", str(three_runs.paths[0]), "--html", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert text.count("<img ") == len(FIGURES) and "Comparison" not in text
    assert "ckptbench results for tiny" in done.stdout  # the table still printed


def test_the_browser_check_sees_errors_missing_images_and_blank_pages(tmp_path: Path,
                                                                     chromium: str) -> None:
    """The checks above can fail: a console error, a missing image and an external
    request (refused by the page's own policy) are reported; a blank page is blank."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
                   "content=\"default-src 'none'; img-src data:; script-src 'unsafe-inline'\">"
                   '</head><body><img src="missing.png"><img src="http://127.0.0.1:9/x.png">'
                   '<script>console.error("boom")</script></body></html>')
    page = visit(bad, chromium)
    joined = " | ".join(page.errors)
    assert "console: boom" in joined and "missing.png" in joined and "127.0.0.1:9" in joined
    assert [i["width"] for i in page.images] == [0, 0]
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    page = visit(blank, chromium)
    assert page.errors == [] and gray(page.screenshot).std() < 1


def test_outputs_that_cannot_be_written_are_one_line_errors(three_runs: Runs, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for args, names in ((["--html", str(blocker / "r.html")], "--html"),
                        (["--plots", str(blocker)], "--plots")):
        done = ckptbench("report", str(three_runs.paths[0]), *args)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("ckptbench: error: ") and names in line and str(blocker) in line
