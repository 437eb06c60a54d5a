"""A plan as people and programs read it: summaries, and the ``ckptbench.plan/1`` and
``ckptbench.restoreplan/1`` JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ckptbench.plan.core import PLAN_SCHEMA, Plan
from ckptbench.plan.restore import RESTORE_PLAN_SCHEMA, RestorePlan


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


def _iter_ranks_json(schema: str, world_size: int, total_bytes: int, rank_bytes: np.ndarray,
                     ranks: Iterable[int] | None, field: str,
                     detail_of: Callable[[int], list[dict[str, Any]]]) -> Iterator[str]:
    """A plan document in pieces, so a 16k-rank plan never sits in memory as text: every
    rank with its bytes, `field` (the detail) only for `ranks` (all when None)."""
    detail = None if ranks is None else set(ranks)
    yield (f'{{"schema": "{schema}", "world_size": {world_size}, '
           f'"total_bytes": {total_bytes}, "ranks": [')
    for r in range(world_size):
        entry: dict[str, Any] = {"rank": r, "bytes": int(rank_bytes[r])}
        if detail is None or r in detail:
            entry[field] = detail_of(r)
        yield ("" if r == 0 else ", ") + json.dumps(entry)
    yield "]}\n"


def iter_plan_json(plan: Plan, ranks: Iterable[int] | None = None) -> Iterator[str]:
    """The plan as ``ckptbench.plan/1`` JSON text, in pieces: per-file and per-chunk detail
    only for `ranks` (all when None)."""
    def files(r: int) -> list[dict[str, Any]]:
        return [{"path": plan.file_paths[f], "bytes": int(plan.file_bytes[f]),
                 "chunks": [c.to_dict() for c in plan.iter_chunks(f)]}
                for f in plan.files_of_rank(r)]

    return _iter_ranks_json(PLAN_SCHEMA, plan.world_size, plan.total_bytes, plan.rank_bytes(),
                            ranks, "files", files)


def restore_summary(rplan: RestorePlan) -> dict[str, Any]:
    """The restore plan in numbers: bytes read against the checkpoint's, per-rank spread,
    the busiest file's readers."""
    rank_bytes = rplan.rank_bytes()
    read = int(rank_bytes.sum())  # read once: 43 million reads at 131,072 ranks
    saved = rplan.save.total_bytes
    readers = rplan.file_readers()
    busiest = int(np.argmax(readers)) if len(readers) else -1
    p = rplan.layout
    return {
        "source": rplan.source,
        "world_size": rplan.world_size,
        "mesh": {"tp": p.tp, "pp": p.pp, "dp_replicate": p.dp_replicate, "dp_shard": p.dp_shard,
                 "ep": p.ep},
        "checkpoint_bytes": saved,
        "read_bytes": read,
        "amplification": read / saved if saved else 0.0,
        "reads": rplan.n_reads,
        "rank_bytes": {
            "min": int(rank_bytes.min()) if len(rank_bytes) else 0,
            "median": float(np.median(rank_bytes)) if len(rank_bytes) else 0.0,
            "max": int(rank_bytes.max()) if len(rank_bytes) else 0,
        },
        "busiest_file": {
            "path": rplan.save.file_paths[busiest] if busiest >= 0 else None,
            "readers": int(readers[busiest]) if busiest >= 0 else 0,
        },
        "file_readers_median": float(np.median(readers)) if len(readers) else 0.0,
    }


def iter_restore_json(rplan: RestorePlan, ranks: Iterable[int] | None = None) -> Iterator[str]:
    """The restore plan as ``ckptbench.restoreplan/1`` JSON, in pieces. Every rank with the
    bytes it reads; the reads themselves (the *saved* chunk: key, offsets, sizes, payload
    bytes, and the file holding it) only for `ranks` (all when None)."""
    save = rplan.save

    def reads(r: int) -> list[dict[str, Any]]:
        out = []
        for i in rplan.reads_of_rank(r).tolist():
            c = save.chunk(i)
            out.append({"path": save.file_paths[int(save.chunk_file[i])], "key": c.key,
                        "offsets": list(c.offsets), "sizes": list(c.sizes), "nbytes": c.nbytes})
        return out

    return _iter_ranks_json(RESTORE_PLAN_SCHEMA, rplan.world_size, rplan.total_bytes,
                            rplan.rank_bytes(), ranks, "reads", reads)
