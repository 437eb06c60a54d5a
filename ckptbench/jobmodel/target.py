"""The job the answer is for: its nodes, ranks per node and the bytes each node writes.

From a workload the planner gives every rank's bytes, so nodes that hold more (the
pipeline stages with the embeddings or the output layer) are known; consecutive ranks
share a node, as torchrun and Slurm place them. Node byte counts are grouped to 0.1 %
(rounded up), which keeps the straggler integral small for 16k-rank plans.

The restore is the job restarting on its restore layout: with a restore plan, its nodes
are that layout's, each reading what DCP's load planner gives its ranks (replicas and
resharding read some saved bytes more than once), not what it wrote.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ckptbench.errors import SpecError
from ckptbench.plan.metadata import dcp_metadata_bytes

if TYPE_CHECKING:
    from ckptbench.plan import Plan
    from ckptbench.plan.restore import RestorePlan

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
    # The job restarting: its restore plan's nodes and bytes (None: as saved)
    restore: Target | None = None
    restore_layout: str | None = None  # the layout it restarts on, when a plan gave it
    chunks: int | None = None  # the plan's saved chunks (DCP's .metadata entries), when known
    metadata_bytes: int | None = None  # DCP's .metadata of the plan (every restoring rank reads it)

    @property
    def for_restore(self) -> Target:
        """The job as its restore reads: the restore plan's, or the save's bytes."""
        return self.restore or self

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
              ceiling: float | None = None, workload_path: str | None = None,
              restore_plan: RestorePlan | None = None) -> Target:
    """The job a plan describes, its ranks placed on nodes in order, and (`restore_plan`)
    the job restarting on the restore plan's layout. With `gpus` other than the plan's
    world size the plan's bytes are spread evenly over `gpus` ranks (no restore plan)."""
    name = plan.workload.name
    file_bytes = plan.total_bytes / plan.n_files if plan.n_files else None
    if gpus is not None and gpus != plan.world_size:
        t = uniform(name, plan.total_bytes, gpus, ranks_per_node, ceiling, file_bytes)
        return Target(**{**t.__dict__, "workload_path": workload_path,
                         "placement": f"uniform: --gpus {gpus} is not the plan's world size"
                                      f" {plan.world_size}", "chunks": plan.n_chunks,
                         "metadata_bytes": dcp_metadata_bytes(plan) or None})
    ranks_per_node = _check(plan.world_size, ranks_per_node)
    restore = None if restore_plan is None else Target(
        name, restore_plan.world_size, min(ranks_per_node, restore_plan.world_size),
        float(restore_plan.total_bytes), _node_groups(restore_plan.rank_bytes(), ranks_per_node),
        file_bytes, ceiling, workload_path,
        placement=f"the restore plan onto {restore_plan.layout.label} (reads"
                  f" {restore_plan.amplification:.3f}x the checkpoint): consecutive ranks on a node",
        restore_layout=restore_plan.layout.label)
    return Target(name, plan.world_size, ranks_per_node, float(plan.total_bytes),
                  _node_groups(plan.rank_bytes(), ranks_per_node), file_bytes, ceiling,
                  workload_path, placement="from the plan: consecutive ranks on a node",
                  restore=restore, restore_layout=None if restore is None else restore.restore_layout,
                  chunks=plan.n_chunks, metadata_bytes=dcp_metadata_bytes(plan) or None)


def _node_groups(rank_bytes: np.ndarray, ranks_per_node: int) -> tuple[tuple[float, int], ...]:
    """Bytes of each node (consecutive ranks), grouped."""
    rank_bytes = rank_bytes.astype(float)
    ranks_per_node = min(ranks_per_node, len(rank_bytes))
    pad = (-len(rank_bytes)) % ranks_per_node
    node_bytes = np.concatenate([rank_bytes, np.zeros(pad)]).reshape(-1, ranks_per_node).sum(axis=1)
    return _groups(node_bytes)
