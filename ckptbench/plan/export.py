"""A plan as people and programs read it: a summary, and the ``ckptbench.plan/1`` JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ckptbench.plan.core import PLAN_SCHEMA, Plan


def summary(plan: Plan) -> dict[str, Any]:
    rank_bytes = plan.rank_bytes()
    largest = int(np.argmax(plan.file_bytes)) if plan.n_files else -1
    w = plan.workload
    return {
        "workload": w.name,
        "model": w.model.name,
        "layout": w.parallel.layout,
        "world_size": plan.world_size,
        "mesh": {"tp": w.parallel.tp, "pp": w.parallel.pp, "dp_replicate": w.parallel.dp_replicate,
                 "dp_shard": w.parallel.dp_shard, "ep": w.parallel.ep},
        "files_grouping": w.checkpoint.files,
        "total_bytes": plan.total_bytes,
        "total_gib": plan.total_bytes / 2**30,
        "files": plan.n_files,
        "chunks": plan.n_chunks,
        "state_keys": len(plan.keys),
        "rank_bytes": {
            "min": int(rank_bytes.min()),
            "median": float(np.median(rank_bytes)),
            "max": int(rank_bytes.max()),
        },
        "largest_file": {
            "path": plan.file_paths[largest] if largest >= 0 else None,
            "bytes": int(plan.file_bytes[largest]) if largest >= 0 else 0,
        },
        "checkpoint_dir": plan.checkpoint_dir,
        "manifest": plan.manifest,
    }


def iter_plan_json(plan: Plan, ranks: Iterable[int] | None = None) -> Iterator[str]:
    """The plan as JSON text, in pieces, so a 16k-rank plan never sits in memory as text.

    All ranks are listed with their byte counts; per-file and per-chunk detail only for
    `ranks` (all when None).
    """
    detail = None if ranks is None else set(ranks)
    rank_bytes = plan.rank_bytes()
    yield (f'{{"schema": "{PLAN_SCHEMA}", "world_size": {plan.world_size}, '
           f'"total_bytes": {plan.total_bytes}, "ranks": [')
    for r in range(plan.world_size):
        entry: dict[str, Any] = {"rank": r, "bytes": int(rank_bytes[r])}
        if detail is None or r in detail:
            entry["files"] = [
                {"path": plan.file_paths[f], "bytes": int(plan.file_bytes[f]),
                 "chunks": [c.to_dict() for c in plan.iter_chunks(f)]}
                for f in plan.files_of_rank(r)
            ]
        yield ("" if r == 0 else ", ") + json.dumps(entry)
    yield "]}\n"
