"""Results files with known answers: the records `ckptbench run` writes (run, rank, op,
phase), shaped as asked, and the summary the report step computes from them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptbench.records import SCHEMA
from ckptbench.report import summarize

NS = 1_000_000_000


@dataclass(frozen=True)
class Shape:
    """How the synthetic run is laid out (records()'s keyword arguments beyond the spans)."""

    ranks_per_node: int = 8
    nodes: int = 1
    scale: int = 1
    workload: dict[str, Any] | None = None
    files_per_rank: int = 1
    chunks_per_rank: int = 200
    save_meta_s: float = 0.05
    restore_meta_s: float = 0.01
    cache: str = "fadvise+drop_caches"
    block_size: int = 8 << 20


def records(*, bytes_per_rank: int, save_s: Sequence[float], restore_s: Sequence[float] | None,
            **shape: Any) -> list[dict[str, Any]]:
    """A run of `nodes` x `ranks_per_node` ranks (`shape`: the fields of Shape); `save_s`
    and `restore_s` list each node's span, iteration after iteration (len = iterations x
    nodes). Rank 0 of each node is its slowest (the node's span); the others end up to 1 %
    sooner."""
    s = Shape(**shape)
    ranks_per_node, nodes, scale, workload = s.ranks_per_node, s.nodes, s.scale, s.workload
    files_per_rank, chunks_per_rank, cache = s.files_per_rank, s.chunks_per_rank, s.cache
    save_meta_s, restore_meta_s, block_size = s.save_meta_s, s.restore_meta_s, s.block_size
    ranks = nodes * ranks_per_node
    iterations = len(save_s) // nodes
    assert len(save_s) == iterations * nodes
    workload = workload or {"name": "synthetic"}
    out: list[dict[str, Any]] = [{
        "type": "run", "schema": SCHEMA, "run_id": "run-synthetic", "launcher": "local",
        "workload": workload, "scale": scale, "ranks": list(range(ranks)),
        "plan": {"total_bytes": bytes_per_rank * ranks, "files": files_per_rank * ranks,
                 "chunks": chunks_per_rank * ranks},
        "bytes_per_iteration": bytes_per_rank * ranks,
        "options": {"iterations": iterations, "block_size": block_size},
    }]
    clock = 10 * NS
    for it in range(iterations):
        phases = [("save", save_s)] + ([("restore", restore_s)] if restore_s is not None else [])
        for phase, spans in phases:
            start = clock + (int(restore_meta_s * NS) if phase == "restore" else 0)
            ends = []
            for node in range(nodes):
                span = int(spans[it * nodes + node] * NS)
                for j in range(ranks_per_node):
                    end = start + span - (span // 100) * j // max(ranks_per_node - 1, 1)
                    ends.append(end)
                    out.append({"type": "rank", "iteration": it, "phase": phase,
                                "rank": node * ranks_per_node + j, "process": node * ranks_per_node + j,
                                "host": f"node{node}", "bytes": bytes_per_rank,
                                "start_ns": start, "end_ns": end, "ops": 3})
            data_end = max(ends)
            if phase == "save":
                commit = [data_end + int(save_meta_s * NS / 2), data_end + int(save_meta_s * NS)]
                out.append({"type": "op", "iteration": it, "phase": "save", "rank": 0, "thread": -1,
                            "op": "commit", "file": ".metadata", "bytes": 0,
                            "start_ns": data_end, "end_ns": commit[1]})
                out.append({"type": "phase", "iteration": it, "phase": "save", "ok": True,
                            "checkpoint": f"step-{it}", "processes": ranks, "commit_ns": commit})
                clock = commit[1] + NS
            else:
                out.append({"type": "op", "iteration": it, "phase": "restore", "rank": -1,
                            "thread": -1, "op": "manifest", "file": ".metadata", "bytes": 0,
                            "start_ns": clock, "end_ns": start, "process": 0})
                out.append({"type": "phase", "iteration": it, "phase": "restore", "ok": True,
                            "cache": cache, "verified": True, "mismatched_chunks": 0,
                            "restore_shift": 0})
                clock = data_end + NS
    return out + summarize(out)


def write(path: Path, recs: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)
