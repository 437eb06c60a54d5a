"""The slowest of N nodes: the expected maximum of independent per-node save times.

A synchronous checkpoint is done when its slowest node is done, so the job's save time
is the *maximum* of its nodes' times, not their median. What a small run gives is a
handful of per-node samples (nodes x iterations); what the job needs is the expected
maximum of N draws, with N in the thousands.

Why a fitted distribution and not a bootstrap: resampling n measured values N times
returns the largest measured value with probability 1 - (1 - 1/n)^N, which is 1 to
many digits once N >> n (5 samples, 2,048 nodes). A bootstrap can therefore never say
more than "the worst sample seen", however many more nodes the job has; it hides the
very tail the job pays for. A parametric fit extrapolates from the measured spread
instead: here a lognormal for the time per byte (times are positive, slowdowns
multiply: a node at half speed takes twice as long), whose maximum over N grows like
exp(sigma sqrt(2 ln N)). With no spread measured (sigma = 0) the answer is the
heaviest node at the measured rate. The price is an assumed tail shape; the fit's
parameters and sample count are printed so the assumption can be judged.

The expectation is computed exactly for that model, not by simulation: with nodes in
groups (bytes b_g, count c_g) and X = seconds per byte ~ lognormal(mu, sigma),
P(max <= t) = prod_g Phi((ln t - ln b_g - mu) / sigma) ^ c_g, and
E[max] = integral_0^inf (1 - P(max <= t)) dt, integrated on a grid in ln t.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

_GRID = 8001


@dataclass(frozen=True)
class LogNormalFit:
    """ln X ~ Normal(mu, sigma^2), from samples of X (sigma with n - 1: unbiased variance)."""

    mu: float
    sigma: float
    samples: int

    @classmethod
    def of(cls, values: Iterable[float]) -> LogNormalFit:
        logs = np.log(np.asarray(list(values), dtype=float))
        if logs.size == 0 or not np.all(np.isfinite(logs)):
            raise ValueError("LogNormalFit needs positive, finite samples")
        sigma = float(np.std(logs, ddof=1)) if logs.size > 1 else 0.0
        return cls(float(np.mean(logs)), sigma, int(logs.size))

    @property
    def median(self) -> float:
        return math.exp(self.mu)

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma**2 / 2.0)


def _log_erfc(x: np.ndarray) -> np.ndarray:
    """ln erfc(x) for x >= 0 (Numerical Recipes' erfcc, relative error < 1.2e-7), in log
    form so the far tail does not underflow."""
    t = 1.0 / (1.0 + 0.5 * x)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    out: np.ndarray = np.log(t) - x * x + poly
    return out


def log_normal_cdf(z: np.ndarray) -> np.ndarray:
    """ln Phi(z), accurate in both tails (no scipy)."""
    z = np.asarray(z, dtype=float)
    out = np.empty_like(z)
    low = z < 0
    out[low] = math.log(0.5) + _log_erfc(-z[low] / math.sqrt(2.0))
    high = ~low
    out[high] = np.log1p(-0.5 * np.exp(_log_erfc(z[high] / math.sqrt(2.0))))
    return out


def expected_max(groups: Sequence[tuple[float, int]], fit: LogNormalFit) -> float:
    """E[max over nodes of b_node * X_node], X_node iid lognormal(fit): the expected time
    of the slowest node, for nodes given as (bytes, count) groups."""
    groups = [(float(b), int(c)) for b, c in groups if c > 0 and b > 0]
    if not groups:
        return 0.0
    if fit.sigma == 0.0:
        return max(b for b, _ in groups) * math.exp(fit.mu)
    log_b = np.array([math.log(b) for b, _ in groups])
    counts = np.array([c for _, c in groups], dtype=float)
    n = counts.sum()
    reach = max(math.sqrt(2.0 * math.log(n)) + 9.0, fit.sigma + 10.0)
    lo = float(log_b.min()) + fit.mu - 12.0 * fit.sigma
    hi = float(log_b.max()) + fit.mu + reach * fit.sigma
    u = np.linspace(lo, hi, _GRID)
    z = (u[:, None] - log_b[None, :] - fit.mu) / fit.sigma
    log_cdf = log_normal_cdf(z) @ counts
    tail = -np.expm1(log_cdf)  # P(max > e^u)
    integrand = tail * np.exp(u)
    # below `lo` the maximum is certainly larger: that part integrates to e^lo exactly
    area = float(np.sum((integrand[1:] + integrand[:-1]) * np.diff(u))) / 2.0  # trapezoids
    return math.exp(lo) + area


def expected_max_of_iid(n: int, fit: LogNormalFit) -> float:
    """E[max of n iid lognormal draws] (one group of n nodes of one byte each)."""
    return expected_max([(1.0, n)], fit)
