"""How often to checkpoint: Young, Daly and the exact optimum against the job's MTBF.

Pure arithmetic, in seconds throughout. Names follow the reference: C = blocking save
time, R = restart + restore time, M = job mean time between interruptions, tau = compute
time between checkpoints (the save not included), E = efficiency (goodput), the
fraction of wall-clock time that advances training.

Every formula is Daly's exponential-failure model (FGCS 22, 2006), in which failures
may also strike during a save or a restart; its efficiency is never negative, unlike the
first-order forms, which is why the calculator uses it everywhere. M may be ``math.inf``
(no failures): then the best interval is ``math.inf`` too.

Nothing here imports backends or the runner; the workload's checkpoint size is asked of
the planner lazily (``workload_checkpoint_bytes``). C and R from a measured run come
from the job model (``ckptbench.jobmodel``), the step before this one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptbench.errors import CkptbenchError, SpecError

if TYPE_CHECKING:
    from ckptbench.spec import Workload

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
_EPS = 2.220446049250313e-16


# --- validation -----------------------------------------------------------------------


def _positive(name: str, value: float, allow_inf: bool = False) -> float:
    """Reject zero, negative, NaN (and infinite unless allowed) with the field's name."""
    value = float(value)
    if math.isnan(value) or value <= 0 or (math.isinf(value) and not allow_inf):
        allowed = "> 0 (inf allowed)" if allow_inf else "> 0 and finite"
        raise SpecError(f"{name} = {value} must be {allowed}")
    return value


def _non_negative(name: str, value: float) -> float:
    value = float(value)
    if math.isnan(value) or value < 0 or math.isinf(value):
        raise SpecError(f"{name} = {value} must be >= 0 and finite")
    return value


# --- Lambert W and the intervals ------------------------------------------------------


def lambert_w0(x: float) -> float:
    """Principal branch of Lambert W (w e^w = x, w >= -1), by Halley iteration.

    Written here so the calculator needs no scipy; exact to a few ulps for x >= -1/e.
    """
    if math.isnan(x):
        raise ValueError("lambert_w0: x is NaN")
    if math.isinf(x) and x > 0:
        return math.inf
    branch = math.e * x + 1.0  # distance from the branch point -1/e
    if branch < -4 * _EPS:
        raise ValueError(f"lambert_w0: x = {x} is below -1/e")
    if branch <= 0.0:
        return -1.0
    if x < -0.3:  # series about the branch point (Corless et al. 1996)
        p = math.sqrt(2.0 * branch)
        w = -1.0 + p - p * p / 3.0 + 11.0 / 72.0 * p**3
    elif x < 3.0:
        w = math.log1p(x)
    else:
        w = math.log(x) - math.log(math.log(x))
    for _ in range(64):
        ew = math.exp(w)
        f = w * ew - x
        wp1 = w + 1.0
        if wp1 == 0.0:
            break
        step = f / (ew * wp1 - (w + 2.0) * f / (2.0 * wp1))
        w -= step
        if abs(step) <= 4 * _EPS * (1.0 + abs(w)):
            break
    return w


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young (1974): sqrt(2 C M). First order, good while C << M."""
    save_s = _positive("save_s", save_s)
    mtbf_s = _positive("mtbf_s", mtbf_s, allow_inf=True)
    return math.sqrt(2.0 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order estimate (FGCS 2006, eq. 37), as LLNL's SCR implements it."""
    save_s = _positive("save_s", save_s)
    mtbf_s = _positive("mtbf_s", mtbf_s, allow_inf=True)
    if save_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - save_s


def optimal_interval(save_s: float, mtbf_s: float) -> float:
    """The exact minimum of Daly's expected wall time: M (1 + W0(-e^-(1 + C/M))).

    Independent of R. For small C/M, 1 + W0 is tiny and the argument of W0 sits on the
    branch point, where rounding in exp() would cost digits; a Newton step on the same
    condition, ln(1 - d) + d + C/M = 0 with d = tau/M, restores them.
    """
    save_s = _positive("save_s", save_s)
    mtbf_s = _positive("mtbf_s", mtbf_s, allow_inf=True)
    if math.isinf(mtbf_s):
        return math.inf
    c = save_s / mtbf_s
    d = 1.0 + lambert_w0(-math.exp(-1.0 - c))
    if d < 0.5:
        if d <= 0.0:
            d = math.sqrt(2.0 * c)
        for _ in range(3):
            d += (_log1p_neg_plus(d) + c) * (1.0 - d) / d
    return mtbf_s * d


