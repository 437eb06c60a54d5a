"""The job model charges a save's and a restore's once-per-job parts by name: DCP's
measured coordinator cost at the target's chunk count in place of ckptbench's own
encoder, the storage parts as measured, stated in its assumptions; a restoring rank's
own manifest read is metadata, not part of its node's data rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckptbench import jobmodel
from ckptbench.jobmodel.dcp_costs import (
    DCP_SAVE_BROADCAST,
    DCP_SAVE_CACHED,
    DCP_SAVE_COORDINATOR,
    CostModel,
)
from ckptbench.plan import build_plan
from ckptbench.spec import load_workload
from tests import synthetic

ROOT = Path(__file__).resolve().parent.parent
W405 = ROOT / "workloads" / "llama3.1-405b-tp8-pp16-fsdp-16384.toml"
NS = 1_000_000_000
SAVE_PARTS = {"gather": 0.25, "coordinator": 3.0, "metadata": 1.5, "commit": 0.01}
RESTORE_PARTS = {"metadata": 2.0}


def with_parts(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Phase records with named parts, as runs record them (runner.parts)."""
    for r in recs:
        if r.get("type") == "phase":
            r["parts"] = {"data": 4.0, **(SAVE_PARTS if r["phase"] == "save" else RESTORE_PARTS)}
    return recs


def measurement(tmp_path: Path, parts: bool = True, **kw: Any) -> jobmodel.Measurement:
    per_rank = kw.pop("per_rank", 10**9)
    recs = synthetic.records(bytes_per_rank=per_rank, save_s=[4.0] * 5, restore_s=[2.0] * 5,
                             save_meta_s=4.76, restore_meta_s=2.0, **kw)
    return jobmodel.read_results(synthetic.write(tmp_path / "r.jsonl",
                                                 with_parts(recs) if parts else recs))


def estimate(m: jobmodel.Measurement, t: jobmodel.Target) -> jobmodel.JobEstimate:
    return jobmodel.estimate(m, t, restart_overhead_s=0.0, restart_source="test", force=True)


def test_the_measured_parts_are_read(tmp_path) -> None:
    m = measurement(tmp_path)
    assert dict(m.save.parts) == {"data": 4.0, **SAVE_PARTS}
    assert m.restore is not None and dict(m.restore.parts) == {"data": 4.0, **RESTORE_PARTS}


def test_without_a_plan_the_parts_are_charged_as_measured(tmp_path) -> None:
    m = measurement(tmp_path)
    e = estimate(m, jobmodel.uniform("t", 10**9 * 8 * 100, 800, 8))
    assert e.save.parts == SAVE_PARTS
    assert e.save_s == pytest.approx(e.save.data_s + sum(SAVE_PARTS.values()))
    assert e.restore is not None and e.restore.parts == RESTORE_PARTS
    assert not any("torch DCP" in a for a in e.assumptions())


def test_with_a_plan_the_coordinator_is_dcps_at_its_chunk_count(tmp_path) -> None:
    plan = build_plan(load_workload(W405))
    target = jobmodel.from_plan(plan, 8, workload_path=str(W405))
    assert target.chunks == plan.n_chunks
    m = measurement(tmp_path, per_rank=round(target.bytes_per_rank),
                    workload=load_workload(W405).to_dict(), chunks_per_rank=170)
    e = estimate(m, target)
    dcp = DCP_SAVE_COORDINATOR.seconds(plan.n_chunks)
    received = DCP_SAVE_BROADCAST.seconds(plan.n_chunks)
    assert dcp > 0 and received > 0
    assert e.save.parts == {"coordinator": dcp, "metadata_broadcast": received,
                            "metadata": 1.5, "commit": 0.01}
    assert e.save.metadata_s == pytest.approx(dcp + received + 1.51)
    assert e.save_s == pytest.approx(e.save.data_s + dcp + received + 1.51)
    said = " ".join(e.assumptions())
    assert f"torch DCP's save coordinator for {plan.n_chunks:,} chunks" in said
    assert DCP_SAVE_COORDINATOR.fit_range(plan.n_chunks) in said and "x past it" in said
    assert DCP_SAVE_COORDINATOR.source in said and "plan caching" in said
    assert "ckptbench's own manifest build and gather (3.25 s measured)" in said
    assert e.to_dict()["save"]["parts"]["coordinator"] == dcp


def test_a_run_without_parts_is_lumped_as_before(tmp_path) -> None:
    m = measurement(tmp_path, parts=False)
    assert not m.save.parts
    e = estimate(m, jobmodel.uniform("t", 10**9 * 8 * 100, 800, 8))
    assert e.save.parts == {"metadata": pytest.approx(4.76)}
    assert any("no named parts" in a for a in e.assumptions())


def test_a_restoring_ranks_manifest_read_is_not_its_data(tmp_path) -> None:
    """Ranks of the DCP restore plan read the manifest themselves (a ``manifest_s`` in
    their rank record, first in their span): the node's data span starts after it."""
    recs = synthetic.records(bytes_per_rank=10**9, save_s=[4.0] * 5, restore_s=[3.0] * 5,
                             save_meta_s=0.0, restore_meta_s=0.0)
    for r in recs:
        if r.get("type") == "rank" and r["phase"] == "restore":
            r["manifest_s"] = 1.0  # the first of the rank's 3 s
    m = jobmodel.read_results(synthetic.write(tmp_path / "r.jsonl", recs))
    assert m.restore is not None
    assert [s.seconds for s in m.restore.samples] == pytest.approx([2.0] * 5)
    assert m.restore.metadata_s == pytest.approx(1.0)


def test_the_dcp_cost_model_states_its_source() -> None:
    for model in (DCP_SAVE_COORDINATOR, DCP_SAVE_CACHED):
        assert "torch " in model.source and "2026-12" in model.source
        assert model.seconds(2_000_000) > model.seconds(1_000_000) > 0
    assert DCP_SAVE_CACHED.seconds(2_813_937) < DCP_SAVE_COORDINATOR.seconds(2_813_937)
    assert CostModel(-5.0, 1e-6, "x", "y").seconds(10) == 0.0


def test_a_formats_own_restore_parts_are_not_charged_twice(tmp_path) -> None:
    """torch-dcp's load parts (metadata, planning, data, sync) in the phase record only
    (results written before each rank recorded its own parts): they lie inside the ranks'
    spans, so in the per-node rate already, and the restore pays only what lies outside
    them. With each rank's parts, see test_jobmodel's
    test_a_dcp_loads_fixed_parts_are_charged_once_not_per_byte."""
    recs = with_parts(synthetic.records(bytes_per_rank=10**9, save_s=[4.0] * 5,
                                        restore_s=[2.0] * 5, save_meta_s=4.76,
                                        restore_meta_s=0.5))
    for r in recs:
        if r.get("type") == "phase" and r["phase"] == "restore":
            r["parts"] = {"metadata": 0.4, "planning": 0.3, "data": 1.0, "sync": 0.3}
    m = jobmodel.read_results(synthetic.write(tmp_path / "r.jsonl", recs))
    e = estimate(m, jobmodel.uniform("t", 10**9 * 8 * 100, 800, 8))
    assert e.restore is not None and e.restore.parts == {"metadata": pytest.approx(0.5)}
    assert e.save.parts == SAVE_PARTS
