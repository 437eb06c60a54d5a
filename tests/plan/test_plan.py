"""Plans: every byte of every tensor written exactly once, in the right file, by the right rank."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from ckptbench.plan import build_plan
from ckptbench.plan.export import iter_plan_json, summary
from ckptbench.spec import load_workload, parse_workload

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"


def workload(model=None, parallel=None, state=None, checkpoint=None):
    model = model or {"name": "custom", "layers": 2, "dim": 48, "heads": 4, "kv_heads": 4,
                      "ffn_dim": 100, "vocab_size": 999}
    data = {"model": model, "parallel": parallel or {"world_size": 4}}
    if state:
        data["state"] = state
    if checkpoint:
        data["checkpoint"] = checkpoint
    return parse_workload(data)


def assert_tiles_exactly(plan):
    """Each key's chunks cover its global tensor once: no gap, no overlap, no duplicate."""
    cover = {}
    for i in range(plan.n_chunks):
        c = plan.chunk(i)
        grid = cover.setdefault(c.key, np.zeros(c.global_shape or (1,), dtype=np.int32))
        if not c.global_shape:
            grid[0] += 1
            continue
        sl = tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes, strict=True))
        grid[sl] += 1
        assert c.nbytes == int(np.prod(c.sizes)) * np.dtype(
            "float32" if c.dtype == "float32" else "float16").itemsize
    for key, grid in cover.items():
        assert grid.min() == 1 and grid.max() == 1, key
    return cover


@pytest.mark.parametrize(
    "parallel",
    [
        {"world_size": 4},  # FSDP2, uneven dims
        {"world_size": 8},  # FSDP2 with empty shards (kv rows 2*12=24 over 8... vocab 999)
        {"world_size": 8, "dp_replicate": 2},  # HSDP
        {"world_size": 4, "tp": 4},  # TP alone
        {"world_size": 8, "tp": 2},  # TP x FSDP2
        {"world_size": 8, "tp": 2, "pp": 2},  # 3-D
        {"world_size": 16, "tp": 2, "pp": 2, "dp_replicate": 2},  # 4-D
    ],
)
def test_every_element_written_once(parallel):
    plan = build_plan(workload(parallel=parallel))
    cover = assert_tiles_exactly(plan)
    w = plan.workload
    expected = sum(int(np.prod(g.shape)) for g in cover.values() if g.shape != (1,))
    # model + exp_avg + exp_avg_sq, 4 bytes each, plus one 4-byte step per parameter
    params = expected // 3
    assert plan.total_bytes == expected * 4 + 4 * (2 * 9 + 3)
    assert params == sum(int(np.prod(t)) for t in
                         [g.shape for k, g in cover.items() if k.startswith("model.")])
    assert plan.n_files == w.parallel.world_size
    assert int(plan.rank_bytes().sum()) == plan.total_bytes


def test_pipeline_stages_hold_contiguous_layers():
    plan = build_plan(workload(model={"name": "custom", "layers": 4, "dim": 32, "heads": 4,
                                      "kv_heads": 2, "ffn_dim": 64, "vocab_size": 100},
                               parallel={"world_size": 4, "pp": 2}))
    keys_of_rank = defaultdict(set)
    for r in range(4):
        for f in plan.files_of_rank(r):
            keys_of_rank[r] |= {c.key for c in plan.iter_chunks(f)}
    stage0 = keys_of_rank[0] | keys_of_rank[1]
    stage1 = keys_of_rank[2] | keys_of_rank[3]
    assert "model.tok_embeddings.weight" in stage0 and "model.layers.1.ffn_norm.weight" in stage0
    assert "model.layers.2.attention.wq.weight" in stage1 and "model.output.weight" in stage1
    assert not any(k.startswith(("model.layers.2", "model.layers.3", "model.norm")) for k in stage0)


def test_replicated_chunks_are_written_once_by_the_least_loaded_holder():
    # TP 4: norms are replicated on the 4 ranks; DCP gives each to the smallest plan so far.
    plan = build_plan(workload(parallel={"world_size": 4, "tp": 4}))
    writers = defaultdict(list)
    for r in range(4):
        for f in plan.files_of_rank(r):
            for c in plan.iter_chunks(f):
                writers[c.key].append(r)
    norm_writers = [writers[k] for k in writers if k.endswith("norm.weight")]
    assert all(len(w) == 1 for w in norm_writers)
    # Rank 0 holds the embedding shard first; the norms go to the others, spread out.
    assert {w[0] for w in norm_writers} - {0}
    steps = [writers[k][0] for k in writers if k.endswith(".step")]
    assert len(set(steps)) > 1  # spread over ranks, not all on rank 0


