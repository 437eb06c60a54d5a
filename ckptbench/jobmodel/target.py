"""The job the answer is for: its nodes, ranks per node and the bytes each node writes.

From a workload the planner gives every rank's bytes, so nodes that hold more (the
pipeline stages with the embeddings or the output layer) are known; consecutive ranks
share a node, as torchrun and Slurm place them. Node byte counts are grouped to 0.1 %
(rounded up), which keeps the straggler integral small for 16k-rank plans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ckptbench.errors import SpecError

if TYPE_CHECKING:
    from ckptbench.plan import Plan

_BIN = math.log1p(1e-3)


@dataclass(frozen=True)
class Target:
    """The whole job: where its bytes are and what caps their rate."""

    name: str
    gpus: int
    ranks_per_node: int
    total_bytes: float
    node_groups: tuple[tuple[float, int], ...]  # (bytes one node writes, how many such nodes)
    file_bytes: float | None  # mean bytes per file (None: not known without a plan)
    ceiling: float | None  # aggregate storage bandwidth, bytes/s
    workload_path: str | None = None
    placement: str = "uniform"  # how bytes were spread over nodes

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.ranks_per_node)

    @property
    def bytes_per_rank(self) -> float:
        return self.total_bytes / self.gpus

    @property
    def heaviest_node_bytes(self) -> float:
        return max(b for b, _ in self.node_groups)

    @property
    def mean_node_bytes(self) -> float:
        return self.total_bytes / self.nodes


def _check(gpus: int, ranks_per_node: int) -> int:
    """Validated ranks per node: no more than the job has (a 4-GPU job is one node of 4)."""
    if gpus < 1:
        raise SpecError(f"--gpus = {gpus} must be an integer >= 1")
    if ranks_per_node < 1:
        raise SpecError(f"--gpus-per-node = {ranks_per_node} must be an integer >= 1")
    return min(ranks_per_node, gpus)


def _groups(node_bytes: np.ndarray) -> tuple[tuple[float, int], ...]:
    """Node byte counts binned to 0.1 % (each bin at its largest member's bytes)."""
    node_bytes = node_bytes[node_bytes > 0]
    if node_bytes.size == 0:
        return ()
    bins = np.ceil(np.log(node_bytes) / _BIN).astype(np.int64)
    out = []
    for b in np.unique(bins):
        members = node_bytes[bins == b]
        out.append((float(members.max()), int(members.size)))
    return tuple(out)


def uniform(name: str, total_bytes: float, gpus: int, ranks_per_node: int,
            ceiling: float | None = None, file_bytes: float | None = None) -> Target:
    """Every rank writes total / gpus bytes (a size given without a plan)."""
    ranks_per_node = _check(gpus, ranks_per_node)
    if not total_bytes > 0:
        raise SpecError(f"checkpoint size = {total_bytes} must be > 0")
    nodes = math.ceil(gpus / ranks_per_node)
    per_rank = total_bytes / gpus
    groups = [(per_rank * ranks_per_node, gpus // ranks_per_node)]
    if gpus % ranks_per_node:
        groups.append((per_rank * (gpus % ranks_per_node), 1))
    assert sum(c for _, c in groups) == nodes
    return Target(name, gpus, ranks_per_node, float(total_bytes), tuple(groups), file_bytes,
                  ceiling)


def from_plan(plan: Plan, ranks_per_node: int, gpus: int | None = None,
              ceiling: float | None = None, workload_path: str | None = None) -> Target:
    """The job a plan describes, its ranks placed on nodes in order. With `gpus` other than
    the plan's world size the plan's bytes are spread evenly over `gpus` ranks."""
    name = plan.workload.name
    file_bytes = plan.total_bytes / plan.n_files if plan.n_files else None
    if gpus is not None and gpus != plan.world_size:
        t = uniform(name, plan.total_bytes, gpus, ranks_per_node, ceiling, file_bytes)
        return Target(**{**t.__dict__, "workload_path": workload_path,
                         "placement": f"uniform: --gpus {gpus} is not the plan's world size"
                                      f" {plan.world_size}"})
    ranks_per_node = _check(plan.world_size, ranks_per_node)
    rank_bytes = plan.rank_bytes().astype(float)
    pad = (-len(rank_bytes)) % ranks_per_node
    node_bytes = np.concatenate([rank_bytes, np.zeros(pad)]).reshape(-1, ranks_per_node).sum(axis=1)
    return Target(name, plan.world_size, ranks_per_node, float(plan.total_bytes),
                  _groups(node_bytes), file_bytes, ceiling, workload_path,
                  placement="from the plan: consecutive ranks on a node")
