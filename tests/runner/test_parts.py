"""A save's and a restore's seconds in named parts (runner.parts): in the phase records,
adding up to the phase; the coordinator's part an op of its own lane, named on the
timeline; the parts table; a manifest that carries every entry whether the processes
encoded their entries or the coordinator did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptbench.formats.manifest import Manifest
from ckptbench.measure import build_request, measure
from ckptbench.records import read_records
from ckptbench.report import view
from ckptbench.report.data import RunData, op_table
from ckptbench.report.figures import Drawn, timeline
from ckptbench.report.html import render_html
from ckptbench.report.table import parts_grid
from ckptbench.runner.parts import RESTORE_PARTS, SAVE_PARTS

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "workloads" / "tiny.toml"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    tmp = tmp_path_factory.mktemp("parts")
    req = build_request(TINY, str(tmp / "data"), iterations=2, keep=True)
    measure(req, tmp / "run.jsonl")
    return list(read_records(tmp / "run.jsonl")), tmp / "data"


def test_every_phase_is_its_parts(tiny_run) -> None:
    records, _ = tiny_run
    its = {(i["iteration"], i["phase"]): i for i in view(records, "x")["iterations"]}
    phases = [r for r in records if r["type"] == "phase"]
    assert len(phases) == 4
    for rec in phases:
        parts = rec["parts"]
        want = SAVE_PARTS if rec["phase"] == "save" else RESTORE_PARTS
        assert tuple(parts) == want
        assert all(v >= 0 for v in parts.values())
        assert parts["data"] > 0 and parts["metadata"] > 0
        seconds = its[(rec["iteration"], rec["phase"])]["seconds"]
        assert sum(parts.values()) == pytest.approx(seconds, rel=1e-6, abs=1e-6)


def test_the_coordinators_part_is_an_op_in_its_lane(tiny_run) -> None:
    """The gap between the last rank's end and the commit is the gather and the
    coordinator's build, ops of the coordinator (thread -1) that meet the commit."""
    records, _ = tiny_run
    for it in (1, 2):
        ops = {r["op"]: r for r in records if r["type"] == "op" and r["iteration"] == it
               and r["phase"] == "save" and r["thread"] == -1}
        assert {"coordinator", "commit"} <= set(ops)
        last = max(r["end_ns"] for r in records if r["type"] == "rank"
                   and r["iteration"] == it and r["phase"] == "save")
        coord = ops["coordinator"]
        gather_end = ops["gather"]["end_ns"] if "gather" in ops else last
        assert coord["start_ns"] == gather_end >= last
        assert coord["end_ns"] == ops["commit"]["start_ns"]
        phase = next(r for r in records if r["type"] == "phase" and r["iteration"] == it
                     and r["phase"] == "save")
        assert phase["parts"]["coordinator"] == pytest.approx(
            (coord["end_ns"] - coord["start_ns"]) / 1e9)


def test_the_timeline_names_a_long_coordinator_part(tiny_run) -> None:
    records, _ = tiny_run
    recs = [dict(r) for r in records]
    for r in recs:  # a coordinator part as long as the save's data: it must be named
        if r["type"] == "op" and r["op"] == "coordinator" and r["iteration"] == 1:
            r["end_ns"] = r["start_ns"] + 2_000_000_000
    run = RunData("x.jsonl", "t", view(recs, "x.jsonl"), op_table(recs),
                  tuple(r for r in recs if r["type"] == "rank"))
    texts = [t.get_text() for t in timeline(run).axes[0].texts]
    assert "coordinator 2.00 s" in texts
    assert "coordinator" in [t.get_text() for t in timeline(run).axes[0].get_legend().texts]


def test_the_parts_table(tiny_run) -> None:
    records, _ = tiny_run
    grid = parts_grid([view(records, "x")])
    assert grid is not None
    assert [c.name for c in grid.columns] == ["phase", "data s", "gather s", "coordinator s",
                                              "metadata s", "commit s", "setup s",
                                              "first_byte s"]
    save, restore = grid.rows
    assert save[0] == "save" and restore[0] == "restore"
    assert restore[2:4] == ("-", "-")  # no gather or coordinator on a restore
    assert "coordinator: its CPU" in grid.notes[0]
    run = RunData("x.jsonl", "t", view(records, "x"), op_table(records), ())
    assert "the phases in parts" in render_html(Drawn((run,), ((),), None))
    old = [r for r in records if r["type"] != "summary"]
    for r in old:
        r.pop("parts", None)
    assert parts_grid([view(old, "x")]) is None  # results from before parts: no table
    altered = [{**r, "parts": {"data": "1 s"}} if r["type"] == "summary" else r for r in records]
    assert parts_grid([view(altered, "x")]) is None  # not numbers: not shown, no traceback


def test_the_manifest_holds_every_file_the_processes_encoded(tiny_run) -> None:
    """The processes encode their own entries; the committed manifest is what the
    coordinator's build from all digests gives."""
    from ckptbench.formats.manifest import manifest_files
    from ckptbench.plan import build_plan
    from ckptbench.spec import load_workload

    _, data = tiny_run
    (path,) = sorted(data.glob("run-*/checkpoint-1/.metadata"))
    manifest = Manifest.decode(path.read_bytes())
    assert manifest["size"] == path.stat().st_size
    plan = build_plan(load_workload(TINY))
    ckpt = f"{path.parent.parent.name}/checkpoint-1"
    digests = {f: e["digests"] for f in range(plan.n_files)
               for k, e in manifest["files"].items() if k == f"{ckpt}/{plan.file_paths[f]}"}
    assert len(digests) == plan.n_files
    assert json.dumps(manifest["files"], sort_keys=True) == json.dumps(
        manifest_files(plan, ckpt, digests), sort_keys=True)
