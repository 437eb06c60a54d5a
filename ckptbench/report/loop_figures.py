"""The asynchronous loop of a ``--mode async`` run in one picture: each process's steps on
one clock with the time the loop waited for each checkpoint (blocking: due to resumed)
and the persist that ran behind the steps (resumed to durable); under it, how long each
step took against the baseline loop's mean step, so interference shows as steps that
grow while a persist is in flight.
"""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ckptbench.report.asynchronous import LoopLane, loop_lanes
from ckptbench.report.data import RunData

BLOCKING, PERSIST, STEP = "tab:red", "tab:orange", "tab:blue"


def _lanes(ax: Axes, lanes: list[LoopLane]) -> None:
    """Steps as thin bars, blocking and persist windows as wide ones, one lane a process."""
    for y, lane in enumerate(lanes):
        ax.broken_barh(list(zip(lane.step_start, lane.step_s, strict=True)), (y - 0.15, 0.3),
                       facecolors=STEP, edgecolors="white", linewidth=0.3)
        ax.broken_barh([(d, r - d) for d, r in zip(lane.due, lane.resumed, strict=True)],
                       (y - 0.4, 0.8), facecolors=BLOCKING)
        persists = [(r, e - r) for r, e in zip(lane.resumed, lane.durable, strict=True)
                    if e is not None]
        ax.broken_barh(persists, (y + 0.2, 0.2), facecolors=PERSIST, alpha=0.8)
        for d, ok in zip(lane.due, lane.ok, strict=True):
            if not ok:
                ax.text(d, y - 0.45, "failed", color=BLOCKING, fontsize=7)


def has_loop(run: RunData) -> bool:
    """Whether `run` is a --mode async run with a loop to draw (its ``loop`` figure)."""
    return any(r.get("type") == "steps" and r.get("loop") == "async" for r in run.loop)


def loop_figure(run: RunData) -> Figure | None:
    """The loop's figure, or None for a run that is not asynchronous."""
    lanes, baseline = loop_lanes(run.loop)
    if not lanes:
        return None
    fig = Figure(figsize=(11.0, 2.6 + 0.35 * len(lanes)))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[max(1, len(lanes)), 2])
    _lanes(top, lanes)
    top.set_yticks(range(len(lanes)), [f"process {lane.process}" for lane in lanes])
    top.set_ylim(len(lanes) - 0.5, -0.6)
    top.legend(handles=[Patch(color=STEP, label="training step"),
                        Patch(color=BLOCKING, label="blocking (loop waits)"),
                        Patch(color=PERSIST, label="persist (behind the steps)")],
               loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    for lane in lanes:
        starts, secs = np.array(lane.step_start), np.array(lane.step_s)
        bottom.plot(starts + secs / 2, secs * 1e3, ".", ms=3, color=STEP)
        for r, e in zip(lane.resumed, lane.durable, strict=True):
            if e is not None:
                bottom.axvspan(r, e, color=PERSIST, alpha=0.12, lw=0)
    if baseline is not None:
        bottom.axhline(baseline * 1e3, color="black", ls="--", lw=1,
                       label=f"baseline step {baseline * 1e3:.3g} ms")
        bottom.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    bottom.set_ylim(bottom=0)
    bottom.set_ylabel("step ms")
    bottom.set_xlabel("seconds since the loop's first step")
    top.set_title(f"{run.label}: the training loop's steps, blocking and persist", loc="left")
    return fig
