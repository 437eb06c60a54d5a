"""What torch DCP's coordinator spends on a save, by chunk count: the CPU part of C that
ckptbench's job model charges instead of its own manifest encoder's time.

Run with torch installed (a side venv; ckptbench itself is not needed)::

    python benchmarks/dcp_coordinator_cost.py --ranks 64,256,1024,4096 --out results.json

On one process, no process group: synthetic local ``SavePlan``s of ``WriteItem``s
(shaped as an FSDP job's: every rank holds one shard of each of its group's tensors,
2-D fp32 shards sharded along dim 0) are handed to the coordinator's steps directly,
timed one by one:

* ``gather``: unpickling every rank's local plan (what the plans' gather costs the
  coordinator; with plan caching the ranks send empty plans);
* ``plan``: ``DefaultSavePlanner.create_global_plan`` (dedup, global plan and metadata,
  validation) and the storage writer's ``prepare_global_plan``;
* ``scatter``: pickling the global plan (delta) sent back to the ranks;
* ``finish``: what ``FileSystemWriter.finish`` does before its write: the storage index
  of every chunk and ``pickle.dumps`` of ``.metadata`` (the write itself is storage).

Each chunk count runs two saves on one planner: the first (cold) and the second with
unchanged plans (with ``enable_plan_caching=True`` the second skips planning). Times
are CPU seconds of this process (one thread; the garbage collector included, as in a
real coordinator). Prints one JSON object: the rows and a least-squares fit
``seconds = a + b * chunks`` per caching mode.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import platform
import time
from typing import Any


def _torch() -> Any:
    import torch
    import torch.distributed.checkpoint

    return torch


def local_plans(ranks: int, per_rank: int, shards: int) -> list[Any]:
    """One SavePlan per rank: `per_rank` tensor shards each; the ranks of a group of
    `shards` share tensors (rank r holds shard r % shards of its group's tensors)."""
    torch = _torch()
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )

    rows, cols = 1024, 4096
    props = TensorProperties(dtype=torch.float32)
    size = torch.Size([rows * shards, cols])
    plans = []
    for r in range(ranks):
        group, pos = divmod(r, shards)
        offsets = torch.Size([pos * rows, 0])
        chunk = ChunkStorageMetadata(offsets=offsets, sizes=torch.Size([rows, cols]))
        items = [WriteItem(index=MetadataIndex(f"model.t{group * per_rank + j}.weight", offsets),
                           type=WriteItemType.SHARD,
                           tensor_data=TensorWriteData(chunk=chunk, properties=props, size=size))
                 for j in range(per_rank)]
        plans.append(SavePlan(items))
    return plans


def _timed(fn: Any) -> tuple[Any, float]:
    """`fn()` and the CPU seconds this process spent on it (``process_time``: on a
    shared machine, time spent descheduled is not DCP's cost; the steps run on one
    thread, so on an idle machine CPU and wall time agree)."""
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def one_save(planner: Any, writer: Any, plans: list[Any], cached: bool) -> dict[str, float]:
    """The coordinator's steps of one save, timed."""
    from torch.distributed.checkpoint.planner import SavePlan
    from torch.distributed.checkpoint.storage import WriteResult

    sent = [SavePlan([], usable=False) for _ in plans] if cached else plans
    blobs = [pickle.dumps(p) for p in sent]  # what each rank sends (the ranks' cost)
    received, gather_s = _timed(lambda: [pickle.loads(b) for b in blobs])
    (delta, metadata), plan_s = _timed(lambda: planner.create_global_plan(received))
    delta, prep_s = _timed(lambda: writer.prepare_global_plan(delta))
    _, scatter_s = _timed(lambda: [pickle.dumps(p) for p in delta])
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    results = [[WriteResult(index=item.index, size_in_bytes=1 << 20,
                            storage_data=_StorageInfo(f"__{i}_0.distcp", k << 20, 1 << 20))
                for k, item in enumerate(p.items)] for i, p in enumerate(plans)]

    def finish() -> int:
        storage_md = {}
        for wr_list in results:
            storage_md.update({wr.index: wr.storage_data for wr in wr_list})
        metadata.storage_data = storage_md
        return len(pickle.dumps(metadata))

    size, finish_s = _timed(finish)
    return {"gather_s": gather_s, "plan_s": plan_s + prep_s, "scatter_s": scatter_s,
            "finish_s": finish_s, "metadata_bytes": size,
            "total_s": gather_s + plan_s + prep_s + scatter_s + finish_s}


def measure(ranks: int, per_rank: int, shards: int, caching: bool) -> dict[str, Any]:
    """Two saves of a fresh job of `ranks` ranks on one planner."""
    from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter
    from torch.distributed.checkpoint.planner import SavePlanner

    for cache in ("_cached_save_plan", "_cached_all_plans", "_cached_global_plan",
                  "_cached_metadata", "_cached_final_save_plan"):
        getattr(SavePlanner, cache, {}).clear()  # a fresh job each time
    plans = local_plans(ranks, per_rank, min(shards, ranks))
    planner = DefaultSavePlanner(flatten_state_dict=False, flatten_sharded_tensors=False,
                                 enable_plan_caching=caching)
    writer = FileSystemWriter("/nonexistent", sync_files=False)
    gc.collect()
    first = one_save(planner, writer, plans, cached=False)
    second = one_save(planner, writer, plans, cached=caching)
    return {"ranks": ranks, "chunks": ranks * per_rank, "caching": caching,
            "first": first, "second": second}


def fit(rows: list[dict[str, Any]], which: str) -> dict[str, float]:
    """Least squares seconds = a + b * chunks over the rows."""
    xs = [float(r["chunks"]) for r in rows]
    ys = [r[which]["total_s"] for r in rows]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if n > 1 else 0.0
    return {"a_s": my - b * mx, "b_s_per_chunk": b}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="64,256,1024,4096")
    ap.add_argument("--per-rank", type=int, default=172,
                    help="chunks per rank (405B TP8xPP16xFSDP128: 2,813,937 / 16,384)")
    ap.add_argument("--shards", type=int, default=128, help="ranks sharing a tensor (FSDP)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch = _torch()
    rows = []
    for caching in (False, True):
        for ranks in (int(x) for x in args.ranks.split(",")):
            row = measure(ranks, args.per_rank, args.shards, caching)
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = {
        "source": {"torch": torch.__version__, "python": platform.python_version(),
                   "machine": platform.machine(), "cpu": platform.processor() or "?",
                   "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "per_rank": args.per_rank, "shards": args.shards},
        "rows": rows,
        "fit": {f"caching={c}": {w: fit([r for r in rows if r["caching"] == c], w)
                                 for w in ("first", "second")} for c in (False, True)},
    }
    print(json.dumps(out["fit"], indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
