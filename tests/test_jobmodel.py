"""The job model: reading runs through the records, per-node scaling with known answers,
the slowest-of-N estimate against a simulation, and the checks that refuse a run that
cannot stand for the job (the three runs of issue 19 among them)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ckptbench import jobmodel
from ckptbench.errors import SpecError
from ckptbench.jobmodel import LogNormalFit, expected_max
from ckptbench.jobmodel.stragglers import log_normal_cdf
from ckptbench.measure import build_request, measure
from ckptbench.plan import build_plan
from ckptbench.spec import load_workload
from tests import synthetic

ROOT = Path(__file__).resolve().parent.parent
W405 = ROOT / "workloads" / "llama3.1-405b-tp8-pp16-fsdp-16384.toml"
TINY = ROOT / "workloads" / "tiny.toml"
# ln of 5 samples with mean 0 and sample standard deviation 1 exactly
UNIT = np.array([-2.0, -1.0, 0.0, 1.0, 2.0]) / math.sqrt(2.5)


def estimate(m: jobmodel.Measurement, t: jobmodel.Target, **kw) -> jobmodel.JobEstimate:
    return jobmodel.estimate(m, t, restart_overhead_s=kw.pop("restart", 0.0),
                             restart_source="test", **kw)


def results(tmp_path: Path, name: str = "run.jsonl", **shape) -> jobmodel.Measurement:
    return jobmodel.read_results(synthetic.write(tmp_path / name, synthetic.records(**shape)))


# --- reading a run ---------------------------------------------------------------------


def test_node_samples_come_from_rank_records(tmp_path) -> None:
    spans = [2.0, 2.5, 1.0, 4.0, 2.0, 2.0]  # 3 iterations x 2 nodes
    m = results(tmp_path, bytes_per_rank=10**9, ranks_per_node=8, nodes=2, save_s=spans,
                restore_s=[1.0] * 6, save_meta_s=0.25, restore_meta_s=0.125)
    assert (m.nodes, m.ranks_per_node, m.samples, m.save.iterations) == (2, 8, 6, 3)
    assert m.bytes_per_rank == 10**9
    assert sorted(m.save.node_throughputs) == pytest.approx(sorted(8e9 / s for s in spans))
    assert m.save.metadata_s == pytest.approx(0.25)
    assert m.restore is not None and m.restore.metadata_s == pytest.approx(0.125)
    assert m.restore.cache == "fadvise+drop_caches"
    assert m.file_bytes == 10**9  # one file per rank


def test_a_real_run_reads_back(tmp_path) -> None:
    """The records `ckptbench run` writes (in process, the tiny workload) give the model
    its samples: one node, 4 ranks, the iterations asked for, a commit after the data."""
    req = build_request(TINY, str(tmp_path / "data"), iterations=2)
    measure(req, tmp_path / "tiny.jsonl")
    m = jobmodel.read_results(tmp_path / "tiny.jsonl")
    assert (m.nodes, m.ranks_per_node, m.samples, m.scale) == (1, 4, 2, 1)
    assert m.workload is not None and m.workload.name == "tiny"
    plan = build_plan(load_workload(TINY))
    assert m.bytes_per_rank == pytest.approx(plan.total_bytes / 4)
    assert m.save.metadata_s > 0 and m.restore is not None
    assert all(s.seconds > 0 for s in m.save.samples + m.restore.samples)


def test_bad_results_files(tmp_path) -> None:
    with pytest.raises(SpecError, match=r"--results .*missing\.jsonl: no such file"):
        jobmodel.read_results(tmp_path / "missing.jsonl")
    good = synthetic.records(bytes_per_rank=10**6, save_s=[1.0] * 5, restore_s=None)
    lines = synthetic.write(tmp_path / "x.jsonl", good)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(Path(lines).read_text().splitlines()[0] + "\nnot json\n")
    with pytest.raises(SpecError, match=r"broken.jsonl:2: not a JSON line"):
        jobmodel.read_results(broken)
    odd = tmp_path / "odd.jsonl"
    synthetic.write(odd, [good[0], {"type": "summary", "phase": "verify"}])
    with pytest.raises(SpecError, match="phase 'verify'; allowed: save, restore"):
        jobmodel.read_results(odd)
    foreign = tmp_path / "foreign.jsonl"
    synthetic.write(foreign, good[1:])
    with pytest.raises(SpecError, match="not a ckptbench results file"):
        jobmodel.read_results(foreign)
    saves_only = jobmodel.read_results(lines)
    target = jobmodel.uniform("t", 8e6, 8, 8)
    with pytest.raises(SpecError, match="no restore summary"):
        estimate(saves_only, target)
    assert estimate(saves_only, target, need_restore=False).restore is None


# --- known answers ----------------------------------------------------------------------


def test_without_spread_it_is_per_node_scaling_and_the_ceiling(tmp_path) -> None:
    """2 GB/s save and 4 GB/s restore per node, no spread: 1 TB on 128 nodes takes
    1e12 / 256e9 s to save; a 300 GB/s ceiling caps the restore only."""
    per_rank = 10**12 // 1024
    m = results(tmp_path, bytes_per_rank=per_rank, ranks_per_node=8, nodes=2,
                save_s=[8 * per_rank / 2e9] * 6, restore_s=[8 * per_rank / 4e9] * 6,
                save_meta_s=0.0, restore_meta_s=0.0)
    t = jobmodel.uniform("t", 1e12, 1024, 8)
    e = estimate(m, t, restart=60.0)
    assert not e.warnings
    assert e.save.spread_sigma == 0.0
    assert e.save_s == pytest.approx(1e12 / 256e9)
    assert e.restore_s == pytest.approx(1e12 / 512e9 + 60.0)
    capped = estimate(m, jobmodel.uniform("t", 1e12, 1024, 8, ceiling=300e9))
    assert not capped.save.capped and capped.save_s == pytest.approx(1e12 / 256e9)
    assert capped.restore is not None and capped.restore.capped
    assert capped.restore_s == pytest.approx(1e12 / 300e9)
    assert any("binding for restore" in a for a in capped.assumptions())


def test_metadata_is_added_once(tmp_path) -> None:
    per_rank = 10**9
    m = results(tmp_path, bytes_per_rank=per_rank, save_s=[4.0] * 5, restore_s=[2.0] * 5,
                save_meta_s=1.5, restore_meta_s=0.5)
    e = estimate(m, jobmodel.uniform("t", per_rank * 8 * 100, 800, 8), restart=10.0)
    assert e.save_s == pytest.approx(4.0 + 1.5)
    assert e.restore_s == pytest.approx(2.0 + 0.5 + 10.0)


def test_spread_gives_the_expected_slowest_node(tmp_path) -> None:
    """Samples whose log time per byte has mean mu and deviation sigma exactly: the save
    time of 2,048 nodes is the lognormal's expected maximum, which a simulation of 2,048
    nodes drawn from that distribution reproduces."""
    per_rank, mu, sigma = 10**9, math.log(2.0), 0.1
    spans = np.exp(mu + sigma * UNIT)  # seconds for a node's 8 GB
    m = results(tmp_path, bytes_per_rank=per_rank, save_s=list(spans), restore_s=list(spans),
                save_meta_s=0.0)
    t = jobmodel.uniform("t", per_rank * 8 * 2048, 8 * 2048, 8)
    e = estimate(m, t)
    assert e.save.spread_sigma == pytest.approx(sigma, rel=1e-4)
    assert e.save.median_node_s == pytest.approx(2.0, rel=1e-4)
    rng = np.random.default_rng(7)
    simulated = np.exp(rng.normal(mu, sigma, (3000, 2048))).max(axis=1).mean()
    assert e.save_s == pytest.approx(simulated, rel=0.01)
    assert e.save_s > spans.max()  # beyond the worst sample: a bootstrap's limit


def test_the_heaviest_nodes_set_the_pace() -> None:
    """No spread: the job takes as long as its heaviest node at the measured rate."""
    fit = LogNormalFit(math.log(1e-9), 0.0, 5)
    assert expected_max([(1e9, 100), (3e9, 2)], fit) == pytest.approx(3.0)


# --- the slowest of N against a simulation ------------------------------------------------


@pytest.mark.parametrize(("n", "sigma"), [(1, 0.2), (16, 0.05), (2048, 0.1), (2048, 0.4)])
def test_expected_max_against_simulation(n: int, sigma: float) -> None:
    fit = LogNormalFit(0.3, sigma, 5)
    rng = np.random.default_rng(n)
    draws = np.exp(rng.normal(0.3, sigma, (4000, n))).max(axis=1)
    assert expected_max([(1.0, n)], fit) == pytest.approx(draws.mean(), rel=0.01)


def test_expected_max_of_groups_against_simulation() -> None:
    fit = LogNormalFit(0.0, 0.15, 5)
    rng = np.random.default_rng(3)
    light = np.exp(rng.normal(0.0, 0.15, (4000, 500))).max(axis=1)
    heavy = 1.2 * np.exp(rng.normal(0.0, 0.15, (4000, 8))).max(axis=1)
    simulated = np.maximum(light, heavy).mean()
    assert expected_max([(1.0, 500), (1.2, 8)], fit) == pytest.approx(simulated, rel=0.01)


def test_one_node_is_the_lognormal_mean() -> None:
    fit = LogNormalFit(1.0, 0.3, 5)
    assert expected_max([(2.0, 1)], fit) == pytest.approx(2.0 * math.exp(1.0 + 0.045), rel=1e-5)


def test_log_normal_cdf_in_both_tails() -> None:
    z = np.array([-30.0, -5.0, 0.0, 1.0, 8.0])
    expected = [math.log(0.5 * math.erfc(-x / math.sqrt(2))) for x in z]
    assert log_normal_cdf(z) == pytest.approx(expected, rel=1e-6, abs=1e-15)


# --- the target ---------------------------------------------------------------------------


def test_target_from_a_plan_places_consecutive_ranks_on_nodes() -> None:
    plan = build_plan(load_workload(TINY))
    t = jobmodel.from_plan(plan, 2)
    assert (t.nodes, t.ranks_per_node, t.gpus) == (2, 2, 4)
    pairs = plan.rank_bytes().reshape(2, 2).sum(axis=1)
    assert t.heaviest_node_bytes == pytest.approx(pairs.max(), rel=1e-3)
    assert sum(b * c for b, c in t.node_groups) == pytest.approx(plan.total_bytes, rel=1e-3)
    assert jobmodel.from_plan(plan, 8).ranks_per_node == 4  # a 4-GPU job is one node of 4
    spread = jobmodel.from_plan(plan, 2, gpus=16)
    assert spread.bytes_per_rank == pytest.approx(plan.total_bytes / 16)
    assert "not the plan's world size" in spread.placement


# --- the three runs of issue 19 -----------------------------------------------------------


@pytest.fixture(scope="module")
def job405() -> jobmodel.Target:
    """Llama 3.1 405B on 16,384 GPUs, 8 per node (the planner's per-rank bytes)."""
    return jobmodel.from_plan(build_plan(load_workload(W405)), 8, workload_path=str(W405))


def issue_run(tmp_path: Path, ranks: int, per_rank: int, scale: int, iterations: int = 5,
              **kw) -> jobmodel.Measurement:
    spans = [ranks * per_rank / 2e9] * iterations
    return results(tmp_path, f"r{ranks}-s{scale}.jsonl", bytes_per_rank=per_rank,
                   ranks_per_node=ranks, scale=scale, save_s=spans, restore_s=spans,
                   workload=load_workload(W405).to_dict(), chunks_per_rank=170, **kw)


def test_eight_ranks_at_full_size_stand_for_the_job(tmp_path, job405) -> None:
    # torchtitan's state: 12 B/param, plus a 4-byte `step` per tensor (1,137 tensors)
    assert job405.total_bytes == 405_853_388_800 * 12 + 4 * 1137
    m = issue_run(tmp_path, 8, round(job405.bytes_per_rank), 1)
    assert jobmodel.findings(m, job405) == []
    e = estimate(m, job405)
    assert e.warnings == ()
    # no spread: the heaviest of the 2,048 nodes (the stages holding embeddings/output)
    assert e.save.data_s == pytest.approx(job405.heaviest_node_bytes / 2e9, rel=1e-6)
    assert e.save.data_s > e.save.median_node_s


@pytest.mark.parametrize(("scale", "per_rank", "checks"), [
    (4, 17_367_744, {"ranks-per-node", "bytes-per-rank"}),
    (4096, 53_942, {"ranks-per-node", "bytes-per-rank", "tiny-files"}),
])
def test_two_ranks_at_a_scale_are_refused(tmp_path, job405, scale: int, per_rank: int,
                                          checks: set[str]) -> None:
    m = issue_run(tmp_path, 2, per_rank, scale)
    found = jobmodel.findings(m, job405)
    assert {f.check for f in found} == checks
    commands = {f.check: f.command for f in found}
    assert "--ranks 0-7 " in commands["ranks-per-node"]
    assert f"{W405} --ranks 0-1 --scale 1 " in commands["bytes-per-rank"]
    with pytest.raises(SpecError) as refused:
        estimate(m, job405)
    message = str(refused.value)
    assert "\n" not in message and "--force" in message
    assert f"`ckptbench run {W405} --ranks 0-7 --scale 1 --iterations 5 --target DIR`" in message
    forced = estimate(m, job405, force=True)
    assert {w["check"] for w in forced.to_dict()["warnings"]} == checks


def test_too_few_samples_and_a_warm_cache_are_named(tmp_path, job405) -> None:
    m = issue_run(tmp_path, 8, round(job405.bytes_per_rank), 1, iterations=2, cache="none")
    found = {f.check: f for f in jobmodel.findings(m, job405)}
    assert set(found) == {"iterations", "cache"}
    assert "--iterations 5 " in found["iterations"].command
    assert "--cache auto" in found["cache"].command
    assert set(jobmodel.findings(m, job405, need_restore=False)) == {found["iterations"]}


def test_the_model_states_its_inputs_and_assumptions(tmp_path, job405) -> None:
    m = issue_run(tmp_path, 8, round(job405.bytes_per_rank), 1)
    d = estimate(m, job405, restart=600.0).to_dict()
    assert d["inputs"]["target"]["nodes"] == 2048
    assert d["inputs"]["target"]["gpus"] == 16384
    assert d["inputs"]["measurement"]["ranks_per_node"] == 8
    assert d["inputs"]["measurement"]["save"]["node_samples"] == 5
    text = " ".join(d["assumptions"])
    for phrase in ("lognormal", "2,048 independent draws", "no aggregate ceiling", "metadata",
                   "restart overhead: 600 s", "consecutive ranks"):
        assert phrase in text
    assert d["restore_s"] == pytest.approx(d["restore"]["total_s"] + 600.0)


# --- sweeps ---------------------------------------------------------------------------------


def test_a_sweep_file_lists_its_points_and_the_matching_one_is_chosen(tmp_path) -> None:
    points = []
    for k, rate in ((1, 1e9), (2, 1.9e9), (4, 3.0e9), (8, 3.1e9)):
        name = f"rpn{k}.jsonl"
        m = results(tmp_path, name, bytes_per_rank=10**8, ranks_per_node=k,
                    save_s=[k * 1e8 / rate] * 5, restore_s=[k * 1e8 / rate] * 5)
        points.append(jobmodel.SweepPoint.of(m, name))
    assert points[2].save_node_bytes_per_s == pytest.approx(3.0e9)
    jobmodel.write_sweep(tmp_path / "sweep.jsonl", {"workload": "synthetic"}, points)
    with pytest.raises(SpecError, match="never overwritten"):
        jobmodel.write_sweep(tmp_path / "sweep.jsonl", {}, points)
    measured = jobmodel.read_measurements([tmp_path / "sweep.jsonl"])
    assert [m.ranks_per_node for m in measured] == [1, 2, 4, 8]
    assert jobmodel.choose(measured, 8).ranks_per_node == 8
    assert jobmodel.choose(measured, 16).ranks_per_node == 8  # nearest; then a warning
    assert jobmodel.choose(measured, 3).ranks_per_node == 4
    knee = jobmodel.saturation(points)
    assert knee is not None and knee.ranks_per_node == 4  # 8 ranks add < 10 %
    assert jobmodel.saturation(points[:3]) is None


def test_a_broken_sweep_file_is_one_line(tmp_path) -> None:
    path = tmp_path / "sweep.jsonl"
    path.write_text('{"type":"sweep","schema":"ckptbench.sweep/1"}\nnope\n')
    with pytest.raises(SpecError, match=r"sweep\.jsonl:2: not a JSON line"):
        jobmodel.read_measurements([path])
    path.write_text('{"type":"sweep","schema":"ckptbench.sweep/1"}\n')
    with pytest.raises(SpecError, match="no points"):
        jobmodel.read_measurements([path])


# --- the restore: the job restarting on its restore layout -------------------------------


def test_the_restore_is_read_by_the_plan_of_the_job_restarting() -> None:
    from ckptbench.plan.restore import restore_plan_of
    from ckptbench.spec import with_restore

    plan = build_plan(with_restore(load_workload(TINY), {"world_size": 8, "dp_replicate": 2},
                                   "test"))
    rplan = restore_plan_of(plan)
    t = jobmodel.from_plan(plan, 2, restore_plan=rplan)
    r = t.for_restore
    assert (t.nodes, r.nodes, r.gpus) == (2, 4, 8)
    assert r.total_bytes == rplan.total_bytes == pytest.approx(2 * plan.total_bytes, rel=1e-3)
    pairs = rplan.rank_bytes().reshape(4, 2).sum(axis=1)
    assert r.heaviest_node_bytes == pytest.approx(pairs.max(), rel=1e-3)
    assert t.restore_layout == "world_size=8,tp=2,dp_replicate=2"
    assert jobmodel.from_plan(plan, 2).for_restore.total_bytes == plan.total_bytes  # as saved


def test_r_scales_with_the_restore_plans_bytes_per_node(tmp_path) -> None:
    from ckptbench.plan.restore import restore_plan_of
    from ckptbench.spec import with_restore

    tiny = load_workload(TINY)
    per_rank = build_plan(tiny).total_bytes // 4
    m = results(tmp_path, bytes_per_rank=per_rank, ranks_per_node=2, save_s=[1.0] * 5,
                restore_s=[0.5] * 5, save_meta_s=0.0, restore_meta_s=0.0)
    seconds_per_byte = 0.5 / (2 * per_rank)
    for layout in ({"world_size": 8, "dp_replicate": 2}, {"world_size": 2, "tp": 1}):
        plan = build_plan(with_restore(tiny, layout, "test"))
        rplan = restore_plan_of(plan)
        e = estimate(m, jobmodel.from_plan(plan, 2, restore_plan=rplan), force=True)
        node_max = rplan.rank_bytes().reshape(-1, min(2, rplan.world_size)).sum(axis=1).max()
        assert e.restore.data_s == pytest.approx(node_max * seconds_per_byte, rel=2e-3)
        assert any(f"restarting on {rplan.layout.label}" in a for a in e.assumptions())
        assert e.to_dict()["inputs"]["target"]["restore"]["amplification"] == pytest.approx(
            rplan.amplification)
    # HSDP on 8 ranks reads each node's 2 ranks' share twice over 4 nodes; 2 ranks of
    # FSDP read the whole checkpoint on one node
    assert e.restore.data_s == pytest.approx(plan.total_bytes * seconds_per_byte, rel=2e-3)


# --- DCP's costs where they belong (issue 42) ---------------------------------------------

NS = 1_000_000_000


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A real run of the tiny workload (raw format, 4 ranks reading the manifest each)."""
    where = tmp_path_factory.mktemp("tiny")
    measure(build_request(TINY, str(where / "data"), iterations=5), where / "tiny.jsonl")
    return where / "tiny.jsonl"


def dcp_load_run(tmp_path: Path, name: str, planning: float, *, meta: float = 0.1,
                 data: float = 2.0, per_rank: int = 10**9, threads: int | None = 4
                 ) -> jobmodel.Measurement:
    """A run whose restores are torch-dcp loads (formats.dcp_load): every rank's span is
    its .metadata read, its planning, then deserialise, data and sync, each rank's parts
    in its rank record and the slowest's in the phase record, as `ckptbench run --format
    torch-dcp` writes them."""
    spans = [meta + planning + data] * 5
    recs = synthetic.records(bytes_per_rank=per_rank, save_s=[4.0] * 5, restore_s=spans,
                             save_meta_s=0.0, restore_meta_s=0.0, chunks_per_rank=100)
    recs[0]["options"]["format"] = "torch-dcp"
    recs[0]["plan"]["state_keys"] = 50
    for r in recs:
        if r.get("type") == "rank" and r["phase"] == "restore":
            rest = (r["end_ns"] - r["start_ns"]) / NS - meta - planning
            r["parts"] = {"metadata": meta, "planning": planning, "deserialise": rest / 2,
                          "data": rest / 2, "sync": 0.0}
            if threads is not None:
                r["intra_op_threads"] = threads
        if r.get("type") == "phase" and r["phase"] == "restore":
            r["parts"] = {"metadata": meta, "planning": planning, "deserialise": data / 2,
                          "data": data / 2, "sync": 0.0}
        if r.get("type") == "phase" and r["phase"] == "save":
            r["parts"] = {"data": 4.0, "gather": 0.0, "coordinator": 0.0, "metadata": 0.0,
                          "commit": 0.0}
    return jobmodel.read_results(synthetic.write(tmp_path / name, recs))


def test_a_dcp_loads_fixed_parts_are_charged_once_not_per_byte(tmp_path) -> None:
    """A restore whose DCP load plans for P seconds: R grows by P once, whatever the
    job's bytes per node (not P x the bytes ratio); the per-node rate is the rest."""
    without = dcp_load_run(tmp_path, "p0.jsonl", 0.0)
    with_p = dcp_load_run(tmp_path, "p2.jsonl", 2.0)
    assert with_p.restore is not None and with_p.restore.out_of_spans == ("metadata", "planning")
    assert [s.seconds for s in with_p.restore.samples] == pytest.approx([2.0] * 5)
    assert with_p.restore.metadata_readers == 8  # every rank read .metadata
    for ratio in (1, 4, 16):  # the job's bytes per rank, x the run's
        target = jobmodel.uniform("t", 10**9 * ratio * 800, 800, 8)
        r0 = estimate(without, target, force=True).restore
        r2 = estimate(with_p, target, force=True).restore
        assert r0 is not None and r2 is not None
        assert r2.parts["planning"] == pytest.approx(2.0)
        assert r2.total_s - r0.total_s == pytest.approx(2.0, rel=1e-6)
        assert r2.data_s == pytest.approx(2.0 * ratio, rel=1e-6)  # 8 GB per node in 2 s
    e = estimate(with_p, jobmodel.uniform("t", 10**9 * 800, 800, 8), force=True)
    said = " ".join(e.assumptions())
    assert "paid once per restart" in said and "4 intra-op thread(s)" in said
    assert "deserialise" in said
    unknown = dcp_load_run(tmp_path, "nothreads.jsonl", 1.0, threads=None)
    assert "intra-op threads not recorded" in " ".join(
        estimate(unknown, jobmodel.uniform("t", 10**9 * 800, 800, 8), force=True).assumptions())


def test_a_torch_dcp_saves_coordinator_is_charged_once(tmp_path, job405) -> None:
    """A torch-dcp save's spans hold DCP's own planning at the run's chunk count: it is
    taken out of them, and the job's coordinator is charged once at the job's."""
    from ckptbench.jobmodel.dcp_costs import DCP_SAVE_BROADCAST, DCP_SAVE_COORDINATOR

    m = dcp_load_run(tmp_path, "dcp.jsonl", 1.0)
    assert m.format == "torch-dcp" and m.chunks == 800
    e = estimate(m, job405, force=True)
    inside = DCP_SAVE_COORDINATOR.seconds(800) + DCP_SAVE_BROADCAST.seconds(800)
    assert e.save.out_of_spans_s == pytest.approx(inside)
    per_byte = (4.0 - inside) / 8e9  # a node's 8 GB in its span less the planning
    assert e.save.median_node_s == pytest.approx(job405.mean_node_bytes * per_byte, rel=1e-3)
    assert e.save.parts["coordinator"] == pytest.approx(DCP_SAVE_COORDINATOR.seconds(
        job405.chunks or 0))
    assert "taken out of its node spans" in " ".join(e.assumptions())
    raw = jobmodel.read_results(synthetic.write(tmp_path / "raw.jsonl", synthetic.records(
        bytes_per_rank=10**9, save_s=[4.0] * 5, restore_s=[2.0] * 5)))
    assert estimate(raw, job405, force=True).save.out_of_spans_s == 0.0


def test_the_metadata_read_grows_with_its_readers(tiny_run) -> None:
    """Every restoring rank reads .metadata: the run's slowest of its 4 reads (one node),
    plus, the storage growing with the nodes as for the data, each reader a job's node has
    beyond the run's node at the fitted per-reader rate; what one shared storage would
    take is said beside it; with an aggregate bandwidth, all readers' bytes over it."""
    from ckptbench.jobmodel.dcp_costs import METADATA_READERS

    m = jobmodel.read_results(tiny_run)
    assert m.restore is not None and m.restore.metadata_readers == 4 and m.nodes == 1
    size = m.metadata_bytes
    assert size == m.restore.metadata_bytes and size and size > 0
    per_reader = size * METADATA_READERS.s_per_reader_per_byte
    for per_node in (4, 8):
        for gpus in (64, 1024, 16384):
            r = estimate(m, jobmodel.uniform("t", 4e9 * gpus, gpus, per_node),
                         force=True).restore
            assert r is not None and r.metadata_read is not None
            assert r.parts["metadata"] == pytest.approx(m.restore.parts["metadata"])
            assert r.parts["metadata_fan_in"] == pytest.approx((per_node - 4) * per_reader)
            assert r.kinds["metadata_fan_in"] == "modelled"
            assert r.metadata_read.shared_s == pytest.approx((gpus - 4) * per_reader)
            assert METADATA_READERS.fit_range(per_node) in r.metadata_read.rule
            assert "grow with the nodes" in r.metadata_read.rule
    assert METADATA_READERS.fit_range(8).endswith("within it")
    ceiling = 1e9
    capped = estimate(m, jobmodel.uniform("t", 4e9 * 16384, 16384, 4, ceiling=ceiling),
                      force=True).restore
    assert capped is not None
    assert capped.parts["metadata"] + capped.parts["metadata_fan_in"] == pytest.approx(
        max(16384 * size / ceiling, capped.parts["metadata"]))
    assert "--aggregate-bandwidth" in capped.notes["metadata_fan_in"]


def test_the_metadata_read_is_the_jobs_size(tiny_run, job405) -> None:
    """The 405B job's .metadata (462 MiB) read by its 16,384 restoring ranks: the run's
    read brought to that size, and its fan-in over 16,384 readers (7.2 TiB per restart)."""
    from ckptbench.plan.metadata import dcp_metadata_bytes

    m = jobmodel.read_results(tiny_run)
    e = estimate(m, job405, force=True)
    r = e.restore
    assert r is not None and r.metadata_read is not None
    assert job405.metadata_bytes == dcp_metadata_bytes(build_plan(load_workload(W405)))
    assert r.metadata_read.readers == 16384
    assert r.metadata_read.nbytes == job405.metadata_bytes
    assert r.parts["metadata"] > m.restore.parts["metadata"]  # 462 MiB, not the run's
    said = " ".join(e.assumptions())
    assert "16,384 readers of 462.3 MiB, 7.223 TiB per restart" in said
    assert "were all 16,384 readers to share one storage" in said


def test_shares_add_up_to_c_and_r(tmp_path, tiny_run, job405) -> None:
    """Every second of C and R is measured, modelled, given or assumed, and they add up."""
    runs = [(jobmodel.read_results(tiny_run), job405),
            (jobmodel.read_results(tiny_run), jobmodel.uniform("t", 4e12, 1024, 4, ceiling=1e9)),
            (dcp_load_run(tmp_path, "d.jsonl", 2.0), job405),
            (results(tmp_path, bytes_per_rank=10**9, save_s=[4.0] * 5, restore_s=[2.0] * 5),
             jobmodel.uniform("t", 8e11, 800, 8))]
    for m, t in runs:
        e = estimate(m, t, force=True, restart=60.0)
        shares = e.shares()
        assert sum(s.seconds for s in shares["save"]) == pytest.approx(e.save_s)
        assert sum(s.seconds for s in shares["restore"]) == pytest.approx(e.restore_s)
        totals = e.share_totals()
        assert sum(totals["save"].values()) == pytest.approx(e.save_s)
        assert sum(totals["restore"].values()) == pytest.approx(e.restore_s)
        assert {s.kind for v in shares.values() for s in v} <= {
            "measured", "modelled", "given", "assumed"}
        assert totals["restore"]["assumed"] == pytest.approx(60.0)  # the restart ("test")
        lines = e.describe_shares()
        assert lines[0].startswith(f"C {e.save_s:.3g} s: ")
        assert e.to_dict()["shares"]["totals"] == totals
    e = estimate(*runs[0], force=True)
    totals = e.share_totals()
    assert totals["save"]["modelled"] >= e.save.parts["coordinator"] > 0
    assert totals["restore"]["assumed"] == 0.0 and totals["restore"]["given"] == 0.0
    capped = estimate(*runs[1], force=True)
    assert any(s.name == "ceiling" and s.kind == "given" for s in capped.shares()["restore"])


def test_the_coordinator_model_meets_its_measurements() -> None:
    """The refit is within 25 % of real dcp.save's coordinator CPU where it was measured,
    and says its range."""
    from ckptbench.jobmodel.dcp_costs import DCP_SAVE_COORDINATOR, MEASURED_SAVE, count

    assert {round(c, -3) for c, _ in MEASURED_SAVE} >= {7000, 56000, 326000, 1_000_000}
    for chunks, cpu in MEASURED_SAVE:
        assert DCP_SAVE_COORDINATOR.seconds(chunks) == pytest.approx(cpu, rel=0.25)
    lo, hi = DCP_SAVE_COORDINATOR.fitted
    assert lo < 10_000 and hi >= 1_000_000
    said = DCP_SAVE_COORDINATOR.fit_range(2_813_937)
    assert said.startswith(f"fitted {count(lo)}-{count(hi)} chunks; the job has 2.81M: ")
    assert said.endswith("x past it")
    assert "within it" in DCP_SAVE_COORDINATOR.fit_range(hi)


def test_cadence_prints_the_shares_and_the_fit_range(monkeypatch, capsys, tiny_run) -> None:
    import json

    import ckptbench.cli as cli_module
    from ckptbench.cli.cadence_cmd import cadence_command

    monkeypatch.setattr(cli_module, "_register",
                        lambda: cli_module.cli.add_command(cadence_command))
    args = ["cadence", "--results", str(tiny_run), "--workload", str(W405),
            "--failure-preset", "llama3", "--force"]
    assert cli_module.main(args) == 0
    out = capsys.readouterr().out
    assert "modelled vs measured" in out
    assert "fitted 7.28k-1M chunks; the job has 2.81M: 2.81x past it" in out
    assert "16,384 readers x 462.3 MiB" in out
    assert "C " in out and "modelled " in out and "measured " in out
    assert cli_module.main([*args, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    totals = payload["job_model"]["shares"]["totals"]
    assert sum(totals["save"].values()) == pytest.approx(payload["cost"]["save_s"])
    assert sum(totals["restore"].values()) == pytest.approx(payload["cost"]["restore_s"])
    assert any("x past it" in s["note"] for s in payload["job_model"]["shares"]["parts"]["save"])


def test_a_real_torch_dcp_restore_pays_its_planning_once(tmp_path) -> None:
    """A real `--format torch-dcp` run (needs torch): each rank's load parts are read, its
    .metadata read and planning come out of its span and are charged once."""
    pytest.importorskip("torch")
    measure(build_request(TINY, str(tmp_path / "data"), iterations=5, format="torch-dcp"),
            tmp_path / "dcp.jsonl")
    m = jobmodel.read_results(tmp_path / "dcp.jsonl")
    r = m.restore
    assert r is not None and m.format == "torch-dcp" and m.chunks
    assert r.out_of_spans == ("metadata", "planning") and r.metadata_readers == 4
    assert {"metadata", "planning", "data", "sync"} <= set(r.parts)
    small, large = (estimate(m, jobmodel.uniform("t", 4 * m.bytes_per_rank * k, 4, 4),
                             force=True).restore for k in (1, 8))
    assert small is not None and large is not None
    assert small.parts["planning"] == large.parts["planning"] == pytest.approx(
        r.parts["planning"])
    assert large.data_s == pytest.approx(8 * small.data_s, rel=1e-6)