def _log1p_neg_plus(d: float) -> float:
    """ln(1 - d) + d without cancellation for small d (the series -sum d^k / k, k >= 2)."""
    if d < 1e-2:
        return -sum(d**k / k for k in range(9, 1, -1))
    return math.log1p(-d) + d


# --- efficiency and losses ------------------------------------------------------------


def _log_expm1_over(a: float) -> float:
    """log((e^a - 1) / a), accurate for tiny and for huge a."""
    if a < 1e-4:
        return a / 2.0 + a * a / 24.0
    if a > 50.0:
        return a + math.log1p(-math.exp(-a)) - math.log(a)
    return math.log(math.expm1(a) / a)


def _check_point(interval_s: float, save_s: float, restore_s: float, mtbf_s: float) -> None:
    _positive("interval_s", interval_s, allow_inf=True)
    _non_negative("save_s", save_s)
    _non_negative("restore_s", restore_s)
    _positive("mtbf_s", mtbf_s, allow_inf=True)


def _log_efficiency(interval_s: float, save_s: float, restore_s: float, mtbf_s: float) -> float:
    """log E, with E = tau e^(-R/M) / (M (e^((tau+C)/M) - 1)) (Daly's T_s / T_w)."""
    _check_point(interval_s, save_s, restore_s, mtbf_s)
    if math.isinf(interval_s):
        return 0.0 if math.isinf(mtbf_s) else -math.inf
    log_useful = -math.log1p(save_s / interval_s)  # tau / (tau + C)
    if math.isinf(mtbf_s):
        return log_useful
    segment = interval_s + save_s
    return log_useful - restore_s / mtbf_s - _log_expm1_over(segment / mtbf_s)


def efficiency(interval_s: float, save_s: float, restore_s: float, mtbf_s: float) -> float:
    """Goodput at checkpoint interval tau: in [0, 1], whatever C, R and tau are against M."""
    return math.exp(_log_efficiency(interval_s, save_s, restore_s, mtbf_s))


def failure_fraction(interval_s: float, save_s: float, restore_s: float, mtbf_s: float) -> float:
    """Share of wall time lost to failures (rework + restarts), 1 - E (tau + C) / tau.

    Failures arrive at rate 1/M over all wall time, so this share times M is the loss
    per failure; the rest of 1 - E is the saves themselves (E C / tau).
    """
    _check_point(interval_s, save_s, restore_s, mtbf_s)
    if math.isinf(mtbf_s):
        return 0.0
    if math.isinf(interval_s):
        return 1.0
    segment = interval_s + save_s
    return -math.expm1(-restore_s / mtbf_s - _log_expm1_over(segment / mtbf_s))


def loss_per_failure(interval_s: float, save_s: float, restore_s: float, mtbf_s: float) -> float:
    """Expected wall seconds one failure costs: the partial segment redone plus restarts.

    Exact in Daly's model (restarts that fail again are included); about R + (tau + C)/2
    when tau + C << M, and exactly that in the limit of no failures.
    """
    if math.isinf(mtbf_s):
        _check_point(interval_s, save_s, restore_s, mtbf_s)
        return restore_s + (interval_s + save_s) / 2.0
    return mtbf_s * failure_fraction(interval_s, save_s, restore_s, mtbf_s)


def loss_per_day(interval_s: float, save_s: float, restore_s: float, mtbf_s: float) -> float:
    """Expected wall seconds per day lost to failures (saves themselves not counted)."""
    return SECONDS_PER_DAY * failure_fraction(interval_s, save_s, restore_s, mtbf_s)


def failure_loss(fraction: float, run_s: float, interval_s: float, save_s: float,
                 restore_s: float, persist_s: float = 0.0) -> float:
    """Wall seconds lost if the first failure strikes at `fraction` of a `run_s` run.

    The time since the last durable checkpoint is redone, and the restart paid. With an
    asynchronous save, a checkpoint is durable only `persist_s` after its blocking part,
    so a failure inside that window falls back one more period. With no checkpoints
    (interval inf) everything done so far is lost.
    """
    if not 0.0 <= fraction <= 1.0:
        raise SpecError(f"fraction = {fraction} must be in [0, 1]")
    run_s = _positive("run_s", run_s)
    _check_point(interval_s, save_s, restore_s, 1.0)
    persist_s = _non_negative("persist_s", persist_s)
    elapsed = fraction * run_s
    if math.isinf(interval_s):
        return elapsed + restore_s
    period = interval_s + save_s
    done = math.floor(elapsed / period)
    into = elapsed - done * period
    lost = into + (period if done >= 1 and into < persist_s else 0.0)
    return lost + restore_s


# --- failure models -------------------------------------------------------------------


