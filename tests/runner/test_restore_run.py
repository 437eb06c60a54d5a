"""Restores as training stacks load, on real files: the DCP restore plan onto another
layout, read for read and verified chunk by chunk; `ckptbench restore` of a kept
checkpoint, and its one-line refusals of what is missing, truncated or altered."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ckptbench.formats.manifest import Manifest
from ckptbench.plan import build_plan
from ckptbench.plan.metadata import dcp_metadata_bytes
from ckptbench.plan.restore import build_restore_plan
from ckptbench.spec import load_workload, with_restore

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "workloads" / "tiny.toml"


def ckptbench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=timeout)


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def planned_reads(layout: dict[str, int]) -> dict[tuple[int, str], int]:
    """(restore rank, file) -> payload bytes the DCP restore plan reads there."""
    rplan = build_restore_plan(build_plan(with_restore(load_workload(TINY), layout, "test")))
    save = rplan.save
    out: dict[tuple[int, str], int] = defaultdict(int)
    for r in range(rplan.world_size):
        for i in rplan.reads_of_rank(r).tolist():
            if save.chunk_nbytes[i]:
                out[(r, save.file_paths[int(save.chunk_file[i])])] += int(save.chunk_nbytes[i])
    return dict(out)


def measured_reads(recs: list[dict[str, Any]]) -> dict[tuple[int, str], int]:
    out: dict[tuple[int, str], int] = defaultdict(int)
    for x in recs:
        if x["type"] == "op" and x["phase"] == "restore" and x["op"] == "read":
            out[(x["rank"], x["file"])] += x["bytes"]
    return dict(out)


@pytest.mark.parametrize(("layout", "flag", "amplification"), [
    ({"world_size": 2, "tp": 1}, "world_size=2,tp=1", 1.0),  # FSDP2 on 2 ranks: out of TP
    ({"world_size": 8, "dp_replicate": 2}, "world_size=8,dp_replicate=2", 2.0),  # HSDP
])
def test_tiny_restored_onto_another_layout_reads_the_plan_and_verifies(
        tmp_path, layout, flag, amplification):
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(TINY), "--target", str(tmp_path / "data"), "--results",
                  str(results), "--restore-layout", flag)
    assert r.returncode == 0, r.stderr
    recs = records(results)
    (phase,) = [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]
    assert phase["verified"] and phase["mismatched_chunks"] == 0
    assert phase["restore_plan"] == "dcp" and phase["restore_world_size"] == layout["world_size"]
    assert phase["amplification"] == pytest.approx(amplification, abs=0.01)
    want = with_restore(load_workload(TINY), layout, "test").restore_parallel
    assert phase["restore_layout"] == want.label
    assert phase["read_bytes"] == phase["planned_read_bytes"] == sum(planned_reads(layout).values())
    # every rank of the restore layout read exactly its planned chunks' bytes, file by file
    assert measured_reads(recs) == planned_reads(layout)
    # each restoring rank read the manifest first, as big as DCP's .metadata would be
    plan = build_plan(load_workload(TINY))
    manifests = [x for x in recs if x["type"] == "op" and x["op"] == "manifest"]
    assert sorted(x["rank"] for x in manifests) == list(range(layout["world_size"]))
    assert {x["size"] for x in manifests} == {dcp_metadata_bytes(plan)}
    (restore,) = [s for s in recs if s["type"] == "summary" and s["phase"] == "restore"]
    assert restore["bytes"] == sum(planned_reads(layout).values())
    assert restore["manifest_bytes"] == dcp_metadata_bytes(plan)


def test_files_plan_reads_back_what_each_rank_wrote(tmp_path):
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(TINY), "--target", str(tmp_path / "data"), "--results",
                  str(results), "--restore-plan", "files")
    assert r.returncode == 0, r.stderr
    summaries = {s["phase"]: s for s in records(results) if s["type"] == "summary"}
    assert summaries["restore"]["bytes"] == summaries["save"]["bytes"]
    assert summaries["restore"]["restore_plan"] == "files"
    (phase,) = [x for x in records(results) if x["type"] == "phase" and x["phase"] == "restore"]
    assert phase["restore_layout"] == "world_size=4,tp=2"  # the training layout
    assert phase["read_bytes"] == phase["planned_read_bytes"] == summaries["save"]["bytes"]
    assert phase["amplification"] == 1.0


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Path:
    """A tiny checkpoint saved and kept (--keep), restored by the tests below (copies)."""
    base = tmp_path_factory.mktemp("kept")
    r = ckptbench("run", str(TINY), "--target", str(base / "data"), "--keep", "--no-restore",
                  "--results", str(base / "r.jsonl"))
    assert r.returncode == 0, r.stderr
    (ckpt,) = (base / "data").glob("run-*/checkpoint-1")
    return ckpt


def copy_of(kept: Path, tmp_path: Path) -> Path:
    shutil.copytree(kept.parents[1], tmp_path / "data")
    return tmp_path / "data" / kept.parent.name / kept.name


def test_restore_command_reads_a_kept_checkpoint_onto_hsdp(kept, tmp_path):
    ckpt = copy_of(kept, tmp_path)
    manifest = Manifest.decode((ckpt / ".metadata").read_bytes())
    assert manifest["workload_spec"]["name"] == "tiny"
    results = tmp_path / "again.jsonl"
    r = ckptbench("restore", str(ckpt), "--restore-layout", "world_size=8,dp_replicate=2",
                  "--results", str(results), "--iterations", "2")
    assert r.returncode == 0, r.stderr
    recs = records(results)
    phases = [x for x in recs if x["type"] == "phase"]
    assert [(p["phase"], p["verified"]) for p in phases] == [("restore", True)] * 2
    assert not [x for x in recs if x["type"] == "op" and x["phase"] == "save"]
    assert measured_reads([x for x in recs if x.get("iteration") == 1]) == planned_reads(
        {"world_size": 8, "dp_replicate": 2})
    assert ckpt.is_dir() and (ckpt / ".metadata").exists()  # never removed


def _first_read_file(ckpt: Path) -> Path:
    return ckpt / "__2_0.distcp"  # holds chunks every restore layout here reads


@pytest.mark.parametrize(("damage", "code", "needle"), [
    ("truncate-file", 1, "__2_0.distcp: short read"),
    ("alter-file", 1, "in {ckpt}/__2_0.distcp: bytes differ from offset"),
    ("remove-file", 2, "__2_0.distcp"),
    ("remove-manifest", 2, "no manifest .metadata"),
    ("alter-manifest", 2, ".metadata: not a ckptbench manifest"),
    ("truncate-manifest", 1, ".metadata: manifest is"),
    ("no-marker", 2, "has no .ckptbench-target marker"),
])
def test_restore_command_refuses_damage_in_one_line(kept, tmp_path, damage, code, needle):
    ckpt = copy_of(kept, tmp_path)
    data = _first_read_file(ckpt)
    manifest = ckpt / ".metadata"
    if damage == "truncate-file":
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    elif damage == "alter-file":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "remove-file":
        data.unlink()
    elif damage == "remove-manifest":
        manifest.unlink()
    elif damage == "alter-manifest":
        manifest.write_bytes(b"garbage" + manifest.read_bytes())
    elif damage == "truncate-manifest":
        manifest.write_bytes(manifest.read_bytes()[:-100])
    elif damage == "no-marker":
        (tmp_path / "data" / ".ckptbench-target").unlink()
    r = ckptbench("restore", str(ckpt), "--restore-world-size", "2", "--restore-layout", "tp=1",
                  "--results", str(tmp_path / "r.jsonl"))
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == code, r.stderr
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle.format(ckpt=f"{ckpt.parent.name}/{ckpt.name}") in lines[0], lines[0]


def test_restore_command_refuses_a_path_that_is_no_checkpoint(tmp_path):
    r = ckptbench("restore", "nowhere")
    assert r.returncode == 2 and "allowed: TARGET/RUN_ID/CHECKPOINT" in r.stderr
    r = ckptbench("restore", str(tmp_path / "a" / "b" / "c"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr


# --- subsets: the files the subset did not write are written as fill-ins, off the clock ---
SUBSET_LAYOUTS = [  # 2 restoring ranks read 4 ranks' files; HSDP: 2 ranks of 8
    ({"world_size": 2, "tp": 1}, ("--restore-world-size", "2", "--restore-layout", "tp=1")),
    ({"world_size": 8, "dp_replicate": 2}, ("--restore-layout", "world_size=8,dp_replicate=2")),
]


def planned_of(layout: dict[str, int], ranks: list[int]) -> dict[tuple[int, str], int]:
    return {k: v for k, v in planned_reads(layout).items() if k[0] in ranks}


def fill_in_bytes(layout: dict[str, int]) -> int:
    """Bytes of the distinct saved chunks restore ranks 0-1 read from files 2 and 3."""
    rplan = build_restore_plan(build_plan(with_restore(load_workload(TINY), layout, "test")))
    save = rplan.save
    chunks = {i for r in (0, 1) for i in rplan.reads_of_rank(r).tolist()
              if save.file_paths[int(save.chunk_file[i])] in ("__2_0.distcp", "__3_0.distcp")}
    return sum(int(save.chunk_nbytes[i]) for i in chunks)


def check_subset_restore(recs: list[dict[str, Any]], layout: dict[str, int]) -> None:
    """Ranks 0-1 of the restore layout read exactly their planned bytes, file by file
    (fill-ins included), verified; the fill-ins are named and in no phase's bytes."""
    planned = planned_of(layout, [0, 1])
    for phase in [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]:
        assert phase["verified"] and phase["mismatched_chunks"] == 0
        assert phase["restore_world_size"] == layout["world_size"] and phase["restore_ranks"] == 2
        assert phase["planned_read_bytes"] == sum(planned.values())
        # the fill-ins hold the chunks ranks 0-1 read from ranks 2-3's files, each once
        assert phase["fill_in_files"] == ["__2_0.distcp", "__3_0.distcp"]
        assert phase["fill_in_bytes"] == fill_in_bytes(layout)
        assert measured_reads([x for x in recs if x.get("iteration") == phase["iteration"]]) \
            == planned
    assert not [x for x in recs if x["type"] == "op" and x.get("file") in
                ("__2_0.distcp", "__3_0.distcp") and x["phase"] == "save"]
    (restore,) = [s for s in recs if s["type"] == "summary" and s["phase"] == "restore"]
    assert restore["bytes"] == restore["planned_read_bytes"] == sum(planned.values())
    assert restore["restore_layout"] == ",".join(
        [f"world_size={layout['world_size']}"]
        + [f"{k}={v}" for k, v in {"tp": 2, **layout}.items() if k != "world_size" and v != 1])


