"""The answer a person wants: what one checkpoint costs the job (blocking save, restart
and restore, an asynchronous persist and its interference with training), the interval
to checkpoint at (the optimum, raised to the floor the persist or the storage sets), the
goodput and GPU-hours it buys, and the inverse question (the save time a goal needs).

Nothing here imports backends or the runner; the workload's checkpoint size is asked of
the planner lazily (``workload_checkpoint_bytes``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptbench.cadence.formulas import (
    SECONDS_PER_DAY,
    daly_interval,
    efficiency,
    failure_fraction,
    log_efficiency,
    loss_per_failure,
    non_negative,
    optimal_interval,
    positive,
    young_interval,
)
from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.units import format_bytes, format_rate

if TYPE_CHECKING:
    from ckptbench.spec import Workload

@dataclass(frozen=True)
class CheckpointCost:
    """What one checkpoint costs the job.

    ``save_s`` is the blocking part (all of a synchronous save); ``persist_s`` the time
    after it until the checkpoint is durable (asynchronous saves, else 0). A failure in
    that window falls back one more period, which costs ``persist_s`` per failure on
    average, so the model charges it with the restart: R_eff = R + persist.
    ``interference`` is how much slower training steps run during the persist (0.1: 10 %
    longer): of the persist's L seconds, L i / (1 + i) advance no training, so the model
    charges them with the save: C_eff = C + L i / (1 + i).
    """

    save_s: float
    restore_s: float
    persist_s: float = 0.0
    interference: float = 0.0

    def __post_init__(self) -> None:
        positive("save_s", self.save_s)
        non_negative("restore_s", self.restore_s)
        non_negative("persist_s", self.persist_s)
        non_negative("interference", self.interference)

    @property
    def effective_restore_s(self) -> float:
        return self.restore_s + self.persist_s

    def describe(self) -> str:
        """C, R and the persist as the table and the plot's title both show them."""
        text = f"save (blocking) {self.save_s:.3g} s, restart + restore {self.restore_s:.3g} s"
        if self.persist_s:
            text += f", persist {self.persist_s:.3g} s (asynchronous)"
        return text

    @property
    def effective_save_s(self) -> float:
        """The compute time one checkpoint costs: blocking + what the persist slows."""
        return self.save_s + self.persist_s * self.interference / (1.0 + self.interference)


@dataclass(frozen=True)
class OperatingPoint:
    """Goodput and its costs at one checkpoint interval."""

    label: str
    interval_s: float
    goodput: float
    save_fraction: float  # share of wall time spent in blocking saves (+ persist slowdown)
    failure_fraction: float  # share lost to rework and restarts
    loss_per_failure_s: float
    gpu_hours_lost_per_day: float | None
    cost_per_day: float | None


@dataclass(frozen=True)
class CadenceReport:
    cost: CheckpointCost
    mtbf_s: float
    gpus: int | None
    failures_per_day: float
    floor_s: float  # shortest allowed interval (0: none)
    floor_reason: str
    young: OperatingPoint
    daly: OperatingPoint
    exact: OperatingPoint
    recommended: OperatingPoint
    current: OperatingPoint | None = None

    @property
    def points(self) -> tuple[OperatingPoint, ...]:
        """The rows to show, without repeating the exact optimum when it is allowed."""
        rows = [self.young, self.daly, self.exact]
        if self.recommended.interval_s != self.exact.interval_s:
            rows.append(self.recommended)
        if self.current is not None:
            rows.append(self.current)
        return tuple(rows)


def operating_point(label: str, interval_s: float, cost: CheckpointCost, mtbf_s: float,
                    gpus: int | None = None, gpu_hour_price: float | None = None
                    ) -> OperatingPoint:
    """Everything the table shows for one interval."""
    args = (interval_s, cost.effective_save_s, cost.effective_restore_s, mtbf_s)
    log_e = log_efficiency(*args)
    goodput = math.exp(log_e)
    lost_share = max(0.0, -math.expm1(log_e))  # 1 - E without cancellation (nor -0.0)
    save_share = 0.0 if math.isinf(interval_s) else goodput * cost.effective_save_s / interval_s
    gpu_hours = None if gpus is None else gpus * 24.0 * lost_share
    price = None if gpu_hours is None or gpu_hour_price is None else gpu_hours * gpu_hour_price
    return OperatingPoint(
        label=label,
        interval_s=interval_s,
        goodput=goodput,
        save_fraction=save_share,
        failure_fraction=failure_fraction(*args),
        loss_per_failure_s=loss_per_failure(*args),
        gpu_hours_lost_per_day=gpu_hours,
        cost_per_day=price,
    )


def interval_floor(cost: CheckpointCost, checkpoint_bytes: float | None = None,
                   storage_bandwidth: float | None = None) -> tuple[float, str]:
    """Shortest interval allowed: one persist in flight at a time (tau >= persist), and
    checkpoint bytes per period within the sustained storage bandwidth."""
    floors = [(0.0, "")]
    if cost.persist_s > 0:
        floors.append((cost.persist_s, f"persist time {cost.persist_s:.4g} s"))
    if checkpoint_bytes and storage_bandwidth:
        need = checkpoint_bytes / storage_bandwidth - cost.save_s
        floors.append(
            (need, f"{format_bytes(checkpoint_bytes)} per period at {format_rate(storage_bandwidth)}")
        )
    return max(floors)