def test_expert_parallel_splits_experts():
    w = parse_workload({
        "model": {"name": "custom", "layers": 2, "dim": 32, "heads": 4, "kv_heads": 2,
                  "ffn_dim": 64, "vocab_size": 100, "experts": 8, "moe_ffn_dim": 16,
                  "shared_experts": 1},
        "parallel": {"world_size": 8, "ep": 4},
    })
    plan = build_plan(w)
    assert_tiles_exactly(plan)
    experts = [plan.chunk(i) for i in range(plan.n_chunks)
               if plan.chunk(i).key == "model.layers.0.moe.experts.w1"]
    # EP 4 over 8 experts -> 2 experts per EP rank, FSDP 2 inside -> 1 expert per rank
    assert sorted(c.offsets[0] for c in experts) == list(range(8))
    assert all(c.sizes[0] == 1 for c in experts)


def test_dcp_threads_split_files_by_size():
    plan = build_plan(workload(parallel={"world_size": 2}, checkpoint={"threads": 3}))
    assert plan.n_files == 6
    assert plan.file_paths[:3] == ("__0_0.distcp", "__0_1.distcp", "__0_2.distcp")
    sizes = plan.file_bytes[:3]
    assert sizes.max() - sizes.min() <= max(plan.chunk_nbytes)


def test_per_chunk_files():
    plan = build_plan(workload(checkpoint={"files": "per-chunk"}))
    assert plan.n_files == plan.n_chunks
    assert "model.tok_embeddings.weight/0.0" in plan.file_paths


@pytest.mark.parametrize(
    ("name", "files", "gib", "total"),
    [
        ("mlperf-llama3-8b", 16, 104.7, 112_425_623_552),
        ("mlperf-llama3-70b", 128, 911.2, 978_406_572_032),
        ("mlperf-llama3-405b", 1544, 5292.2, 5_682_508_791_808),
        ("mlperf-llama3-1t", 2072, 15426.6, 16_564_174_094_592),
    ],
)
def test_mlperf_storage_checkpoint_workloads(name, files, gib, total):
    plan = build_plan(load_workload(WORKLOADS / f"{name}.toml"))
    assert plan.n_files == files
    assert plan.total_bytes == total
    assert round(plan.total_bytes / 2**30, 1) == gib
    assert plan.checkpoint_name(1) == "global_epoch1_step1"


def test_mlperf_405b_file_names_match_dlio():
    plan = build_plan(load_workload(WORKLOADS / "mlperf-llama3-405b.toml"))
    names = set(plan.file_paths)
    assert "layer_0-model_0_model_states.pt" in names
    assert "layer_128-model_255_model_states.pt" in names
    assert "zero_pp_rank_1_mp_rank_255_optim_states.pt" in names
    sizes = dict(zip(plan.file_paths, plan.file_bytes.tolist(), strict=True))
    assert sizes["layer_1-model_0_model_states.pt"] == 796_983_296
    assert sizes["layer_128-model_255_model_states.pt"] == 32_768
    assert sizes["zero_pp_rank_0_mp_rank_0_optim_states.pt"] == 9_513_171_840
    # ZeRO-1: only data-parallel rank 0 (ranks 0-255) writes model layers
    assert plan.rank_bytes()[256:].max() == 9_513_171_840


def test_plan_json_contract():
    plan = build_plan(load_workload(WORKLOADS / "tiny.toml"))
    doc = json.loads("".join(iter_plan_json(plan, ranks=[0, 3])))
    assert doc["schema"] == "ckptbench.plan/1"
    assert doc["world_size"] == 4 and doc["total_bytes"] == 23_559_252
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    assert "files" in doc["ranks"][0] and "files" not in doc["ranks"][1]
    f = doc["ranks"][0]["files"][0]
    assert f["path"] == "__0_0.distcp"
    c = f["chunks"][1]
    assert c == {"key": "model.layers.0.attention.wq.weight", "dtype": "float32",
                 "global_shape": [256, 256], "offsets": [0, 0], "sizes": [64, 256], "nbytes": 65536}
    assert sum(r["bytes"] for r in doc["ranks"]) == doc["total_bytes"]
    assert f["bytes"] == sum(ch["nbytes"] for ch in f["chunks"])


def test_summary_of_a_big_plan():
    plan = build_plan(load_workload(WORKLOADS / "llama3-70b-fsdp2-tp8-256.toml"))
    s = summary(plan)
    # 70.55B params x (4 + 4 + 4) bytes + one float32 step per tensor
    assert s["total_bytes"] == 70_553_706_496 * 12 + 4 * 723
    assert s["files"] == 256
    assert s["rank_bytes"]["min"] <= s["rank_bytes"]["median"] <= s["rank_bytes"]["max"]


def test_cli_plan_prints_summary_and_json():
    r = subprocess.run([sys.executable, "-m", "ckptbench", "plan", str(WORKLOADS / "tiny.toml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "23,559,252" in r.stdout and "__" in r.stdout
    r = subprocess.run([sys.executable, "-m", "ckptbench", "plan", str(WORKLOADS / "tiny.toml"),
                        "--json", "--ranks", "0,3"], capture_output=True, text=True, timeout=120)
    assert json.loads(r.stdout)["total_bytes"] == 23_559_252
