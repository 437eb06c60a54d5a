"""A whole training run simulated, many replicas at once: which failure hits which copy.

The multi-level model (``cadence.multilevel``) gives the efficiency of a schedule in
closed form, for exponential failures and over an infinite run. This simulation plays
the same rules event by event over a finite run (say Llama 3's 54 days) for many
replicas in lockstep (numpy arrays, one event per replica per step), so it gives the
spread of goodput and not only its mean, takes failures that are not exponential
(Weibull inter-arrival times per class), and tells where the time went: blocking saves,
work redone after a rollback, restores (restarts included), per failure class.

Rules, as the model's: the run computes ``t`` seconds and then saves the highest level
due (level k every ``prod(v_1+1 .. v_{k-1}+1)`` segments); the start counts as a
checkpoint of the top level. A failure of class c strikes at its own renewal times
(Weibull with shape ``k`` and mean ``1/rate``; shape 1 is exponential) and needs the
latest checkpoint of the cheapest level that survives it; the run rolls back to that
checkpoint and restores from its level. A restore from level k hit by a lesser failure
starts again; one hit by a failure of level k (below the top) or above falls back to the
next level up, or to the failure's own level.

Restarts onto fewer nodes: a failure that takes nodes may find no spare (each class says
how often: ``Failures.no_spare``); the job then restarts on the nodes it has left and
reads a resharded restore plan, which costs ``reshard_extra_s[k]`` more than level k's
restore (the DCP restore plan of the smaller layout: ``ckptbench restore
--restore-world-size`` measures it). The smaller job's slower steps until nodes come back
are not modelled. With no spare missing the run is the model's exactly; otherwise the
model's efficiency is not given for comparison (its restores have one cost per level).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ckptbench.cadence.formulas import non_negative, positive
from ckptbench.cadence.multilevel import Level, Schedule, efficiency
from ckptbench.errors import SpecError

MAX_REPLICAS = 100_000
MAX_STEPS = 200_000_000  # replica-events (about a minute), bounded before a run starts
Z99 = 2.5758293035489004  # two-sided 99 % normal quantile


@dataclass(frozen=True)
class Failures:
    """One failure class for the simulation: a rate (1/s), the level it needs (0-based)."""

    name: str
    rate_per_s: float
    level: int
    no_spare: float = 0.0  # the share of these failures that restart onto fewer nodes

    def __post_init__(self) -> None:
        if not 0.0 <= self.no_spare <= 1.0:
            raise SpecError(f"failure class {self.name}: the share without a spare "
                            f"{self.no_spare:g} is not a probability; allowed: 0 to 1")


@dataclass(frozen=True)
class Simulated:
    """Goodput over replicas, and the share of wall time each cause took (means)."""

    replicas: int
    wall_s: float
    goodput: tuple[float, ...]  # one per replica
    blocking: float
    rework: float
    restore: float
    by_class: dict[str, float]  # rework + restore after each class's failures, share of wall
    failures_per_replica: float
    analytic: float | None  # the model's efficiency (exponential failures), for comparison

    @property
    def mean(self) -> float:
        return float(np.mean(self.goodput))

    @property
    def ci99(self) -> float:
        """Half-width of the 99 % confidence interval of the mean."""
        n = len(self.goodput)
        return Z99 * float(np.std(self.goodput, ddof=1)) / math.sqrt(n) if n > 1 else math.inf

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.goodput, q))

    def to_dict(self) -> dict[str, object]:
        return {"replicas": self.replicas, "wall_s": self.wall_s, "goodput_mean": self.mean,
                "goodput_ci99": self.ci99, "goodput_p5": self.percentile(5),
                "goodput_p95": self.percentile(95), "analytic_efficiency": self.analytic,
                "lost": {"blocking": self.blocking, "rework": self.rework,
                         "restore": self.restore},
                "lost_by_class": self.by_class,
                "failures_per_replica": self.failures_per_replica}


class _Plan:
    """The schedule as arrays: which level each segment ends with, and saves so far."""

    def __init__(self, levels: Sequence[Level], schedule: Schedule,
                 reshard_extra_s: Sequence[float]) -> None:
        self.top = len(levels) - 1
        period = [1]
        for v in schedule.counts:
            period.append(period[-1] * (v + 1))
        self.period = np.array(period, dtype=np.int64)  # level k every period[k] segments
        # blocking, plus the persist's slowdown of training (as the model charges it)
        self.save = np.array([lv.charged_save_s for lv in levels])
        self.step = np.diff(self.save, prepend=0.0)
        self.restore = np.array([lv.restore_s for lv in levels])
        self.persist = np.array([lv.persist_s for lv in levels])
        if reshard_extra_s and len(reshard_extra_s) != len(levels):
            raise SpecError(f"{len(reshard_extra_s)} resharded restore costs for "
                            f"{len(levels)} levels; allowed: one per level")
        self.reshard = np.array([non_negative("resharded restore", x)
                                 for x in reshard_extra_s] or [0.0] * len(levels))
        self.t = schedule.compute_s

    def level_at(self, segment: np.ndarray) -> np.ndarray:
        """The level of the checkpoint that ends segment j (j = 0: the start, the top)."""
        divides = segment[:, None] % self.period[None, :] == 0
        levels: np.ndarray = np.count_nonzero(divides, axis=1) - 1
        return levels

    def saved_s(self, segments: np.ndarray) -> np.ndarray:
        """Blocking seconds of the saves of segments 1..j."""
        # saves of level >= k so far, times what level k adds over level k - 1
        saved: np.ndarray = (segments[:, None] // self.period[None, :]) @ self.step
        return saved


def simulate(levels: Sequence[Level], failures: Sequence[Failures], schedule: Schedule,
             wall_s: float, replicas: int = 1000, seed: int = 0, shape: float = 1.0,
             pool: bool = True, reshard_extra_s: Sequence[float] = ()) -> Simulated:
    """Simulate `replicas` runs of `wall_s` seconds each under one schedule (a seed makes
    it reproducible). `pool`: exponential classes share one clock (the same process,
    faster); False gives each class its own clock, as Weibull classes always have.
    `reshard_extra_s`: per level, what a restore onto fewer nodes costs more."""
    wall_s = positive("--days", wall_s)
    positive("--weibull-shape", shape)
    if not 1 <= replicas <= MAX_REPLICAS:
        raise SpecError(f"--replicas {replicas}: allowed: 1 to {MAX_REPLICAS}")
    rates = [0.0] * len(levels)
    for f in failures:
        if not 0 <= f.level < len(levels):
            raise SpecError(f"failure class {f.name}: level {f.level} is not one of the "
                            f"{len(levels)} levels")
        rates[f.level] += f.rate_per_s
    analytic: float | None = efficiency(levels, rates, schedule)  # validates levels and schedule too
    plan = _Plan(levels, schedule, reshard_extra_s)
    shortest = schedule.compute_s + min(plan.save)
    steps = replicas * (wall_s / shortest + wall_s * sum(rates) * 4 + 1)
    if steps > MAX_STEPS:
        raise SpecError(f"about {steps:.3g} events ({replicas} replicas x a "
                        f"{wall_s / 86400:.3g}-day run at one checkpoint per "
                        f"{shortest:.3g} s); allowed: at most {MAX_STEPS:.0e}: fewer replicas "
                        "or a shorter run")
    class_rate = np.array([f.rate_per_s for f in failures], dtype=float)
    clocks = _Clocks(class_rate, shape, np.random.default_rng(seed), pool)
    severity = np.array([f.level for f in failures], dtype=np.int64)
    # draws of their own, so that runs with and without missing spares share failures
    spares = _Spares(np.array([f.no_spare for f in failures]), np.random.default_rng([seed, 1]))
    if spares.any and plan.reshard.any():
        analytic = None
    return _run(plan, severity, clocks, spares, wall_s, replicas, failures, analytic)


class _Spares:
    """Which failures find no spare and restart onto fewer nodes."""

    def __init__(self, no_spare: np.ndarray, rng: np.random.Generator) -> None:
        self.no_spare, self.rng = no_spare, rng
        self.any = bool((no_spare > 0).any())

    def missing(self, classes: np.ndarray) -> np.ndarray:
        p = self.no_spare[classes]
        missing: np.ndarray = (p >= 1.0) | (self.rng.random(classes.size) < p)
        return missing


class _Persists:
    """Asynchronous levels: a checkpoint counts once its persist is done; a failure before
    that loses it (the persist dies with the job's processes)."""

    def __init__(self, persist: np.ndarray, n: int) -> None:
        self.persist = persist
        self.segment = np.zeros((n, persist.size), dtype=np.int64)
        self.done_at = np.full((n, persist.size), np.inf)
        self.active = bool((persist > 0).any())

    def commit(self, latest: np.ndarray, now: np.ndarray, live: np.ndarray) -> None:
        """Persists done by `now` make their checkpoint count (for its level and below)."""
        for k in np.flatnonzero(self.persist > 0):
            ready = live & (self.done_at[:, k] <= now)
            if ready.any():
                latest[ready, :k + 1] = np.maximum(latest[ready, :k + 1],
                                                   self.segment[ready, k][:, None])
                self.done_at[ready, k] = np.inf

    def start(self, saved: np.ndarray, level: np.ndarray, segment: np.ndarray,
              end: np.ndarray) -> np.ndarray:
        """The saves that start a persist (their checkpoint is pending); returns them."""
        pending: np.ndarray = saved & (self.persist[level] > 0)
        rows = np.flatnonzero(pending)
        self.segment[rows, level[rows]] = segment[rows]
        self.done_at[rows, level[rows]] = end[rows] + self.persist[level[rows]]
        return pending

    def drop(self, rows: np.ndarray) -> None:
        self.done_at[rows] = np.inf


class _Clocks:
    """When each replica's next failure strikes, and of which class.

    Each class is a renewal process with Weibull gaps of mean 1/rate. Exponential gaps
    (shape 1) forget their past, so all classes then share one clock at the total rate
    and a failure's class is drawn when it strikes (one column instead of one per class).
    """

    def __init__(self, rates: np.ndarray, shape: float, rng: np.random.Generator,
                 pool: bool) -> None:
        self.shape, self.rng = shape, rng
        total = float(rates.sum())
        self.pooled = pool and shape == 1.0
        if self.pooled:
            self.cumulative = np.cumsum(rates / total if total > 0 else rates)
            self.scale = np.array([1.0 / total if total > 0 else np.inf])
        else:
            with np.errstate(divide="ignore"):
                self.scale = np.where(rates > 0, 1.0 / (rates * math.gamma(1.0 + 1.0 / shape)),
                                      np.inf)

    def gaps(self, scale: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
        e = self.rng.standard_exponential(size)
        return scale * (e if self.shape == 1.0 else e ** (1.0 / self.shape))

    def start(self, n: int) -> np.ndarray:
        return self.gaps(self.scale[None, :], (n, self.scale.size))

    def strike(self, clocks: np.ndarray, idx: np.ndarray, column: np.ndarray,
               at: np.ndarray) -> np.ndarray:
        """Renew the clocks that struck; the failures' classes."""
        clocks[idx, column] = at + self.gaps(self.scale[column], (idx.size,))
        if not self.pooled:
            return column
        return np.minimum(np.searchsorted(self.cumulative, self.rng.random(idx.size),
                                          side="right"), self.cumulative.size - 1)


def _run(plan: _Plan, severity: np.ndarray, clocks: _Clocks, spares: _Spares,
         wall_s: float, n: int, failures: Sequence[Failures],
         analytic: float | None) -> Simulated:
    rows = np.arange(n)
    clock, rework, restore, count = (np.zeros(n) for _ in range(4))
    segment, from_level, cause = (np.zeros(n, dtype=np.int64) for _ in range(3))
    latest = np.zeros((n, plan.top + 1), dtype=np.int64)  # latest checkpoint of level >= k
    # restoring, and onto fewer nodes (a resharded plan)
    restoring, fewer = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    next_failure = clocks.start(n)
    by_class = np.zeros(len(failures))
    live = np.ones(n, dtype=bool)
    persists = _Persists(plan.persist, n)
    while live.any():
        due = plan.level_at(segment + 1)
        length = np.where(restoring, plan.restore[from_level]
                          + np.where(fewer, plan.reshard[from_level], 0.0),
                          plan.t + plan.save[due])
        end = clock + length
        first = next_failure.argmin(axis=1)
        strike = next_failure[rows, first]
        fail = live & (strike < end) & (strike < wall_s)
        done = live & ~fail & (end < wall_s)
        live &= fail | done
        if persists.active:
            persists.commit(latest, np.where(fail, strike, end), fail | done)
        # a phase completed: a checkpoint (its level and every level below it), or a restore
        saved = done & ~restoring
        segment = np.where(saved, segment + 1, segment)
        counts_now = saved & ~persists.start(saved, due, segment, end) if persists.active \
            else saved
        below = np.arange(plan.top + 1)[None, :] <= due[:, None]
        latest = np.where(counts_now[:, None] & below, segment[:, None], latest)
        finished = done & restoring
        restore += np.where(finished, length, 0.0)
        by_class += np.bincount(cause[finished], weights=length[finished],
                                minlength=len(failures))
        restoring &= ~finished
        fewer &= restoring
        clock = np.where(done, end, clock)
        if fail.any():
            idx = np.flatnonzero(fail)
            t_fail = strike[idx]
            c = clocks.strike(next_failure, idx, first[idx], t_fail)
            if persists.active:
                persists.drop(idx)
            spent = t_fail - clock[idx]
            count[idx] += 1
            need = severity[c]
            was_restoring = restoring[idx]
            k = from_level[idx]
            # a restore hit by a lesser failure (or any, at the top) simply starts again
            retry = was_restoring & ((need < k) | (k == plan.top))
            need = np.where(was_restoring & ~retry, np.maximum(need, k + 1), need)
            need = np.minimum(need, plan.top)
            restore[idx] += np.where(was_restoring, spent, 0.0)
            rework[idx] += np.where(was_restoring, 0.0, spent)
            back = ~retry
            target = latest[idx, need]
            lost = np.where(back, (segment[idx] - target) * plan.t
                            + plan.saved_s(segment[idx]) - plan.saved_s(target), 0.0)
            rework[idx] += lost
            # a restore cut short is charged to the failure that made it, the rest to c
            charged = np.where(was_restoring, cause[idx], c)
            by_class += np.bincount(charged, weights=spent, minlength=len(failures))
            by_class += np.bincount(c, weights=lost, minlength=len(failures))
            segment[idx] = np.where(back, target, segment[idx])
            latest[idx] = np.where(back[:, None], np.minimum(latest[idx], target[:, None]),
                                   latest[idx])
            from_level[idx] = np.where(back, plan.level_at(target), k)
            restoring[idx] = True
            if spares.any:  # a restore started again keeps its layout; a new failure may shrink it
                fewer[idx] = (fewer[idx] & was_restoring) | spares.missing(c)
            cause[idx] = c
            clock[idx] = t_fail
    # the run ends at wall_s in the middle of a phase: compute done so far counts as work
    left = wall_s - clock
    cut = np.where(restoring, left, 0.0)
    restore += cut
    by_class += np.bincount(cause, weights=cut, minlength=len(failures))
    useful = segment * plan.t + np.where(restoring, 0.0, np.minimum(left, plan.t))
    blocking = plan.saved_s(segment) + np.where(restoring, 0.0, np.maximum(left - plan.t, 0.0))
    return Simulated(
        replicas=n, wall_s=wall_s, goodput=tuple((useful / wall_s).tolist()),
        blocking=float(blocking.mean() / wall_s), rework=float(rework.mean() / wall_s),
        restore=float(restore.mean() / wall_s),
        by_class={f.name: float(v / n / wall_s) for f, v in zip(failures, by_class,
                                                                  strict=True)},
        failures_per_replica=float(count.mean()),
        analytic=analytic if clocks.shape == 1.0 else None)
