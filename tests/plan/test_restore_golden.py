"""Restore plans against what real torch DCP loads read (torch 2.15, CPU, gloo).

tests/golden/make_dcp_restore_golden.py saves a tiny Llama under the case's [parallel]
layout and loads it under its [restore] layout through a FileSystemReader that records
every read item (see tests/golden/README.md). Each rank of the restore plan must read the
same saved chunks (key, offsets, sizes, from the same file), the same payload bytes, in the
order DCP's FileSystemReader reads them (files in order of first appearance in the load
plan, each file's items in plan order). Non-tensor items (the optimizer's param_groups)
are read by every rank in DCP; ckptbench does not write them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptbench.plan import build_plan
from ckptbench.plan.metadata import BYTES_PER_CHUNK, BYTES_PER_KEY, dcp_metadata_bytes
from ckptbench.plan.restore import build_restore_plan
from ckptbench.spec import load_workload

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "dcp_restore"
CASES = sorted(p.stem for p in GOLDEN.glob("*.json"))


def _file_order(reads: list[dict]) -> list[dict]:
    """DCP's read_data: items grouped by file, files in order of first appearance."""
    per_file: dict[str, list[dict]] = {}
    for r in reads:
        per_file.setdefault(r["path"], []).append(r)
    return [r for items in per_file.values() for r in items]


def test_every_case_has_its_golden():
    assert {"fsdp4_same", "hsdp_same", "tp_fsdp_same", "fsdp4_to_fsdp3", "fsdp2_to_fsdp4",
            "fsdp4_to_tp2_fsdp3", "tp2_fsdp2_to_fsdp2", "fsdp6_to_hsdp", "tp2_fsdp4_to_fsdp3",
            "fsdp3_to_tp2_fsdp4"} <= set(CASES)
    assert {p.stem for p in GOLDEN.glob("*.toml")} == set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_restore_plan_matches_torch_dcp_read_for_read(case):
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    rplan = build_restore_plan(build_plan(load_workload(GOLDEN / f"{case}.toml")))
    save = rplan.save
    assert rplan.world_size == golden["world_size"]
    assert save.world_size == golden["save_world_size"]
    for entry in golden["ranks"]:
        r = entry["rank"]
        assert entry["metadata_reads"] == 1  # every rank reads .metadata before planning
        theirs = [(x["path"], x["key"], x["offsets"], x["sizes"], x["nbytes"])
                  for x in _file_order(entry["reads"]) if x["kind"] == "tensor"]
        ours = []
        for i in rplan.reads_of_rank(r).tolist():
            c = save.chunk(i)
            ours.append((save.file_paths[int(save.chunk_file[i])], c.key, list(c.offsets),
                         list(c.sizes), c.nbytes))
        assert ours == theirs, f"rank {r}"
        assert int(rplan.rank_bytes()[r]) == sum(x[4] for x in theirs)
        # the optimizer's param_groups: every rank reads all of them
        assert sum(x["kind"] == "bytes" for x in entry["reads"]) == 12


def test_amplification_is_what_the_reference_measured():
    """Figures from the reference measurements (torch 2.15): HSDP 2x2 reads 2.0x, FSDP4 onto
    3 ranks 1.5x, FSDP4 onto TP2 x FSDP3 about 2.2x; our goldens' dims give these."""
    def amp(case: str) -> float:
        return build_restore_plan(build_plan(load_workload(GOLDEN / f"{case}.toml"))).amplification

    assert amp("fsdp4_same") == pytest.approx(1.0, abs=1e-3)
    assert amp("hsdp_same") == pytest.approx(2.0, abs=1e-3)
    assert 1.4 < amp("fsdp4_to_fsdp3") < 1.6
    assert 2.0 < amp("fsdp4_to_tp2_fsdp3") < 2.5


@pytest.mark.parametrize("case", CASES)
def test_metadata_size_model_fits_the_real_metadata_files(case):
    """The manifest is padded to DCP's .metadata size for the plan: the linear model (bytes
    per key and per chunk entry, ckptbench.plan.metadata) against torch's real files."""
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    plan = build_plan(load_workload(GOLDEN / f"{case}.toml"))
    md = golden["metadata"]
    assert plan.n_chunks == md["chunks"]  # the plan's chunks are the metadata's entries
    assert len(plan.keys) == md["tensor_keys"]
    assert dcp_metadata_bytes(plan) == pytest.approx(md["bytes"], rel=0.05)


def test_metadata_coefficients_come_from_two_plan_sizes_of_one_model():
    small, large = (json.loads((GOLDEN / f"{c}.json").read_text())["metadata"]
                    for c in ("fsdp2_to_fsdp4", "fsdp4_to_fsdp3"))
    per_chunk = (large["bytes"] - small["bytes"]) / (large["chunks"] - small["chunks"])
    assert round(per_chunk) == BYTES_PER_CHUNK
    keys = small["tensor_keys"] + small["bytes_keys"]
    assert round((small["bytes"] - BYTES_PER_CHUNK * small["chunks"]) / keys) == BYTES_PER_KEY
