"""A tiered run's timeline has a lane per tier (memory, peer, storage) above the ranks:
each tier's copies and the restarts it served, on the storage calls' clock. Checked on
the figure (its lanes, in order, and bars placed where the records say) and in the HTML
page opened in a real headless Chromium (no error, the timeline decoded, the lanes'
colours in its pixels)."""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from PIL import Image

from ckptbench.report.data import load_runs
from ckptbench.report.figures import timeline
from ckptbench.report.tier_lanes import RESTART_COLOR
from tests.report.chromium import find_chromium, visit
from tests.report.test_html_report import assert_drawn

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real tiered run: 4 nodes of 1 process, memory + 1 peer replica + storage every
    2nd of 2 checkpoints, so every restart scenario and every tier serves someone."""
    tmp = tmp_path_factory.mktemp("lanes")
    shm = Path("/dev/shm")
    memory = Path(tempfile.mkdtemp(prefix="ckptbench-test-", dir=shm if shm.is_dir() else None))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ckptbench", "run", str(ROOT / "workloads" / "tiny.toml"),
             "--target", str(tmp / "t"), "--results", str(tmp / "r.jsonl"), "--memory-dir",
             str(memory), "--tiers", "memory,peer,storage", "--ranks-per-node", "1",
             "--iterations", "2", "--storage-every", "2"],
            env=ENV, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        yield tmp / "r.jsonl"
    finally:
        shutil.rmtree(memory, ignore_errors=True)


def test_the_timeline_has_a_lane_per_tier_with_its_copies_and_restarts(tiered: Path) -> None:
    (run,) = load_runs([str(tiered)])
    fig = timeline(run)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:4] == ["memory tier", "peer tier", "storage tier", "coordinator"]
    assert [t.get_text() for t in ax.texts if t.get_text() in ("process", "node", "group")]
    # every restart a tier served is a bar in its lane, where its record says
    ticks = dict(zip(labels, ax.get_yticks(), strict=True))
    bars = [(p.get_paths()[0].get_extents(), tuple(round(c, 3) for c in p.get_facecolor()[0][:3]))
            for p in ax.collections if p.get_paths()]
    for r in run.tiers:
        if r["type"] != "tier_restore":
            continue
        y, colour = ticks[f"{r['tier']} tier"], tuple(round(c, 3) for c in
                                                       to_rgb(RESTART_COLOR[r["tier"]]))
        s, e = run.ops.seconds(r["start_ns"]), run.ops.seconds(r["end_ns"])
        assert any(c == colour and b.y0 <= y <= b.y1 and abs(b.x0 - s) < 1e-9
                   and abs(b.x1 - e) < 1e-9 for b, c in bars), (r["scenario"], r["tier"])
    assert ax.get_xlim()[1] >= max(run.ops.seconds(r["end_ns"]) for r in run.tiers)


def test_the_tier_lanes_in_the_html_page_in_chromium(tiered: Path, tmp_path: Path) -> None:
    binary = find_chromium()
    if binary is None:
        pytest.fail("no chromium on PATH: run .ci/setup", pytrace=False)
    page = tmp_path / "page.html"
    done = subprocess.run([sys.executable, "-m", "ckptbench", "report", str(tiered), "--html",
                           str(page)], env=ENV, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert "A tiered run has a lane per tier" in text
    seen = visit(page, binary)
    assert seen.errors == []
    assert seen.images and all(i["complete"] and i["width"] >= 600 for i in seen.images)
    figure = text.split('id="timeline', 1)[1].split("base64,", 1)[1].split('"', 1)[0]
    png = base64.b64decode(figure)
    assert_drawn(png)
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3)
    for colour in RESTART_COLOR.values():
        want = np.array([round(255 * c) for c in to_rgb(colour)])
        assert (np.abs(rgb.astype(int) - want).max(axis=1) <= 2).sum() > 20, colour
