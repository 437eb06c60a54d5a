"""Stretches of a training run that end in success or in a failure: the arithmetic both
multi-level models compose (``multilevel``: SCR's rules; ``scoped``: the stated rules).

A :class:`Phase` says how a stretch of work ends: success with probability ``p_ok`` after
``t_ok`` seconds on average, or a failure of kind ``e`` with probability ``p_fail[e]``,
``t_fail[e]`` seconds after the stretch began on average. Stretches compose in sequence
(:func:`then`) and in repetition (:func:`repeat`, closed form). Times are floats, or numpy
vectors when a caller wants them split by what the time was spent on (the arithmetic is
linear in them).

Precision: at tiny failure rates ``1 - p_ok`` is below a float's resolution, so nothing
here subtracts ``p_ok`` from 1: the failure probability of a stretch is the sum of its
``p_fail`` (each from ``expm1``), and the geometric sums of :func:`repeat` use
``expm1``/``log1p`` and a series where the closed form would cancel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Time = Any  # float, or a numpy vector of seconds by category


@dataclass(frozen=True)
class Phase:
    """How a stretch of work ends: success (``p_ok``, mean seconds ``t_ok``) or a failure
    of kind e (``p_fail[e]``, mean seconds until it ``t_fail[e]``)."""

    p_ok: float
    t_ok: Time
    p_fail: tuple[float, ...]
    t_fail: tuple[Time, ...]

    @property
    def p_any_fail(self) -> float:
        return math.fsum(self.p_fail)


def exposed(duration: float, rates: Sequence[float], unit: Time = 1.0) -> Phase:
    """A stretch of ``duration`` seconds exposed to failures of every kind (rates 1/s);
    ``unit``: what its time counts as (1.0, or a unit vector of a category)."""
    total = math.fsum(rates)
    if total == 0.0:
        zeros = (0.0,) * len(rates)
        return Phase(1.0, duration * unit, zeros, tuple(0.0 * unit for _ in rates))
    a = total * duration
    hit = -math.expm1(-a)  # 1 - e^-a, exact for small a
    # mean time to a failure, given one strikes within the stretch
    until = duration / 2.0 if a < 1e-6 else (hit - a * math.exp(-a)) / (total * hit)
    return Phase(math.exp(-a), duration * unit, tuple(r / total * hit for r in rates),
                 tuple(until * unit for _ in rates))


def then(a: Phase, b: Phase) -> Phase:
    """``a`` and, if it succeeds, ``b``."""
    p_fail, t_fail = [], []
    for pa, ta, pb, tb in zip(a.p_fail, a.t_fail, b.p_fail, b.t_fail, strict=True):
        p = pa + a.p_ok * pb
        p_fail.append(p)
        t_fail.append((pa * ta + a.p_ok * pb * (a.t_ok + tb)) / p if p > 0 else 0.0 * ta)
    return Phase(a.p_ok * b.p_ok, a.t_ok + b.t_ok, tuple(p_fail), tuple(t_fail))


def geometric_sums(f: float, n: int) -> tuple[float, float, float]:
    """For one try failing with probability ``f`` (q = 1 - f succeeding), n tries in a row:
    ``q^n``, ``sum_{j<n} q^j`` and ``sum_{j<n} j q^j``, without cancellation at tiny f."""
    if f <= 0.0:
        return 1.0, float(n), n * (n - 1) / 2.0
    g = -math.log1p(-f) if f < 1.0 else math.inf  # q = e^-g
    if g * n < 1e-4:  # series in g: the closed forms would cancel to noise
        s0 = n - g * n * (n - 1) / 2.0 + g * g * (n - 1) * n * (2 * n - 1) / 12.0
        s1 = (n * (n - 1) / 2.0 - g * (n - 1) * n * (2 * n - 1) / 6.0
              + g * g * (n * (n - 1) / 2.0) ** 2 / 2.0)
        return math.exp(-g * n), s0, s1
    q_n = math.exp(-g * n)
    s0 = -math.expm1(-g * n) / f
    # sum_{j<n} j q^j = q (1 - n q^(n-1) + (n-1) q^n) / f^2
    q = 1.0 - f
    s1 = q * (-math.expm1(-g * n) - n * q ** (n - 1) * f) / (f * f) if q > 0 else 0.0
    return q_n, s0, max(s1, 0.0)


def repeat(a: Phase, n: int) -> Phase:
    """``a`` n times in a row, closed form (geometric sums over the attempt that fails)."""
    if n == 0:
        zeros = (0.0,) * len(a.p_fail)
        return Phase(1.0, 0.0 * a.t_ok, zeros, tuple(0.0 * t for t in a.t_fail))
    q_n, reach, before = geometric_sums(a.p_any_fail, n)
    p_fail, t_fail = [], []
    for p, t in zip(a.p_fail, a.t_fail, strict=True):
        total = reach * p
        p_fail.append(total)
        t_fail.append((total * t + before * p * a.t_ok) / total if total > 0 else 0.0 * t)
    return Phase(q_n, n * a.t_ok, tuple(p_fail), tuple(t_fail))