def analyze(cost: CheckpointCost, mtbf_s: float, *, gpus: int | None = None,
            current_interval_s: float | None = None, gpu_hour_price: float | None = None,
            checkpoint_bytes: float | None = None, storage_bandwidth: float | None = None
            ) -> CadenceReport:
    """Young, Daly and exact intervals with their goodput, the allowed optimum, the
    user's current interval. E is unimodal in tau, so the allowed optimum is the exact
    one raised to the floor."""
    mtbf_s = positive("mtbf_s", mtbf_s, allow_inf=True)
    if current_interval_s is not None:
        positive("current interval", current_interval_s)
    if gpu_hour_price is not None:
        non_negative("gpu_hour_price", gpu_hour_price)

    def point(label: str, tau: float) -> OperatingPoint:
        return operating_point(label, tau, cost, mtbf_s, gpus, gpu_hour_price)

    exact = point("exact optimum", optimal_interval(cost.effective_save_s, mtbf_s))
    floor_s, reason = interval_floor(cost, checkpoint_bytes, storage_bandwidth)
    recommended = exact if exact.interval_s >= floor_s else point("allowed optimum", floor_s)
    return CadenceReport(
        cost=cost,
        mtbf_s=mtbf_s,
        gpus=gpus,
        failures_per_day=SECONDS_PER_DAY / mtbf_s,
        floor_s=floor_s,
        floor_reason=reason,
        young=point("Young (1974)", young_interval(cost.effective_save_s, mtbf_s)),
        daly=point("Daly (2006)", daly_interval(cost.effective_save_s, mtbf_s)),
        exact=exact,
        recommended=recommended,
        current=None if current_interval_s is None else point("current", current_interval_s),
    )


def best_goodput(save_s: float, restore_s: float, mtbf_s: float) -> float:
    """Goodput at the exact optimum interval."""
    return efficiency(optimal_interval(save_s, mtbf_s), save_s, restore_s, mtbf_s)


def required_save_seconds(target: float, restore_s: float, mtbf_s: float) -> float | None:
    """Longest (synchronous) save time that still reaches `target` goodput at the best
    interval; None when the restarts alone keep goodput below it (e^(-R/M) is the
    ceiling as C -> 0), inf when nothing fails."""
    if not 0.0 < target < 1.0:
        raise SpecError(f"target goodput = {target} must be in (0, 1)")
    restore_s = non_negative("restore_s", restore_s)
    mtbf_s = positive("mtbf_s", mtbf_s, allow_inf=True)
    if math.isinf(mtbf_s):
        return math.inf
    lo, hi = math.log(mtbf_s * 1e-15), math.log(mtbf_s * 1e3)
    if best_goodput(math.exp(lo), restore_s, mtbf_s) < target:
        return None
    for _ in range(200):  # best goodput falls as C grows: bisect on log C
        mid = (lo + hi) / 2.0
        if best_goodput(math.exp(mid), restore_s, mtbf_s) >= target:
            lo = mid
        else:
            hi = mid
    return math.exp(lo)


def goodput_curve(cost: CheckpointCost, mtbf_s: float, intervals: Iterable[float]
                  ) -> list[tuple[float, float]]:
    """(interval, goodput) pairs, for plotting."""
    return [
        (tau, efficiency(tau, cost.effective_save_s, cost.effective_restore_s, mtbf_s))
        for tau in intervals
    ]


# --- restart and the checkpoint's size ---------------------------------------------------

DEFAULT_RESTART_OVERHEAD_S = 600.0
RESTART_OVERHEAD_SOURCE = (
    "default 10 min: the restart time R = 10 min of Daly's worked examples (FGCS 2006), a"
    " round figure for relaunching a large job (requeue, container and process start,"
    " communicator setup) before its checkpoint is read; not a measurement: give"
    " --restart-overhead with your cluster's own"
)


def workload_checkpoint_bytes(workload: Workload) -> int:
    """Full-size checkpoint bytes of a workload, from the planner (imported lazily)."""
    try:
        from ckptbench.plan import build_plan
    except ImportError:
        raise CkptbenchError(
            "--workload: the planner (ckptbench.plan.build_plan) is not available;"
            " give --checkpoint-size instead"
        ) from None
    return int(build_plan(workload).total_bytes)


def plotted_curve(report: CadenceReport, points: int = 400) -> list[tuple[float, float]]:
    """(interval s, goodput) over the span a plot shows: 30x either side of the
    recommended interval, reaching down to a tenth of the save time and out to every
    operating point."""
    import numpy as np

    finite = [p.interval_s for p in report.points if math.isfinite(p.interval_s)]
    centre = report.recommended.interval_s
    if not math.isfinite(centre):
        centre = max(finite, default=100 * report.cost.save_s)
    low = min([centre / 30, report.cost.save_s / 10, *finite])
    high = max([centre * 30, *finite])
    return goodput_curve(report.cost, report.mtbf_s, np.geomspace(low, high, points))
