"""Plans against what PyTorch's own DCP wrote (torch 2.15, CPU, gloo) for small models.

tests/golden/make_dcp_golden.py regenerates the goldens; see tests/golden/README.md.
Every tensor item of every data file must match: key, dtype, global shape, offsets,
sizes, and its place in the file's order; every chunk's writer is DCP's; each rank's
local plan (what it sent DCP's coordinator before dedup) is the plan's holdings of it, and
torch 2.15's dedup rule, rewritten below, gives the files' writers from those plans. (Non-tensor param_group items are not written
by ckptbench; DCP's torch.save containers add ~1.5 KB per item that raw files do not.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ckptbench.plan import build_plan
from ckptbench.plan.restore import held_pieces
from ckptbench.plan.state import PARAM_GROUP_ITEMS
from ckptbench.spec import load_workload, scaled

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "dcp"
WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
CASES = sorted(p.stem for p in GOLDEN.glob("*.json"))


def test_the_goldens_are_there():
    assert {"fsdp2_even", "fsdp2_uneven", "fsdp2_uneven_threads2", "fsdp2_bf16", "hsdp",
            "hsdp2x4", "hsdp4x4", "tp", "tp_fsdp2_uneven"} <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_plan_matches_torch_dcp_chunk_by_chunk(case):
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    plan = build_plan(load_workload(GOLDEN / f"{case}.toml"))
    assert plan.world_size == golden["world_size"]
    want_files = sorted(golden["files"])
    data_files = sorted(f for f in golden["file_sizes"] if f.endswith(".distcp"))
    assert sorted(plan.file_paths) == data_files
    ours = {}
    for f, path in enumerate(plan.file_paths):
        ours[path] = [(c.key, c.dtype, list(c.global_shape), list(c.offsets), list(c.sizes))
                      for c in plan.iter_chunks(f)]
    for path in want_files:
        theirs = [(i["key"], i["dtype"], i["global_shape"], i["offsets"], i["sizes"])
                  for i in golden["files"][path]]
        assert ours[path] == theirs, path
    for path in set(ours) - set(want_files):
        assert ours[path] == [], path


# --- writers: DCP's dedup_save_plans (torch 2.15) on the local plans the ranks sent ---

HSDP_CASES = ["hsdp", "hsdp2x4", "hsdp4x4"]


def _golden_writers(golden: dict) -> dict[tuple[str, tuple[int, ...]], int]:
    """(key, chunk offsets) -> the rank whose file holds the chunk (thread_count files
    ``__{rank}_{i}.distcp``)."""
    return {(it["key"], tuple(it["offsets"])): int(name[2:].split("_")[0])
            for name, items in golden["files"].items() for it in items}


def _plan_writers(plan) -> dict[tuple[str, tuple[int, ...]], int]:
    out = {}
    for f in range(plan.n_files):
        for c in plan.iter_chunks(f):
            out[(c.key, c.offsets)] = int(plan.file_rank[f])
    return out


def dedup_save_plans(plans: list[list[tuple[str, tuple[int, ...] | None]]],
                     weight: dict[str, int]) -> dict[tuple[str, tuple[int, ...] | None], int]:
    """torch 2.15's ``dedup_save_plans`` (save_to_lowest_rank=False) line for line, on
    plans of (key, offsets) items: items in order of first appearance, each kept by the
    holder plan with the least planned storage (``min`` over the set of holders, so ties
    go by the set's iteration order), which then grows by the item's global tensor bytes
    (``tensor_storage_size() or 1``; 1 for a non-tensor item)."""
    holders: dict[tuple[str, tuple[int, ...] | None], set[int]] = {}
    for r, items in enumerate(plans):
        for item in items:
            holders.setdefault(item, set()).add(r)
    size = [0] * len(plans)
    kept = {}
    for item, ranks in holders.items():
        best = min(ranks, key=lambda r: size[r])
        size[best] += (weight[item[0]] or 1) if item[1] is not None else 1
        kept[item] = best
    return kept


def _local_plans(golden: dict) -> list[list[tuple[str, tuple[int, ...] | None]]]:
    return [[(key, None if off is None else tuple(off)) for key, off in
             golden["local_plans"][str(r)]] for r in range(golden["world_size"])]


def _weights(golden: dict) -> dict[str, int]:
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}
    return {it["key"]: math.prod(it["global_shape"]) * itemsize[it["dtype"]]
            for items in golden["files"].values() for it in items}


def test_the_hsdp_goldens_are_there():
    assert set(HSDP_CASES) <= set(CASES)
    for case in HSDP_CASES:
        assert "local_plans" in json.loads((GOLDEN / f"{case}.json").read_text()), case


@pytest.mark.parametrize("case", CASES)
def test_every_chunk_has_dcps_writer(case):
    """Every chunk, replicated ones included (HSDP replicas, TP norms, step scalars), is
    written by the rank real DCP chose."""
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    theirs = _golden_writers(golden)
    ours = _plan_writers(build_plan(load_workload(GOLDEN / f"{case}.toml")))
    assert set(ours) == set(theirs)
    wrong = sorted((k, ours[k], theirs[k]) for k in ours if ours[k] != theirs[k])
    assert not wrong, f"{len(wrong)} of {len(ours)} chunks by another rank, e.g. {wrong[:3]}"


@pytest.mark.parametrize("case", CASES)
def test_local_plans_are_each_ranks_holdings(case):
    """What each rank sent DCP's coordinator before dedup is what the plan says it holds:
    its piece of every key in key order (replicated and empty pieces included), then
    AdamW's 12 param_group entries."""
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    plan = build_plan(load_workload(GOLDEN / f"{case}.toml"))
    groups = [(f"optim.param_groups.0.{n}", None) for n in PARAM_GROUP_ITEMS]
    for r, theirs in enumerate(_local_plans(golden)):
        ours = [(plan.keys[k].name, off) for k, off, _ in held_pieces(plan, r)] + groups
        assert ours == theirs, r


@pytest.mark.parametrize("case", CASES)
def test_dcps_rule_on_the_local_plans_gives_the_files(case):
    """The rule as written above, run on the recorded local plans, puts every chunk where
    DCP did; without the 12 one-byte param_group items it would not (HSDP: they decide the
    ties between replica partners)."""
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    plans, weight = _local_plans(golden), _weights(golden)
    kept = dedup_save_plans(plans, weight)
    assert {k: r for k, r in kept.items() if k[1] is not None} == _golden_writers(golden)
    if case in ("hsdp2x4", "hsdp4x4"):
        bare = dedup_save_plans([[i for i in p if i[1] is not None] for p in plans], weight)
        assert bare != {k: r for k, r in kept.items() if k[1] is not None}


def test_hsdp_at_scale_follows_dcps_rule():
    """llama3-8b HSDP 2x4 at --scale 16 (3,783 chunks, issue 42): the plan's writers are
    what the rule gives on the planned local plans."""
    plan = build_plan(scaled(load_workload(WORKLOADS / "llama3-8b-hsdp2-8.toml"), 16))
    weight = {k.name: math.prod(k.global_shape) * k.itemsize for k in plan.keys}
    groups = [(f"optim.param_groups.0.{n}", None) for n in PARAM_GROUP_ITEMS]
    plans = [[(plan.keys[k].name, off) for k, off, _ in held_pieces(plan, r)] + groups
             for r in range(plan.world_size)]
    kept = {k: r for k, r in dedup_save_plans(plans, weight).items() if k[1] is not None}
    assert kept == _plan_writers(plan)