@dataclass(frozen=True)
class FailurePreset:
    """A published job-interruption rate, per GPU-hour, with where it comes from."""

    name: str
    rate_per_gpu_hour: float
    citation: str


FAILURE_PRESETS: dict[str, FailurePreset] = {
    p.name: p
    for p in (
        FailurePreset(
            "llama3", 1.97e-5,
            "Llama 3 Herd of Models (Meta, 2024): 419 unexpected interruptions in 54 days"
            " on 16,384 H100",
        ),
        FailurePreset(
            "rsc1", 3.39e-5,
            "Kokolis et al. 2024, Revisiting Reliability in Large-Scale ML Research"
            " Clusters: Meta RSC-1, 16k A100, 6.50 failures per 1k node-days",
        ),
        FailurePreset(
            "rsc2", 1.22e-5,
            "Kokolis et al. 2024 (same paper): Meta RSC-2, 8k A100, 2.34 failures per 1k"
            " node-days",
        ),
        FailurePreset(
            "opt175b", 7.4e-5,
            "OPT-175B logbook (Meta, 2022): ~105 restarts in ~2 months on 992 A100",
        ),
        FailurePreset(
            "bloom", 2.3e-5,
            "BLOOM-176B training (BigScience, 2022): 1-2 GPU failures a week on 384 A100",
        ),
    )
}


@dataclass(frozen=True)
class Component:
    """One kind of part that can interrupt the job: its rate per unit-hour and count.

    ``per_host`` is how many units each host has; None means one per GPU.
    """

    name: str
    rate_per_hour: float
    per_host: float | None = None

    def units(self, gpus: int, gpus_per_host: int) -> float:
        if self.per_host is None:
            return float(gpus)
        return self.per_host * math.ceil(gpus / gpus_per_host)


_HOST_NAMES = ("host", "node")


def parse_component(text: str) -> Component:
    """``NAME=RATE[:PER_HOST]`` (rate per unit-hour); no PER_HOST = one per GPU
    (``host`` and ``node`` default to one per host)."""
    usage = f"--component {text!r} must be NAME=RATE[:PER_HOST], e.g. gpu=1.2e-5 or nic=1e-6:8"
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise SpecError(usage)
    rate_text, colon, count_text = rest.partition(":")
    try:
        rate = float(rate_text)
        per_host = float(count_text) if colon else (1.0 if name in _HOST_NAMES else None)
    except ValueError:
        raise SpecError(usage) from None
    if not math.isfinite(rate) or rate < 0:
        raise SpecError(f"--component {name}: rate {rate_text} must be >= 0 per unit-hour")
    if per_host is not None and (not math.isfinite(per_host) or per_host <= 0):
        raise SpecError(f"--component {name}: PER_HOST {count_text} must be > 0")
    return Component(name, rate, per_host)


@dataclass(frozen=True)
class FailureModel:
    """The job MTBF and, for the printout, how it was arrived at."""

    mtbf_s: float
    source: str


def series_mtbf_s(gpus: int, components: Iterable[Component], gpus_per_host: int = 8) -> float:
    """Job MTBF of a series system: 1 / sum(n_i lambda_i); inf when nothing fails."""
    if gpus < 1:
        raise SpecError(f"--gpus = {gpus} must be an integer >= 1")
    if gpus_per_host < 1:
        raise SpecError(f"--gpus-per-node = {gpus_per_host} must be an integer >= 1")
    rate = sum(c.rate_per_hour * c.units(gpus, gpus_per_host) for c in components)
    return math.inf if rate == 0 else SECONDS_PER_HOUR / rate


def failure_model(*, mtbf_s: float | None = None, preset: str | None = None,
                  components: Iterable[Component] = (), gpus: int | None = None,
                  gpus_per_host: int = 8) -> FailureModel:
    """One MTBF from exactly one source: given directly, or from a preset and/or parts."""
    components = tuple(components)
    if mtbf_s is not None:
        if preset is not None or components:
            raise SpecError("--mtbf cannot be combined with --failure-preset or --component")
        mtbf_s = _positive("--mtbf", mtbf_s, allow_inf=True)
        return FailureModel(mtbf_s, "given" if math.isfinite(mtbf_s) else "given: no failures")
    if preset is None and not components:
        raise SpecError("a failure model is required: --mtbf, --failure-preset or --component")
    if preset is not None and preset not in FAILURE_PRESETS:
        raise SpecError(
            f"--failure-preset {preset!r} is not known; allowed: {', '.join(FAILURE_PRESETS)}"
        )
    if gpus is None:
        raise SpecError("--gpus is required to turn failure rates into a job MTBF")
    parts = [f"{c.name} {c.rate_per_hour:.3g}/h x {c.units(gpus, gpus_per_host):g}"
             for c in components]
    if preset is not None:
        rate = FAILURE_PRESETS[preset].rate_per_gpu_hour
        components = (Component(preset, rate), *components)
        parts.insert(0, f"{preset} preset {rate:.3g}/GPU-h")
    mtbf = series_mtbf_s(gpus, components, gpus_per_host)
    return FailureModel(mtbf, f"{' + '.join(parts)} at {gpus} GPUs")


