"""Daly's formulas: the checkpoint interval (Young, Daly, the exact optimum through Lambert
W) and what an interval costs (efficiency, failure losses) against the job's MTBF.

Pure arithmetic, in seconds throughout. Names follow the reference: C = blocking save
time, R = restart + restore time, M = job mean time between interruptions, tau = compute
time between checkpoints (the save not included), E = efficiency (goodput), the
fraction of wall-clock time that advances training.

Every formula is Daly's exponential-failure model (FGCS 22, 2006), in which failures
may also strike during a save or a restart; its efficiency is never negative, unlike the
first-order forms, which is why the calculator uses it everywhere. M may be ``math.inf``
(no failures): then the best interval is ``math.inf`` too.
"""

from __future__ import annotations

import math

from ckptbench.errors import SpecError

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
_EPS = 2.220446049250313e-16


# --- validation -----------------------------------------------------------------------


def positive(name: str, value: float, allow_inf: bool = False) -> float:
    """Reject zero, negative, NaN (and infinite unless allowed) with the field's name."""
    value = float(value)
    if math.isnan(value) or value <= 0 or (math.isinf(value) and not allow_inf):
        allowed = "> 0 (inf allowed)" if allow_inf else "> 0 and finite"
        raise SpecError(f"{name} = {value} must be {allowed}")
    return value


def non_negative(name: str, value: float) -> float:
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
    save_s = positive("save_s", save_s)
    mtbf_s = positive("mtbf_s", mtbf_s, allow_inf=True)
    return math.sqrt(2.0 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order estimate (FGCS 2006, eq. 37), as LLNL's SCR implements it."""
    save_s = positive("save_s", save_s)
    mtbf_s = positive("mtbf_s", mtbf_s, allow_inf=True)
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
    save_s = positive("save_s", save_s)
    mtbf_s = positive("mtbf_s", mtbf_s, allow_inf=True)
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
    positive("interval_s", interval_s, allow_inf=True)
    non_negative("save_s", save_s)
    non_negative("restore_s", restore_s)
    positive("mtbf_s", mtbf_s, allow_inf=True)


def log_efficiency(interval_s: float, save_s: float, restore_s: float, mtbf_s: float) -> float:
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
    return math.exp(log_efficiency(interval_s, save_s, restore_s, mtbf_s))


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
    run_s = positive("run_s", run_s)
    _check_point(interval_s, save_s, restore_s, 1.0)
    persist_s = non_negative("persist_s", persist_s)
    elapsed = fraction * run_s
    if math.isinf(interval_s):
        return elapsed + restore_s
    period = interval_s + save_s
    done = math.floor(elapsed / period)
    into = elapsed - done * period
    lost = into + (period if done >= 1 and into < persist_s else 0.0)
    return lost + restore_s
