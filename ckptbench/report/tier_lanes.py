"""The recovery tiers' lanes of a run's timeline: one lane per tier, above the ranks.

A tiered run (``--tiers``) writes each checkpoint to the memory and peer tiers and every
N-th one to storage, then restarts from them. On one clock with the storage calls, each
tier's lane shows when it held the job: its copies per checkpoint (every process's
blocking copy or replication, light) and the restarts it served (dark, named by
scenario: process, node, group). The storage lane shows the storage save and restore
phases (their calls are in the rank lanes below) and the shards storage served in a
group restart. A lane that is long where the others are short is the tier that costs
the job.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from matplotlib.artist import Artist
from matplotlib.patches import Patch

from ckptbench.report.data import PHASES, OpTable

TIERS = ("memory", "peer", "storage")
TIER_COLOR = {"memory": "tab:pink", "peer": "tab:cyan", "storage": "tab:blue"}
RESTART_COLOR = {"memory": "darkmagenta", "peer": "teal", "storage": "navy"}


def tier_lanes(tiers: Sequence[dict[str, Any]], ops: OpTable) -> list[str]:
    """The tiers with a lane, in TIERS order (none for a run without tier records)."""
    if not tiers:
        return []
    used = {r["tier"] for r in tiers}
    if len(ops):
        used.add("storage")
    return [t for t in TIERS if t in used]


def _bars(rows: list[tuple[float, float]], y: float) -> list[tuple[float, float, float, float]]:
    return [(s, e, y - 0.35, y + 0.35) for s, e in rows]


def _storage_phases(ops: OpTable) -> list[tuple[str, float, float]]:
    """(label, first start, last end) of each storage phase: S2, R2, ..."""
    out = []
    for it, ph in sorted(set(zip(ops.iteration.tolist(), ops.phase.tolist(), strict=True))):
        m = (ops.iteration == it) & (ops.phase == ph)
        out.append((f"{PHASES[ph][0].upper()}{it}", float(ops.start[m].min()),
                    float(ops.end[m].max())))
    return out


def draw_tier_lanes(ax: Any, tiers: Sequence[dict[str, Any]], ops: OpTable, first_y: float
                    ) -> tuple[list[tuple[float, str]], list[Artist]]:
    """Each tier's lane at first_y, first_y - 1, ...: its copies and the restarts it
    served; the (y, label) ticks and the legend's handles."""
    lanes = tier_lanes(tiers, ops)
    ticks: list[tuple[float, str]] = []
    span = max(float(ops.end.max()) if len(ops) else 0.0,
               *(ops.seconds(int(r["end_ns"])) for r in tiers), 1e-9)
    for k, tier in enumerate(lanes):
        y = first_y - k
        ticks.append((y, f"{tier} tier"))
        copies = [(ops.seconds(int(r["start_ns"])), ops.seconds(int(r["end_ns"])))
                  for r in tiers if r["type"] == "tier" and r["tier"] == tier]
        restarts: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in tiers:
            if r["type"] == "tier_restore" and r["tier"] == tier:
                restarts[r["scenario"]].append((ops.seconds(int(r["start_ns"])),
                                                ops.seconds(int(r["end_ns"]))))
        labelled = [(name, min(s for s, _ in rows), max(e for _, e in rows))
                    for name, rows in restarts.items()]
        if tier == "storage":
            phases = _storage_phases(ops)
            copies += [(s, e) for _, s, e in phases]
            labelled += phases
        for s, e, y0, y1 in _bars(copies, y):
            ax.fill_between([s, e], y0, y1, color=TIER_COLOR[tier], alpha=0.5, lw=0.6)
        for s, e, y0, y1 in _bars([x for rows in restarts.values() for x in rows], y):
            ax.fill_between([s, e], y0, y1, color=RESTART_COLOR[tier], lw=0.6)
        for name, s, e in labelled:
            if e - s >= 0.006 * len(name) * span:  # wide enough for its characters
                ax.text((s + e) / 2, y, name, ha="center", va="center", fontsize=7,
                        color="white", clip_on=True)
    handles: list[Artist] = [Patch(color=TIER_COLOR[t], alpha=0.5, label=(
        "storage: save, restore" if t == "storage" else f"{t}: copies")) for t in lanes]
    handles += [Patch(color=RESTART_COLOR[t], label=f"{t}: restarts served") for t in lanes]
    return ticks, handles


def tier_span(tiers: Sequence[dict[str, Any]], ops: OpTable) -> float:
    """The last tier record's end on the timeline's axis (0 without tiers)."""
    return max((ops.seconds(int(r["end_ns"])) for r in tiers), default=0.0)
