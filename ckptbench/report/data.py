"""A results file read once for everything the report shows: its summary view (tables),
every op as numpy columns (timelines, throughput over time, latency distributions) and
the rank records (per-rank throughput), with the label that tells it from compared runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptbench.records import read_records
from ckptbench.report import compare
from ckptbench.report.summary import checked_view

PHASES = ("save", "restore")
LOOP_RECORDS = ("steps", "checkpoint")
TIER_RECORDS = ("tier", "tier_restore")  # --tiers: each copy and each restart, per process


@dataclass(frozen=True)
class OpTable:
    """Every ``op`` record of a run as columns; times in seconds from the run's first op
    (one clock: records are on process 0's clock). ``thread`` is -1 for the coordinator's
    ops (manifest commit and read); ``phase`` indexes :data:`PHASES`; ``op`` indexes
    ``names``."""

    iteration: np.ndarray
    phase: np.ndarray
    rank: np.ndarray
    thread: np.ndarray
    op: np.ndarray
    bytes: np.ndarray
    start: np.ndarray
    end: np.ndarray
    names: tuple[str, ...]
    t0_ns: int

    def __len__(self) -> int:
        return len(self.start)

    def select(self, mask: np.ndarray) -> OpTable:
        """The ops where `mask` holds (same names and time origin)."""
        return OpTable(self.iteration[mask], self.phase[mask], self.rank[mask],
                       self.thread[mask], self.op[mask], self.bytes[mask], self.start[mask],
                       self.end[mask], self.names, self.t0_ns)

    def seconds(self, ns: int) -> float:
        """A record's clock reading (ns) on this table's time axis."""
        return (ns - self.t0_ns) / 1e9


def op_table(records: Sequence[dict[str, Any]]) -> OpTable:
    """The op records as an :class:`OpTable`."""
    ops = [r for r in records if r.get("type") == "op" and r.get("phase") in PHASES]
    names = tuple(sorted({r["op"] for r in ops}))
    code = {n: i for i, n in enumerate(names)}
    start_ns = np.array([r["start_ns"] for r in ops], dtype=np.int64)
    end_ns = np.array([r["end_ns"] for r in ops], dtype=np.int64)
    # the tiers' copies start before the first storage op: one origin for both
    tiers = [int(r["start_ns"]) for r in records if r.get("type") in TIER_RECORDS]
    t0 = min([*([int(start_ns.min())] if ops else []), *tiers] or [0])
    return OpTable(
        iteration=np.array([r["iteration"] for r in ops], dtype=np.int32),
        phase=np.array([PHASES.index(r["phase"]) for r in ops], dtype=np.int8),
        rank=np.array([r["rank"] for r in ops], dtype=np.int32),
        thread=np.array([r.get("thread", 0) for r in ops], dtype=np.int32),
        op=np.array([code[r["op"]] for r in ops], dtype=np.int16),
        bytes=np.array([r.get("bytes", 0) for r in ops], dtype=np.int64),
        start=(start_ns - t0) / 1e9, end=(end_ns - t0) / 1e9, names=names, t0_ns=t0)


@dataclass(frozen=True)
class RunData:
    """One results file, read once: `view` as :func:`ckptbench.report.view` gives it."""

    path: str
    label: str
    view: dict[str, Any]
    ops: OpTable
    ranks: tuple[dict[str, Any], ...]  # the ``rank`` records
    loop: tuple[dict[str, Any], ...] = ()  # --mode async: ``steps`` and ``checkpoint`` records
    tiers: tuple[dict[str, Any], ...] = ()  # --tiers: ``tier`` and ``tier_restore`` records

    @property
    def name(self) -> str:
        return str(self.view["run"].get("workload", {}).get("name", "?"))


def load_runs(paths: Sequence[str]) -> list[RunData]:
    """Read each results file once; label each by the options that differ between them."""
    loaded = []
    for p in paths:
        records = list(read_records(p))
        loaded.append((p, records, checked_view(records, p)))
    labels = compare.labels([v["run"] for _, _, v in loaded])
    return [RunData(p, label, v, op_table(records),
                    tuple(r for r in records if r.get("type") == "rank"),
                    tuple(r for r in records if r.get("type") in LOOP_RECORDS),
                    tuple(r for r in records if r.get("type") in TIER_RECORDS))
            for (p, records, v), label in zip(loaded, labels, strict=True)]
