"""Plans against what PyTorch's own DCP wrote (torch 2.15, CPU, gloo) for small models.

tests/golden/make_dcp_golden.py regenerates the goldens; see tests/golden/README.md.
Every tensor item of every data file must match: key, dtype, global shape, offsets,
sizes, and its place in the file's order. (Non-tensor param_group items are not written
by ckptbench; DCP's torch.save containers add ~1.5 KB per item that raw files do not.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptbench.plan import build_plan
from ckptbench.spec import load_workload

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "dcp"
CASES = sorted(p.stem for p in GOLDEN.glob("*.json"))


def test_the_goldens_are_there():
    assert {"fsdp2_even", "fsdp2_uneven", "fsdp2_uneven_threads2", "fsdp2_bf16", "hsdp", "tp",
            "tp_fsdp2_uneven"} <= set(CASES)


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
