"""Figures of the cadence answer and of a sweep: plain numbers in, a matplotlib figure out
(the caller writes it), as ``levels_figures`` does for the multi-level cadence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Mark = tuple[str, float, float, str]  # (label, interval s, goodput, matplotlib style)


def goodput_figure(curve: Sequence[tuple[float, float]], marks: Sequence[Mark],
                   floor_s: float, title: str) -> Any:
    """Goodput against interval on a log axis (minutes), the optimum and the user's
    interval marked, the intervals below the floor shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([t / 60 for t, _ in curve], [100 * e for _, e in curve], color="tab:blue")
    if floor_s > 0:
        ax.axvspan(curve[0][0] / 60, floor_s / 60, color="0.85", label="below floor")
    for label, interval_s, goodput, style in marks:
        ax.plot(interval_s / 60, 100 * goodput, style, markersize=11, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes)")
    ax.set_ylabel("goodput (%)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower center")
    return fig


def per_node_figure(ranks_per_node: Sequence[int], save_gbps: Sequence[float],
                    restore_gbps: Sequence[float] | None, title: str) -> Any:
    """Per-node GB/s against ranks per node (log 2), with linear scaling from the first
    point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = list(ranks_per_node)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(ks, save_gbps, "o-", label="save")
    if restore_gbps is not None:
        ax.plot(ks, restore_gbps, "s-", label="restore")
    ax.plot(ks, [save_gbps[0] * k / ks[0] for k in ks], "k:",
            label="save, linear from the first point")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("ranks per node")
    ax.set_ylabel("GB/s per node, data only")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig
