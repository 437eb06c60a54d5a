"""Pictures of a run (matplotlib, no pyplot: no global state, no display needed).

* timeline: every op of every rank and thread on one time axis, so a rank that stalls or
  finishes late shows as a long bar, a gap or a late end mark;
* throughput over time: the bytes of the data ops spread over each call's duration and
  binned (what fio's and warp's bandwidth logs show), with each iteration's aggregate;
* per-rank throughput: each rank's bytes over its own span, the slowest marked;
* op latency: the distribution (ECDF) of each call kind's duration;
* iteration spread: each iteration's aggregate throughput, and the median;
* comparison (several runs): median throughput and seconds per run, labelled by the
  options that differ.
"""

from __future__ import annotations

import io
import os
import statistics
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.artist import Artist
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from ckptbench.errors import CkptbenchError
from ckptbench.report.data import PHASES, OpTable, RunData
from ckptbench.report.loop_figures import has_loop, loop_figure
from ckptbench.report.tier_lanes import draw_tier_lanes, tier_lanes, tier_span

DPI = 100
WIDTH_IN = 11.0
PHASE_COLOR = {"save": "tab:blue", "restore": "tab:green"}
OP_COLOR = {"open": "tab:orange", "write": "tab:blue", "read": "tab:green", "fsync": "tab:red",
            "close": "tab:purple", "commit": "black", "manifest": "dimgray",
            "write_shard": "tab:blue", "read_shard": "tab:green", "encode": "tab:olive",
            "write_meta": "tab:cyan", "dcp_save": "tab:blue", "dcp_load": "tab:green",
            "coordinator": "tab:brown", "gather": "lightgray"}
LABELLED = ("gather", "coordinator", "commit", "manifest")  # named in the coordinator's lane
BINS = 400


@dataclass(frozen=True)
class Picture:
    """One figure rendered: a file-name stem, a title and what to look for in it."""

    name: str
    title: str
    caption: str
    png: bytes


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def _spans(ops: OpTable) -> list[tuple[int, str, float, float]]:
    """(iteration, phase, first start, last end) of each iteration's phase, in time order."""
    out = []
    for it, ph in sorted(set(zip(ops.iteration.tolist(), ops.phase.tolist(), strict=True))):
        m = (ops.iteration == it) & (ops.phase == ph)
        out.append((it, PHASES[ph], float(ops.start[m].min()), float(ops.end[m].max())))
    return sorted(out, key=lambda s: s[2])


def _shade(ax: Any, ops: OpTable) -> None:
    """Each iteration's phase as a light band, labelled S1, R1, ... above the axes."""
    spans = _spans(ops)
    top = blended_transform_factory(ax.transData, ax.transAxes)
    for it, phase, s, e in spans:
        ax.axvspan(s, e, color=PHASE_COLOR[phase], alpha=0.07, lw=0)
        if len(spans) <= 40:
            ax.text(s, 1.005, f"{phase[0].upper()}{it}", transform=top, fontsize=7,
                    va="bottom", color=PHASE_COLOR[phase])


def timeline(run: RunData) -> Figure:
    """Every op per rank (threads as sub-lanes) with each rank's end marked; a tiered
    run's tiers each in a lane above (report.tier_lanes)."""
    ops = run.ops
    lanes = len(tier_lanes(run.tiers, ops))
    worker = ops.thread >= 0
    ranks = sorted(set(ops.rank[worker].tolist()) | {r["rank"] for r in run.ranks})
    lookup = np.zeros(max([*ranks, 0]) + 2, dtype=np.float64)
    lookup[ranks] = np.arange(len(ranks))
    threads = int(ops.thread.max()) + 1 if len(ops) and ops.thread.max() >= 0 else 1
    h = 0.8 / threads
    y0 = np.where(worker, lookup[ops.rank.clip(0)] - 0.4 + ops.thread.clip(0) * h, -1.4)
    y1 = np.where(worker, y0 + h * 0.9, -0.6)
    fig = Figure(figsize=(WIDTH_IN, min(14.0, 2.2 + 0.3 * (len(ranks) + 1 + lanes))))
    ax = fig.add_subplot()
    _shade(ax, ops)
    handles: list[Artist] = []
    for code, name in enumerate(ops.names):
        m = ops.op == code
        verts = np.stack([np.column_stack([ops.start[m], y0[m]]), np.column_stack([ops.start[m], y1[m]]),
                          np.column_stack([ops.end[m], y1[m]]), np.column_stack([ops.end[m], y0[m]])],
                         axis=1)
        color = OP_COLOR.get(name, "tab:gray")
        ax.add_collection(PolyCollection(list(verts), facecolors=color, edgecolors=color, linewidths=0.6))
        handles.append(Patch(color=color, label=name))
    _label_coordinator(ax, ops)
    ticks, tier_handles = draw_tier_lanes(ax, run.tiers, ops, -2.0)
    handles += tier_handles
    ends: dict[tuple[int, str], list[tuple[float, int]]] = {}
    for rec in run.ranks:
        ends.setdefault((rec["iteration"], rec["phase"]), []).append(
            (ops.seconds(rec["end_ns"]), rec["rank"]))
    for group in ends.values():
        xs, rs = zip(*group, strict=True)
        ax.scatter(xs, lookup[list(rs)], marker="|", s=160, color="black", zorder=3, lw=1.2)
        last_x, last_rank = max(group)
        ax.scatter([last_x], [lookup[last_rank]], marker="|", s=260, color="red", zorder=4, lw=2.5)
    handles += [ax.scatter([], [], marker="|", color="black", label="rank done"),
                ax.scatter([], [], marker="|", color="red", lw=2.5, label="last rank done")]
    ax.set_xlim(0, max(float(ops.end.max()) if len(ops) else 1.0, tier_span(run.tiers, ops),
                       1e-3) * 1.01)
    ax.set_ylim(len(ranks) - 0.5, -1.6 - lanes)
    step = max(1, len(ranks) // 32)
    ax.set_yticks([*(y for y, _ in ticks), -1.0, *list(range(0, len(ranks), step))],
                  [*(name for _, name in ticks), "coordinator"]
                  + [f"rank {ranks[i]}" for i in range(0, len(ranks), step)])
    ax.set_xlabel("seconds since the run's first op")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title(f"{run.label}: every call per rank and thread", loc="left", pad=14)
    return fig


def _label_coordinator(ax: Any, ops: OpTable) -> None:
    """Name the coordinator's parts wide enough to hold a label (its gather, the manifest's
    build and encoding, the commit, the manifest read) on its lane, with their seconds."""
    span = max(float(ops.end.max()) if len(ops) else 0.0, 1e-9)
    for code, name in enumerate(ops.names):
        if name not in LABELLED:
            continue
        m = (ops.op == code) & (ops.thread < 0)
        for s, e in zip(ops.start[m].tolist(), ops.end[m].tolist(), strict=True):
            label = f"{name} {e - s:.2f} s"
            if e - s >= 0.0075 * len(label) * span:  # wide enough for the label's characters
                ax.text((s + e) / 2, -1.0, label, ha="center", va="center", fontsize=7,
                        color="white" if name != "gather" else "black", clip_on=True)


def bytes_per_bin(start: np.ndarray, end: np.ndarray, nbytes: np.ndarray,
                  edges: np.ndarray) -> np.ndarray:
    """Bytes moved in each bin, each call's bytes spread evenly over its duration (exact:
    the summed rate is constant between call boundaries, so cumulative bytes are linear)."""
    if not len(start):
        return np.zeros(len(edges) - 1)
    rate = nbytes / np.maximum(end - start, 1e-9)
    t = np.concatenate([start, end])
    order = np.argsort(t, kind="stable")
    t = t[order]
    r = np.cumsum(np.concatenate([rate, -rate])[order])
    cum = np.concatenate([[0.0], np.cumsum(r[:-1] * np.diff(t))])
    return np.diff(np.interp(edges, t, cum))


def throughput_over_time(run: RunData) -> Figure:
    """GB/s over time per phase, with each iteration's aggregate as a dashed segment."""
    ops = run.ops
    fig = Figure(figsize=(WIDTH_IN, 3.6))
    ax = fig.add_subplot()
    _shade(ax, ops)
    t_end = max(float(ops.end.max()) if len(ops) else 1.0, 1e-3)
    edges = np.linspace(0.0, t_end, BINS + 1)
    width = edges[1] - edges[0]
    for ph, phase in enumerate(PHASES):
        m = (ops.phase == ph) & (ops.bytes > 0)
        if not m.any():
            continue
        gbps = bytes_per_bin(ops.start[m], ops.end[m], ops.bytes[m].astype(float), edges) / width / 1e9
        ax.fill_between(edges[:-1], gbps, step="post", color=PHASE_COLOR[phase], alpha=0.35)
        ax.step(edges[:-1], gbps, where="post", color=PHASE_COLOR[phase], lw=0.8, label=phase)
    agg = {(i["iteration"], i["phase"]): i["throughput_bytes_per_s"] / 1e9
           for i in run.view["iterations"]}
    for it, phase, s, e in _spans(ops):
        if (it, phase) in agg:
            ax.hlines(agg[(it, phase)], s, e, colors="black", linestyles="--", lw=1)
    ax.plot([], [], "k--", lw=1, label="iteration's throughput")
    ax.set_xlim(0, t_end * 1.01)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"seconds since the run's first op (bins of {width * 1e3:.3g} ms)")
    ax.set_ylabel("data calls' GB/s (1e9 B/s)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title(f"{run.label}: data calls' GB/s over time", loc="left", pad=14)
    return fig


def rank_throughput(run: RunData) -> tuple[Figure, dict[str, int]]:
    """Each rank's median (over iterations) GB/s per phase; the slowest rank in red.
    Returns the figure and the slowest rank of each phase."""
    ok = {(i["iteration"], i["phase"]) for i in run.view["iterations"]}
    phases = [p for p in PHASES if any(k[1] == p for k in ok)]
    fig = Figure(figsize=(WIDTH_IN, 3.4))
    slowest: dict[str, int] = {}
    for n, phase in enumerate(phases, 1):
        ax = fig.add_subplot(1, len(phases), n)
        per: dict[int, list[float]] = {}
        for r in run.ranks:
            if (r["iteration"], r["phase"]) in ok and r["phase"] == phase:
                span = max((r["end_ns"] - r["start_ns"]) / 1e9, 1e-9)
                per.setdefault(r["rank"], []).append(r["bytes"] / span / 1e9)
        ranks = sorted(per)
        med = [statistics.median(per[r]) for r in ranks]
        worst = int(np.argmin(med))
        slowest[phase] = ranks[worst]
        colors = [PHASE_COLOR[phase]] * len(ranks)
        colors[worst] = "red"
        ax.bar(range(len(ranks)), med, color=colors, width=0.8)
        ax.axhline(statistics.median(med), color="black", ls="--", lw=1, label="median rank")
        ax.annotate(f"slowest: rank {ranks[worst]}\n(lowest, {med[worst]:.3g} GB/s)", (worst, med[worst]),
                    xytext=(0, 14), textcoords="offset points", ha="center", fontsize=8,
                    color="red", arrowprops={"arrowstyle": "-", "color": "red"})
        step = max(1, len(ranks) // 16)
        ax.set_xticks(range(0, len(ranks), step), [str(ranks[i]) for i in range(0, len(ranks), step)])
        ax.set_xlabel("rank")
        ax.set_ylabel(f"{phase} GB/s per rank")
        ax.set_ylim(0, max(med) * 1.35)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{run.label}: per-rank throughput (bytes / the rank's own span, median over "
                 "iterations)", x=0.01, ha="left", fontsize=11)
    return fig, slowest


def latency(run: RunData) -> Figure:
    """ECDF of each call kind's duration, per phase, log time axis."""
    ops = run.ops
    fig = Figure(figsize=(WIDTH_IN, 3.6))
    phases = [ph for ph in range(len(PHASES)) if (ops.phase == ph).any()]
    for n, ph in enumerate(phases, 1):
        ax = fig.add_subplot(1, len(phases), n)
        for code, name in enumerate(ops.names):
            d = np.sort((ops.end - ops.start)[(ops.phase == ph) & (ops.op == code)]) * 1e3
            if not len(d):
                continue
            d = np.maximum(d, 1e-4)
            p50, p99 = np.percentile(d, [50, 99])
            ax.step(np.concatenate([[d[0]], d]), np.arange(len(d) + 1) / len(d), where="post",
                    color=OP_COLOR.get(name, "tab:gray"),
                    label=f"{name}: p50 {p50:.3g}, p99 {p99:.3g} ms (n={len(d)})")
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(f"{PHASES[ph]}: call duration, ms")
        ax.set_ylabel("fraction of calls")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{run.label}: op latency (every call of every iteration)", x=0.01, ha="left",
                 fontsize=11)
    return fig


def iteration_spread(run: RunData) -> Figure:
    """The throughput (GB/s) of each iteration per phase, the median dashed."""
    fig = Figure(figsize=(WIDTH_IN, 3.0))
    ax = fig.add_subplot()
    its = run.view["iterations"]
    for phase in PHASES:
        sel = [i for i in its if i["phase"] == phase]
        if not sel:
            continue
        x = [i["iteration"] for i in sel]
        y = [i["throughput_bytes_per_s"] / 1e9 for i in sel]
        med = statistics.median(y)
        ax.plot(x, y, "o-", color=PHASE_COLOR[phase],
                label=f"{phase}: median {med:.3g}, min {min(y):.3g}, max {max(y):.3g} GB/s")
        ax.axhline(med, color=PHASE_COLOR[phase], ls="--", lw=1)
    ax.set_xticks(sorted({i["iteration"] for i in its}))
    ax.set_xlabel("iteration")
    ax.set_ylabel("throughput GB/s")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title(f"{run.label}: iteration spread", loc="left")
    return fig


def comparison(runs: Sequence[RunData]) -> Figure:
    """Median GB/s (bars, min-max whiskers) and median seconds per run and phase."""
    labels = [textwrap.fill(r.label, 34) for r in runs]
    fig = Figure(figsize=(WIDTH_IN, 1.6 + 0.55 * len(runs) * 2))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    y = np.arange(len(runs))
    h = 0.38
    for k, phase in enumerate(PHASES):
        rows = [next((s for s in r.view["summary"] if s["phase"] == phase), None) for r in runs]
        if not any(rows):
            continue
        med = np.array([s["throughput_bytes_per_s"] / 1e9 if s else np.nan for s in rows])
        lo = np.array([s["throughput_min"] / 1e9 if s else np.nan for s in rows])
        hi = np.array([s["throughput_max"] / 1e9 if s else np.nan for s in rows])
        secs = np.array([s["seconds"] if s else np.nan for s in rows])
        yy = y + (k - 0.5) * h
        left.barh(yy, med, h, xerr=[med - lo, hi - med], color=PHASE_COLOR[phase], label=phase,
                  capsize=3)
        right.barh(yy, secs, h, color=PHASE_COLOR[phase], label=phase)
        for ax, at, values, fmt in ((left, hi, med, "{:.3g}"), (right, secs, secs, "{:.3g} s")):
            for yi, x, v in zip(yy, at, values, strict=True):  # right of the whisker
                if np.isfinite(v):
                    ax.text(x, yi, " " + fmt.format(v), va="center", fontsize=7)
    left.set_yticks(y, labels, fontsize=8)
    right.set_yticks(y, [""] * len(runs))
    left.set_xlabel("throughput GB/s, median over iterations (whiskers: min-max)")
    right.set_xlabel("seconds, median iteration")
    for ax in (left, right):
        ax.invert_yaxis()
        ax.margins(x=0.18)
    handles, names = left.get_legend_handles_labels()
    fig.legend(handles, names, loc="upper right", ncols=2, fontsize=8)  # above the bars
    fig.suptitle("runs compared (labels: the options that differ)", x=0.01, ha="left", fontsize=11)
    return fig


def run_pictures(run: RunData) -> list[Picture]:
    """The figures of one run, rendered."""
    bars, slowest = rank_throughput(run)
    slow = ", ".join(f"{p}: rank {r}" for p, r in slowest.items())
    return [
        Picture("timeline", "per-rank timeline", "Every call of every rank (threads as "
                "sub-lanes) and the coordinator's parts (the ranks' reports gathered, the "
                "manifest built and encoded on its CPU, the commit; the manifest read) on one "
                "clock, the long ones named with their seconds. A stall "
                "is a long bar or a gap; | marks each rank's end, red the last rank of each "
                "phase (S1 = save of iteration 1, R1 = its restore). A tiered run has a lane "
                "per tier above: its copies of each checkpoint (light) and the restarts it "
                "served (dark, named by scenario).", png(timeline(run))),
        Picture("throughput", "data calls' GB/s over time", "Bytes of the data calls spread "
                "over each call's duration, binned; dashed: each iteration's throughput (its "
                "bytes over the phase's wall time, commit included).",
                png(throughput_over_time(run))),
        Picture("ranks", "per-rank throughput", f"Each rank's bytes over its own span, median "
                f"over iterations; the lowest in red ({slow}). The table's slowest rank is "
                "another measure: the rank that finished last in the worst iteration.",
                png(bars)),
        Picture("latency", "op latency", "Distribution of each call kind's duration: the "
                "fraction of calls at or below a duration.", png(latency(run))),
        Picture("iterations", "iteration spread", "The throughput of each iteration (bytes "
                "over the phase's wall time); dashed: the median.", png(iteration_spread(run))),
        *loop_pictures(run),
    ]


def loop_pictures(run: RunData) -> list[Picture]:
    """--mode async: the loop's steps, blocking and persist (report.loop_figures)."""
    fig = loop_figure(run)
    return [] if fig is None else [Picture(
        "loop", "asynchronous loop", "Each process's training steps (blue), the time the "
        "loop waited for each checkpoint (red: blocking, the snapshot and any wait for the "
        "previous persist) and the persist behind the steps (orange, until durable); below, "
        "each step's duration with the persists shaded and the baseline loop's mean step "
        "dashed: steps that grow during a persist are its interference.", png(fig))]


def compare_picture(runs: Sequence[RunData]) -> Picture:
    return Picture("compare", "runs compared", "Median throughput (whiskers: lowest and "
                   "highest iteration) and median seconds of each run; labels are the options "
                   "that differ between the runs.", png(comparison(runs)))


@dataclass(frozen=True)
class Drawn:
    """Every figure of a report, rendered once for the HTML page and the PNG files."""

    runs: tuple[RunData, ...]
    per_run: tuple[tuple[Picture, ...], ...]
    compare: Picture | None


def draw(runs: Sequence[RunData]) -> Drawn:
    """Render each run's figures (runs without op records: none), and the comparison of
    several runs."""
    return Drawn(tuple(runs), tuple(tuple(run_pictures(r)) if len(r.ops) else () for r in runs),
                 compare_picture(runs) if len(runs) > 1 else None)


def output_dir(directory: str | Path, option: str) -> Path:
    """`directory`, created, or one line naming `option` and why not (checked before
    anything is drawn)."""
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CkptbenchError(f"{option} {directory}: cannot create the directory "
                             f"({exc.strerror or exc})") from None
    if not os.access(out, os.W_OK):
        raise CkptbenchError(f"{option} {directory}: the directory is not writable")
    return out


RUN_FIGURES = ("timeline", "throughput", "ranks", "latency", "iterations")  # run_pictures'


def _stems(runs: Sequence[RunData]) -> list[str]:
    stems = [Path(r.path).stem for r in runs]
    return [f"{i}-{s}" for i, s in enumerate(stems, 1)] if len(set(stems)) < len(stems) else stems


def plot_paths(runs: Sequence[RunData], directory: str | Path) -> list[Path]:
    """The PNG files --plots will write for `runs`, known before anything is drawn:
    <results stem>-<figure>.png for each run with op records, compare.png for several."""
    out = Path(directory)
    paths = [out / f"{stem}-{name}.png" for stem, r in zip(_stems(runs), runs, strict=True)
             if len(r.ops) for name in RUN_FIGURES + (("loop",) if has_loop(r) else ())]
    return paths + ([out / "compare.png"] if len(runs) > 1 else [])


def plot_files(drawn: Drawn, directory: str | Path) -> list[tuple[Path, bytes]]:
    """Every figure as (path in `directory`, PNG bytes), named as plot_paths says."""
    out = Path(directory)
    files = [(out / f"{stem}-{p.name}.png", p.png)
             for stem, pics in zip(_stems(drawn.runs), drawn.per_run, strict=True) for p in pics]
    if drawn.compare is not None:
        files.append((out / f"{drawn.compare.name}.png", drawn.compare.png))
    return files
