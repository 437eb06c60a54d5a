"""Figures of the multi-level cadence: efficiency against each level's interval with the
optimum marked, and the spread of simulated goodput. Plain numbers in, a matplotlib
figure out (the caller writes it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def interval_curves(curves: Mapping[str, Sequence[tuple[float, float]]],
                    optimum: Mapping[str, tuple[float, float]],
                    alone: tuple[str, float, float] | None, title: str) -> Any:
    """One line per level (x: that level's interval in minutes, log), its optimum starred;
    `alone`: the last level on its own (name, interval, efficiency), a hollow marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for i, (name, curve) in enumerate(curves.items()):
        color = f"C{i % 10}"
        xs = [x / 60 for x, _ in curve]
        ax.plot(xs, [100 * e for _, e in curve], "-" if len(curve) > 30 else ".-", color=color,
                label=f"{name} interval" if curve is not next(iter(curves.values())) else
                f"t (every checkpoint; {name} level)")
        x, e = optimum[name]
        ax.plot(x / 60, 100 * e, "*", color=color, markersize=13)
    if alone is not None:
        name, x, e = alone
        ax.plot(x / 60, 100 * e, "o", mfc="none", color="black", markersize=10,
                label=f"{name} alone: {100 * e:.1f} %")
    ax.set_xscale("log")
    ax.set_xlabel("interval between checkpoints of the level (minutes)")
    ax.set_ylabel("efficiency (%)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower center", fontsize="small")
    return fig


def goodput_histogram(goodput: Sequence[float], analytic: float | None, title: str) -> Any:
    """Histogram of the replicas' goodput; the mean and the closed form marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    values = [100 * g for g in goodput]
    ax.hist(values, bins=min(50, max(5, len(values) // 20)), color="tab:blue", alpha=0.8)
    mean = sum(values) / len(values)
    ax.axvline(mean, color="black", label=f"simulated mean {mean:.2f} %")
    if analytic is not None:
        ax.axvline(100 * analytic, color="tab:red", linestyle="--",
                   label=f"model {100 * analytic:.2f} %")
    ax.set_xlabel("goodput of one run (%)")
    ax.set_ylabel("runs")
    ax.set_title(title)
    ax.legend(fontsize="small")
    return fig
