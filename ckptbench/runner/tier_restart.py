"""One process's part of a restart scenario (runner.tiers): what serves it, where its
bytes go, and the clock readings of its rounds, made into its ``tier_restore`` record.

A restart's reads are interleaved with their baselines (A B B A B A A B,
restart_rounds below) so that a machine whose load drifts slows both alike; the record keeps
every round (``rounds_s``, ``baseline_rounds_s``) and their medians (``seconds``,
``baseline_s``), and the first read's clock readings (``start_ns``, ``end_ns``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckptbench.payload import digest
from ckptbench.plan.tiers import TierPlan
from ckptbench.runner.tier_storage import StoragePart

# A restart's reads interleaved with their baselines (A B B A B A A B: each kind's rounds
# at positions of the same sum): a machine whose load drifts slows both alike; the records
# keep every round and their medians. The last round is a read: its bytes are verified.
# The group restart runs one of each: its storage read is cold (evicted first), as after
# a save.
RESTART_ORDER = ("baseline", "read", "read", "baseline", "read", "baseline", "baseline", "read")
GROUP_ORDER = ("baseline", "read")
# In a node restart the replaced node's processes fetch in this order, beside the others'
# RESTART_ORDER: each fetch and each plain transfer runs beside as many of their memory
# reads as of their plain copies, and the reverse. In one order a fetch ran beside the
# others' memory reads (2-5x a memcpy's time, on the CPUs the emulated nodes share) and its
# reference beside their memcpys only (benchmarks/results/2026-12-03-tier-speed.md, 5).
FETCH_ORDER = ("read", "baseline", "baseline", "read", "read", "baseline", "baseline", "read")


def restart_rounds(scenario: str) -> list[tuple[str, str]]:
    """Per round of a restart scenario: (what a process served by its own node's memory or
    by storage does, what a process fetching from a peer does)."""
    if scenario == "group":
        return list(zip(GROUP_ORDER, GROUP_ORDER, strict=True))
    fetches = FETCH_ORDER if scenario == "node" else RESTART_ORDER
    return list(zip(RESTART_ORDER, fetches, strict=True))



def first_mismatch(data: np.ndarray, files: list[tuple[str, int]], want: list[int]
                   ) -> str | None:
    """The first file (name, bytes: the shard's files in order) whose bytes in `data` do not
    have the save's digest; None when all match."""
    at = 0
    for (name, size), d in zip(files, want, strict=True):
        if digest(data[at:at + size]) != d:
            return name
        at += size
    return None if at == data.nbytes else f"(the shard's {data.nbytes} bytes, {at} expected)"


def _no_rounds() -> dict[str, list[tuple[int, int]]]:
    return {"read": [], "baseline": []}


@dataclass
class Restart:
    """One process's restart: `source` (tier, holder process) serves it, None where
    storage does (the group scenario); `data` is the memory it reads into, allocated
    before the clock; `state` the state it had (the plain copy's source)."""

    scenario: str
    it: int
    lost: set[int]
    source: tuple[str, int] | None
    data: np.ndarray
    state: np.ndarray | None
    rounds: dict[str, list[tuple[int, int]]] = field(default_factory=_no_rounds)
    part: StoragePart | None = None  # the group scenario: this process's storage read

    def record(self, node_of: Sequence[int], offset: int, verify_s: float, verified: bool
               ) -> dict[str, Any]:
        """The restore record's fields. A shard storage served was checked chunk by
        chunk against the manifest's digest as the format read it (`verified`: the run's
        --verify); its seconds include that."""
        reads = [(b - a) / 1e9 for a, b in self.rounds["read"]]
        bases = [(b - a) / 1e9 for a, b in self.rounds["baseline"]]
        first = self.rounds["read"][0]
        times = {"start_ns": first[0] + offset, "end_ns": first[1] + offset,
                 "seconds": statistics.median(reads), "rounds_s": reads}
        if self.source is None:
            assert self.part is not None
            return {"tier": "storage", "from_node": None, "from_process": None,
                    "bytes": self.part.bytes, **times, "verify_s": 0.0, "verified": verified,
                    "baseline_s": 0.0, "baseline_rounds_s": [], "baseline": None,
                    "reads": self.part.reads}
        tier, holder = self.source
        return {"tier": tier, "from_node": node_of[holder], "from_process": holder,
                "bytes": len(self.data), **times, "verify_s": verify_s, "verified": True,
                "baseline_s": statistics.median(bases) if bases else 0.0,
                "baseline_rounds_s": bases,
                "baseline": "plain copy" if tier == "memory" else "plain transfer"}


def held_record(tp: TierPlan, run_id: str, it: int, files: list[list[tuple[str, int]]],
                digests: list[list[int]], dirs: dict[str, Any]) -> dict[str, Any]:
    """``tier_held``: checkpoint `it` is held by every tier (every copy complete, every
    replica acknowledged), written by process 0 once all are, so a checkpoint cut off in
    flight has none; where its copies are (runner.tier_store's layout: `dirs`, the run's
    directory under --memory-dir by name and every host's identities, RunDir.record) and
    the save's digests a relaunch checks them against (runner.tier_relaunch)."""
    n = len(tp.node_of)
    return {"type": "tier_held", "iteration": it, "run_id": run_id,
            "memory_dir": tp.spec.memory_dir, **dirs, "memory": tp.spec.has("memory"),
            "node_of": list(tp.node_of),
            "holders": [tp.holders(p) if tp.spec.has("peer") else [] for p in range(n)],
            "files": [[[name, size] for name, size in f] for f in files],
            "digests": digests}