# --- the answer a person wants --------------------------------------------------------


@dataclass(frozen=True)
class CheckpointCost:
    """What one checkpoint costs the job.

    ``save_s`` is the blocking part (all of a synchronous save); ``persist_s`` the time
    after it until the checkpoint is durable (asynchronous saves, else 0). A failure in
    that window falls back one more period, which costs ``persist_s`` per failure on
    average, so the model charges it with the restart: R_eff = R + persist.
    """

    save_s: float
    restore_s: float
    persist_s: float = 0.0

    def __post_init__(self) -> None:
        _positive("save_s", self.save_s)
        _non_negative("restore_s", self.restore_s)
        _non_negative("persist_s", self.persist_s)

    @property
    def effective_restore_s(self) -> float:
        return self.restore_s + self.persist_s


@dataclass(frozen=True)
class OperatingPoint:
    """Goodput and its costs at one checkpoint interval."""

    label: str
    interval_s: float
    goodput: float
    save_fraction: float  # share of wall time spent in blocking saves
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
    args = (interval_s, cost.save_s, cost.effective_restore_s, mtbf_s)
    log_e = _log_efficiency(*args)
    goodput = math.exp(log_e)
    lost_share = max(0.0, -math.expm1(log_e))  # 1 - E without cancellation (nor -0.0)
    save_share = 0.0 if math.isinf(interval_s) else goodput * cost.save_s / interval_s
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
            (need, f"{checkpoint_bytes / 1e12:.4g} TB per period at {format_bandwidth(storage_bandwidth)}")
        )
    return max(floors)


def analyze(cost: CheckpointCost, mtbf_s: float, *, gpus: int | None = None,
            current_interval_s: float | None = None, gpu_hour_price: float | None = None,
            checkpoint_bytes: float | None = None, storage_bandwidth: float | None = None
            ) -> CadenceReport:
    """Young, Daly and exact intervals with their goodput, the allowed optimum, the
    user's current interval. E is unimodal in tau, so the allowed optimum is the exact
    one raised to the floor."""
    mtbf_s = _positive("mtbf_s", mtbf_s, allow_inf=True)
    if current_interval_s is not None:
        _positive("current interval", current_interval_s)
    if gpu_hour_price is not None:
        _non_negative("gpu_hour_price", gpu_hour_price)

    def point(label: str, tau: float) -> OperatingPoint:
        return operating_point(label, tau, cost, mtbf_s, gpus, gpu_hour_price)

    exact = point("exact optimum", optimal_interval(cost.save_s, mtbf_s))
    floor_s, reason = interval_floor(cost, checkpoint_bytes, storage_bandwidth)
    recommended = exact if exact.interval_s >= floor_s else point("allowed optimum", floor_s)
    return CadenceReport(
        cost=cost,
        mtbf_s=mtbf_s,
        gpus=gpus,
        failures_per_day=SECONDS_PER_DAY / mtbf_s,
        floor_s=floor_s,
        floor_reason=reason,
        young=point("Young (1974)", young_interval(cost.save_s, mtbf_s)),
        daly=point("Daly (2006)", daly_interval(cost.save_s, mtbf_s)),
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
    restore_s = _non_negative("restore_s", restore_s)
    mtbf_s = _positive("mtbf_s", mtbf_s, allow_inf=True)
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
        (tau, efficiency(tau, cost.save_s, cost.effective_restore_s, mtbf_s)) for tau in intervals
    ]


# --- restart and the checkpoint's size ---------------------------------------------------

DEFAULT_RESTART_OVERHEAD_S = 600.0
RESTART_OVERHEAD_SOURCE = (
    "default 10 min: the restart time R = 10 min of Daly's worked examples (FGCS 2006), a"
    " round figure for relaunching a large job (requeue, container and process start,"
    " communicator setup) before its checkpoint is read; not a measurement: give"
    " --restart-overhead with your cluster's own"
)


def format_bandwidth(bytes_per_s: float) -> str:
    """Bytes/s as GB/s or TB/s (decimal units, as storage vendors quote them)."""
    return f"{bytes_per_s / 1e12:.3g} TB/s" if bytes_per_s >= 1e12 else f"{bytes_per_s / 1e9:.3g} GB/s"


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