@pytest.mark.parametrize(("layout", "flag"), SUBSET_LAYOUTS)
def test_subset_run_restored_onto_another_layout_reads_its_plan(tmp_path, layout, flag):
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(TINY), "--target", str(tmp_path / "data"), "--results",
                  str(results), "--ranks", "0-1", *flag, "--keep")
    assert r.returncode == 0, r.stderr
    recs = records(results)
    check_subset_restore(recs, layout)
    (save,) = [s for s in recs if s["type"] == "summary" and s["phase"] == "save"]
    plan = build_plan(load_workload(TINY))
    assert save["bytes"] == plan.bytes_of_ranks([0, 1])  # the fill-ins are not the save's
    # --keep keeps what the save wrote (and the record of it): the fill-ins are gone, by name
    (run_dir,) = (tmp_path / "data").glob("run-*")
    assert sorted(p.name for p in run_dir.iterdir()) == [".ckptbench-run", "checkpoint-1"]
    assert sorted(p.name for p in (run_dir / "checkpoint-1").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]


@pytest.mark.parametrize(("layout", "flag"), SUBSET_LAYOUTS)
def test_restore_command_of_a_kept_subset_reads_its_plan(tmp_path, layout, flag):
    data = tmp_path / "data"
    r = ckptbench("run", str(TINY), "--target", str(data), "--ranks", "0-1", "--keep",
                  "--no-restore", "--results", str(tmp_path / "save.jsonl"))
    assert r.returncode == 0, r.stderr
    (ckpt,) = data.glob("run-*/checkpoint-1")
    before = sorted(p.name for p in ckpt.iterdir())
    results = tmp_path / "again.jsonl"
    r = ckptbench("restore", str(ckpt), *flag, "--results", str(results), "--iterations", "2")
    assert r.returncode == 0, r.stderr
    check_subset_restore(records(results), layout)
    assert sorted(p.name for p in ckpt.iterdir()) == before  # the kept checkpoint as it was
    assert not list(data.glob("**/*-fill-in")) and not list(data.glob("run-*/*/__2_0.distcp"))


def test_a_subset_records_its_fill_ins_in_its_intent():
    from ckptbench.runner.cleanup import run_names
    from ckptbench.runner.options import RunOptions

    plan = build_plan(with_restore(load_workload(TINY), {"world_size": 2, "tp": 1}, "test"))
    names = run_names(plan, RunOptions(iterations=2), [[0], [1]])
    assert names.checkpoints == ("checkpoint-1", "checkpoint-2", "checkpoint-1-fill-in",
                                 "checkpoint-2-fill-in")
    # HSDP onto 8 ranks: ranks 0-1 read a few small chunks of ranks 2-3's files, and only
    # those are written (not the whole files)
    hsdp = {"world_size": 8, "dp_replicate": 2}
    assert 0 < fill_in_bytes(hsdp) < build_plan(load_workload(TINY)).file_bytes[2] // 100
    assert {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"} <= set(names.files)
    every = run_names(plan, RunOptions(iterations=2), [[0], [1], [2], [3]])
    assert every.checkpoints == ("checkpoint-1", "checkpoint-2")  # no fill-ins
