"""What an infrastructure engineer plans with, from a multi-level answer: per level its
interval (compute, wall clock, training steps), the host memory and network it needs per
node, and per failure class how often it strikes and what it costs, by cause.

Pure arithmetic over the job (``levels_job``) and a schedule; the losses come from the
exact model of the stated rules (``scoped.breakdown``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckptbench.cadence import multilevel as ml
from ckptbench.cadence import scoped
from ckptbench.cadence.levels_job import LevelsJob

HELD_COPIES = 2  # a node keeps its newest copy until the next one is whole (the tier run)


@dataclass(frozen=True)
class LevelPlan:
    """One level at a schedule: how often, and what it needs of each node."""

    name: str
    scope: str
    compute_s: float  # compute between two of its checkpoints
    wall_s: float  # wall clock between them, failure-free (compute and every save)
    steps: float | None  # training steps between them (--step-seconds)
    host_memory_bytes: float | None  # per node, the copies it holds (None: bytes unknown)
    network_Bps: float | None  # per node, mean bytes/s its saves send (None: unknown or 0)
    memory_note: str
    network_note: str

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.name, "scope": self.scope, "interval_compute_s": self.compute_s,
                "interval_wall_s": self.wall_s, "interval_steps": self.steps,
                "host_memory_bytes_per_node": self.host_memory_bytes,
                "host_memory": self.memory_note,
                "network_bytes_per_s_per_node": self.network_Bps, "network": self.network_note}


def intervals(levels: Sequence[ml.Level], schedule: ml.Schedule) -> list[tuple[float, float]]:
    """Per level: (compute, wall) seconds between two of its checkpoints, failure-free."""
    segments = [1]
    for v in schedule.counts:
        segments.append(segments[-1] * (v + 1))
    out = []
    for k in range(len(levels)):
        n = segments[k]
        wall = n * schedule.compute_s
        for j, level in enumerate(levels):
            # saves of level j among n segments ending at a level-k checkpoint: the
            # segments ending with exactly level j (the highest due)
            if j < k:
                wall += (n // segments[j] - n // segments[j + 1]) * level.charged_save_s
        wall += levels[k].charged_save_s
        out.append((n * schedule.compute_s, wall))
    return out


def plan_levels(job: LevelsJob, schedule: ml.Schedule, node_bytes: float | None,
                peer_replicas: int, step_s: float | None) -> list[LevelPlan]:
    """Each level's interval and needs per node (`node_bytes`: one node's state, one copy)."""
    out = []
    for level, scope, (compute, wall) in zip(job.levels, job.scopes,
                                             intervals(job.levels, schedule), strict=True):
        memory: float | None = None
        network: float | None = None
        if scope == "process":
            memory_note = f"{HELD_COPIES} copies of the node's state (the newest and the next)"
            network_note = "none (the node's own memory)"
            if node_bytes is not None:
                memory, network = HELD_COPIES * node_bytes, 0.0
        elif scope in ("node", "group"):
            memory_note = (f"{HELD_COPIES} x {peer_replicas} replica(s) of other nodes' state"
                           " (--peer-replicas), beside the node's own copy")
            network_note = f"{peer_replicas} replica(s) of the node's state per interval"
            if node_bytes is not None:
                memory = HELD_COPIES * peer_replicas * node_bytes
                network = peer_replicas * node_bytes / wall
        else:
            memory_note = ("the snapshot while its persist drains" if level.persist_s
                           else "none (storage)")
            network_note = "the node's state to storage per interval"
            if node_bytes is not None:
                memory = node_bytes if level.persist_s else 0.0
                network = node_bytes / wall
        out.append(LevelPlan(level.name, scope, compute, wall,
                             compute / step_s if step_s else None, memory, network,
                             memory_note, network_note))
    return out


@dataclass(frozen=True)
class ClassLoss:
    """One failure class: how often it strikes, the level it reads, what it costs."""

    name: str
    scope: str
    per_day: float
    reads: str
    restart: str
    lost: dict[str, float]  # shares of wall time: rework, restart, restore

    @property
    def total(self) -> float:
        return sum(self.lost.values())

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.name, "scope": self.scope, "failures_per_day": self.per_day,
                "reads": self.reads, "restart": self.restart, "lost": self.lost,
                "lost_total": self.total}


def class_losses(job: LevelsJob, schedule: ml.Schedule
                 ) -> tuple[scoped.Breakdown, list[ClassLoss]]:
    """The loss by cause, and per class, at `schedule` under the stated rules."""
    found = scoped.breakdown(job.levels, job.kinds, schedule)
    rows = [ClassLoss(c.name, c.scope, k.rate_per_s * 86400.0, job.levels[n].name,
                      job.chosen[c.scope], lost)
            for c, k, n, lost in zip(job.classes, job.kinds, job.needs, found.by_kind,
                                     strict=True)]
    return found, rows
