"""The restore layout ([restore], CLI overrides) and the restore plan's shape and figures."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ckptbench.errors import SpecError
from ckptbench.plan import build_plan
from ckptbench.plan.restore import RESTORE_PLAN_SCHEMA, build_restore_plan, overlaps
from ckptbench.spec import load_workload, parse_layout_overrides, parse_workload, with_restore

TINY = "workloads/tiny.toml"
CUSTOM = {
    "model": {"name": "custom", "layers": 2, "dim": 256, "heads": 8, "kv_heads": 4,
              "ffn_dim": 688, "vocab_size": 1000},
    "parallel": {"world_size": 4, "layout": "fsdp2", "tp": 2},
}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=120)


def test_restore_table_defaults_to_the_training_layout():
    w = parse_workload({**CUSTOM, "restore": {"world_size": 8}})
    assert w.restore is not None
    assert (w.restore.world_size, w.restore.tp, w.restore.dp_shard) == (8, 2, 4)
    assert parse_workload(CUSTOM).restore_parallel == parse_workload(CUSTOM).parallel
    same = parse_workload({**CUSTOM, "restore": {"world_size": 4}})
    assert same.restore is None


@pytest.mark.parametrize(("table", "needle"), [
    ({"world_size": 3}, "[restore] world_size = 3 must be divisible by tp x pp x dp_replicate"),
    ({"tp": 3, "world_size": 6}, "[restore] tp = 3 must divide [model] heads = 8"),
    ({"layout": "fsdp2"}, "[restore] unknown key 'layout'; allowed: world_size, tp, pp,"),
    ({"world_size": 0}, "[restore] world_size = 0 must be an integer >= 1"),
    ({"pp": 4, "world_size": 8}, "[restore] pp = 4 stages is more than [model] layers = 2"),
])
def test_bad_restore_table_names_the_key(table, needle):
    with pytest.raises(SpecError) as err:
        parse_workload({**CUSTOM, "restore": table})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_cli_overrides_name_the_option():
    w = load_workload(TINY)
    assert with_restore(w, {"world_size": 2, "tp": 1}, "--restore-layout").restore_parallel.dp_shard == 2
    with pytest.raises(SpecError, match=r"^--restore-world-size: \[restore\] world_size = 3"):
        with_restore(w, {"world_size": 3}, "--restore-world-size")
    with pytest.raises(SpecError, match="'tp2' is not KEY=N; allowed keys: world_size"):
        parse_layout_overrides("tp2")


def test_megatron_restores_onto_its_own_layout_only():
    w = load_workload("workloads/mlperf-llama3-8b.toml")
    with pytest.raises(SpecError, match="DLIO reads back the files each rank wrote"):
        with_restore(w, {"world_size": 16}, "--restore-world-size")
    rplan = build_restore_plan(build_plan(w))
    assert rplan.source == "dlio" and rplan.amplification == 1.0
    assert np.all(rplan.file_readers() == 1)
    assert np.array_equal(rplan.rank_bytes(), rplan.save.rank_bytes())


def test_overlap_test_is_torchs_including_empty_pieces():
    # saved rows [0,4) [4,8) [8,12); restored: [0,6) [6,6) (empty, strictly inside [4,8)),
    # [12,12) (empty at the end: overlaps nothing)
    s_off = np.array([[0, 0, 0], [4, 0, 0], [8, 0, 0]])
    s_size = np.array([[4, 5, 1], [4, 5, 1], [4, 5, 1]])
    r_off = np.array([[0, 0, 0], [6, 0, 0], [12, 0, 0]])
    r_size = np.array([[6, 5, 1], [0, 5, 1], [0, 5, 1]])
    group, cand = overlaps(r_off, r_size, s_off, s_size, 2)
    assert sorted(zip(group.tolist(), cand.tolist(), strict=True)) == [(0, 0), (0, 1), (1, 1)]


def test_hsdp_restore_reads_every_replica_and_shows_in_the_summary():
    w = with_restore(load_workload(TINY), {"world_size": 8, "dp_replicate": 2}, "x")
    rplan = build_restore_plan(build_plan(w))
    assert rplan.amplification == pytest.approx(2.0, abs=0.01)
    out = run_cli("plan", TINY, "--restore", "--restore-layout", "world_size=8,dp_replicate=2")
    assert out.returncode == 0, out.stderr
    assert "2.001x" in out.stdout and "8 readers" in out.stdout


def test_restore_json_schema_and_rank_detail():
    out = run_cli("plan", TINY, "--restore", "--json", "--restore-world-size", "2",
                  "--restore-layout", "tp=1", "--ranks", "1")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) == {"schema", "world_size", "total_bytes", "ranks"}
    assert doc["schema"] == RESTORE_PLAN_SCHEMA and doc["world_size"] == 2
    assert "reads" not in doc["ranks"][0]
    reads = doc["ranks"][1]["reads"]
    assert set(reads[0]) == {"path", "key", "offsets", "sizes", "nbytes"}
    assert doc["ranks"][1]["bytes"] == sum(r["nbytes"] for r in reads)
    assert doc["total_bytes"] == sum(r["bytes"] for r in doc["ranks"])
    # rank 1 of FSDP2 reads the second half of tok_embeddings: the saved TP x FSDP chunks
    # that overlap rows [500, 1000)
    emb = [r for r in reads if r["key"] == "model.tok_embeddings.weight"]
    assert [r["offsets"][0] for r in emb] == [500, 750]


def test_bad_restore_option_is_one_line_exit_2():
    out = run_cli("plan", TINY, "--restore", "--restore-world-size", "3")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "--restore-world-size: [restore] world_size = 3" in out.stderr
