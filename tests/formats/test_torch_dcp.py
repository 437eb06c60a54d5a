"""The torch-dcp format (optional: needs torch): DCP's own writer on the planned chunks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ckptbench.formats.base import file_jobs
from ckptbench.formats.common import NP_DTYPES, chunk_bytes, chunk_tasks
from ckptbench.payload import PayloadGenerator
from ckptbench.plan import build_plan
from ckptbench.spec import load_workload

from .conftest import TINY, ckptbench, records

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("workload", ["tiny", "bf16"])
def test_round_trip(workload: str, bf16_workload: Path, tmp_path: Path) -> None:
    wl = TINY if workload == "tiny" else bf16_workload
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(wl), "--target", str(tmp_path / "t"), "--format", "torch-dcp",
                  "--iterations", "2", "--threads", "2", "--results", str(results))
    assert r.returncode == 0, r.stderr
    recs = records(results)
    phases = [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]
    assert len(phases) == 2 and all(p["verified"] for p in phases)
    ops = [x for x in recs if x["type"] == "op"]
    # DCP reads its own .metadata inside dcp_load (ckptbench's manifest, needed only to
    # verify, is read off the clock)
    assert {"dcp_save", "dcp_load"} <= {x["op"] for x in ops}
    saved = sum(x["bytes"] for x in ops if x["op"] == "dcp_save" and x["iteration"] == 1)
    assert saved == build_plan(load_workload(wl)).total_bytes
    # DCP commits the checkpoint itself (its .metadata): ckptbench's own manifest, kept
    # for its restores' checks, is written after the save, off its clock
    assert not any(x["op"] in ("commit", "gather", "coordinator") and x["phase"] == "save"
                   for x in ops)
    saves = [x for x in recs if x["type"] == "phase" and x["phase"] == "save"]
    for p in saves:
        assert set(p["parts"]) == {"data"} and p["commit_ns"] is None
        assert p["off_clock"]["ckptbench_manifest"] > 0
        ranks = [x for x in recs if x["type"] == "rank" and x["phase"] == "save"
                 and x["iteration"] == p["iteration"]]
        span = (max(x["end_ns"] for x in ranks) - min(x["start_ns"] for x in ranks)) / 1e9
        assert p["parts"]["data"] == pytest.approx(span)


def test_dcp_reads_it_back_unsharded(bf16_workload: Path, tmp_path: Path) -> None:
    """A plain DCP load (one process, whole tensors) sees the planned chunks' bytes, in
    the true dtype: DCP wrote a normal checkpoint, resharding included."""
    import torch.distributed.checkpoint as dcp

    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    r = ckptbench("run", str(bf16_workload), "--target", str(target), "--format", "torch-dcp",
                  "--keep", "--no-restore", "--results", str(results))
    assert r.returncode == 0, r.stderr
    ckpt = next(x["checkpoint"] for x in records(results) if x["type"] == "phase")
    plan = build_plan(load_workload(bf16_workload))
    name = "model.layers.0.attention.wq.weight"
    key = next(k for k in plan.keys if k.name == name)
    state = {name: torch.empty(key.global_shape, dtype=torch.bfloat16)}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(target / ckpt / "dcp")))
    got = state[name].view(torch.int16).numpy().view(np.uint16)
    manifest = json.loads((target / ckpt / ".metadata").read_text())
    assert manifest["format"] == "torch-dcp"
    gen = PayloadGenerator("random", 0)
    seen = 0
    for t in chunk_tasks(plan, file_jobs(plan, list(range(plan.world_size)), ckpt, 1, 0)):
        if plan.keys[t.key].name != name:
            continue
        want, _ = chunk_bytes(gen, t, NP_DTYPES["bfloat16"])
        box = tuple(slice(o, o + n) for o, n in zip(t.offsets, t.sizes, strict=True))
        assert np.array_equal(got[box], want)
        seen += 1
    assert seen == 4


GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "dcp"


def test_dcp_dedups_whole_local_plans_as_the_plan_and_a_trainer(tmp_path: Path) -> None:
    """HSDP 2x4: every rank hands DCP its whole local plan (replicas, steps, empty pieces,
    AdamW's param group) and DCP's own dedup picks the writers: each data file holds the
    items, in the order, that a real trainer's save of the layout put there
    (tests/golden/dcp/hsdp2x4.json), so every chunk's writer is the plan's; the
    .metadata (flattened as a trainer's) is within the checkpoint path's length of it."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    case = "hsdp2x4"
    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    r = ckptbench("run", str(GOLDEN / f"{case}.toml"), "--target", str(target), "--format",
                  "torch-dcp", "--keep", "--no-restore", "--results", str(results))
    assert r.returncode == 0, r.stderr
    ckpt = next(x["checkpoint"] for x in records(results) if x["type"] == "phase")
    dcp_dir = target / ckpt / "dcp"
    md = FileSystemReader(str(dcp_dir)).read_metadata()
    files: dict[str, list[tuple[int, str, list[int]]]] = {}
    spans: dict[str, list[tuple[int, str]]] = {}
    for index, info in md.storage_data.items():
        if isinstance(md.state_dict_metadata[index.fqn], BytesStorageMetadata):
            spans.setdefault(info.relative_path, []).append((info.offset, index.fqn))
        else:
            files.setdefault(info.relative_path, []).append(
                (info.offset, index.fqn, list(index.offset)))
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    assert {f: [(k, o) for _, k, o in sorted(v)] for f, v in files.items()} == {
        f: [(i["key"], i["offsets"]) for i in items] for f, items in golden["files"].items()}
    assert {f: [k for _, k in sorted(v)] for f, v in spans.items()} == golden["bytes_items"]
    plan = build_plan(load_workload(GOLDEN / f"{case}.toml"))
    writers = {(c.key, c.offsets): int(plan.file_rank[f])
               for f in range(plan.n_files) for c in plan.iter_chunks(f)}
    for f, items in files.items():
        assert all(writers[(k, tuple(o))] == int(f[2:].split("_")[0]) for _, k, o in items), f
    assert abs((dcp_dir / ".metadata").stat().st_size - golden["file_sizes"][".metadata"]) < 256
