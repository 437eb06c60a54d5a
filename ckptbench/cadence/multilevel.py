"""Multi-level checkpointing: the efficiency of a schedule, exactly, and its optimum.

The model is LLNL SCR's (Moody, Bronevetsky, Mohror, de Supinski, SC'10): levels
1..L with a save cost ``c_k`` and a restore cost ``r_k`` (cheap node memory first, the
storage last), and failures of severity 1..L at rates ``lambda_i``, all exponential. A
failure of severity ``i`` needs the latest checkpoint of a level ``>= i``; failures strike
during compute, saves and restores alike; a restore from level ``k`` that is hit by a
failure of severity below ``k`` starts again, one of severity ``k`` or ``k + 1`` falls
back to level ``k + 1`` and a worse one to its own level (at the top level every failure
restarts the top-level restore).

A schedule is ``t``, the compute seconds between two checkpoints, and counts ``v_k``:
how many level-``k`` checkpoints are taken before the next checkpoint of level ``k + 1``.
So one period between top-level checkpoints holds ``prod(v_k + 1)`` compute segments.
Efficiency is that useful compute over the period's expected wall time. With one level it
is Daly's exponential model exactly (``formulas.efficiency``).

The arithmetic composes *phases*: a stretch of work that ends either in success (with a
probability and an expected duration) or in a failure of each severity (probability and
expected time until it). Segments compose in sequence and in repetition, and a stretch
protected by a level-``k`` checkpoint absorbs failures of severity ``<= k`` by restoring
and retrying. Pure floats; a schedule costs microseconds, so the optimum is a search.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

from ckptbench.cadence.formulas import non_negative, positive
from ckptbench.cadence.phases import Phase
from ckptbench.cadence.phases import exposed as _exposed
from ckptbench.cadence.phases import repeat as _repeat
from ckptbench.cadence.phases import then as _then
from ckptbench.errors import SpecError

MAX_LEVELS = 6
MAX_COUNT = 10_000  # level-k checkpoints per level-(k+1) checkpoint


class Hopeless(ArithmeticError):
    """A schedule whose expected time is infinite in floating point (efficiency 0)."""


@dataclass(frozen=True)
class Level:
    """One checkpoint level: what a save blocks and what a restore from it takes (s).

    An asynchronous level also has a persist (``persist_s``: after the blocking part, the
    copy is written in the background and counts only once it is done) and the
    ``interference`` it causes (training steps run that much slower meanwhile). As in the
    one-level cadence (``cadence.answer.CheckpointCost``), the model charges the slowdown
    to the save (``L i / (1 + i)``), a failure inside the persist window to the restore
    (``+ L``: it falls back one checkpoint), and one persist in flight at a time bounds
    the level's interval from below (``>= L``).
    """

    name: str
    save_s: float
    restore_s: float
    persist_s: float = 0.0
    interference: float = 0.0

    @property
    def charged_save_s(self) -> float:
        return self.save_s + self.persist_s * self.interference / (1.0 + self.interference)

    @property
    def charged_restore_s(self) -> float:
        return self.restore_s + self.persist_s


@dataclass(frozen=True)
class Schedule:
    """Compute seconds between checkpoints, and level-k saves per level-(k+1) save."""

    compute_s: float
    counts: tuple[int, ...]  # v_1 .. v_{L-1}

    @property
    def segments(self) -> int:
        """Compute segments in one period between two top-level checkpoints."""
        return math.prod(v + 1 for v in self.counts)


def _weighted(p: Sequence[float], t: Sequence[float]) -> tuple[float, float]:
    total = sum(p)
    return total, (sum(pi * ti for pi, ti in zip(p, t, strict=True)) / total if total > 0
                   else 0.0)


def _protect(work: Phase, k: int, restore: Phase, top: int) -> Phase:
    """``work`` guarded by a level-k checkpoint at its start: a failure of severity <= k
    restores from level k (retrying the restore after lesser failures) and redoes the
    work; a restore hit by severity k (below the top) or k + 1 falls back to level k + 1."""
    levels = len(work.p_fail) - 1
    p_retry, t_retry = _weighted(restore.p_fail[1:(k if k == top else k - 1) + 1],
                                 restore.t_fail[1:(k if k == top else k - 1) + 1])
    if p_retry >= 1.0:
        raise Hopeless(f"level {k}'s restore never finishes: failures strike faster")
    again = p_retry / (1.0 - p_retry)  # expected restarts of a restore that succeeds
    p_restored = restore.p_ok / (1.0 - p_retry)
    t_restored = restore.t_ok + again * t_retry
    # a restore that falls back: to level k + 1 (severity k or k + 1), or to its own level
    esc_p = [0.0] * (levels + 1)
    esc_t = [0.0] * (levels + 1)
    for i in range(k + 1, levels + 1):
        own = restore.p_fail[i] + (restore.p_fail[k] if i == k + 1 else 0.0)
        if own > 0:
            mean = restore.p_fail[i] * restore.t_fail[i]
            if i == k + 1:
                mean += restore.p_fail[k] * restore.t_fail[k]
            esc_p[i] = own / (1.0 - p_retry)
            esc_t[i] = mean / own + again * t_retry
    p_down, t_down = _weighted(work.p_fail[1:k + 1], work.t_fail[1:k + 1])
    loop = p_down * p_restored  # one more try of the work
    if loop >= 1.0:
        raise Hopeless(f"the work guarded by level {k} never finishes: failures strike faster")
    detour = loop / (1.0 - loop) * (t_down + t_restored)
    p_fail, t_fail = [0.0] * (levels + 1), [0.0] * (levels + 1)
    for i in range(k + 1, levels + 1):
        p = work.p_fail[i] + p_down * esc_p[i]
        if p > 0:
            p_fail[i] = p / (1.0 - loop)
            t_fail[i] = (work.p_fail[i] * work.t_fail[i]
                         + p_down * esc_p[i] * (t_down + esc_t[i])) / p + detour
    return Phase(work.p_ok / (1.0 - loop), work.t_ok + detour, tuple(p_fail), tuple(t_fail))


def _check(levels: Sequence[Level], rates: Sequence[float], schedule: Schedule) -> None:
    if not 1 <= len(levels) <= MAX_LEVELS:
        raise SpecError(f"levels: {len(levels)} given; allowed: 1 to {MAX_LEVELS}")
    if len(rates) != len(levels):
        raise SpecError(f"failure rates: {len(rates)} given for {len(levels)} levels; allowed: "
                        "one rate per level (the failures that level is the first to survive)")
    for level in levels:
        non_negative(f"level {level.name} save_s", level.save_s)
        non_negative(f"level {level.name} restore_s", level.restore_s)
        non_negative(f"level {level.name} persist_s", level.persist_s)
        non_negative(f"level {level.name} interference", level.interference)
    for i, rate in enumerate(rates, 1):
        non_negative(f"failure rate of severity {i}", rate)
    positive("compute_s", schedule.compute_s)
    if len(schedule.counts) != len(levels) - 1:
        raise SpecError(f"counts: {len(schedule.counts)} given; allowed: one per level below "
                        f"the top ({len(levels) - 1})")
    for k, v in enumerate(schedule.counts, 1):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNT:
            raise SpecError(f"count of level {k} = {v!r}; allowed: an integer 0 to {MAX_COUNT}")


def check_runnable(levels: Sequence[Level], schedule: Schedule) -> None:
    """Refuse a schedule that cannot run: one persist of a level in flight at a time, so a
    level's interval (compute between its checkpoints) must be at least its persist."""
    segments = 1
    for k, level in enumerate(levels):
        interval = schedule.compute_s * segments
        if interval < level.persist_s:
            raise SpecError(
                f"schedule: level {level.name} is saved every {interval:.4g} s of compute, "
                f"shorter than its persist of {level.persist_s:.4g} s; allowed: an interval "
                "of at least the persist (one persist in flight at a time): a longer time "
                "between checkpoints or more checkpoints below that level")
        if k < len(schedule.counts):
            segments *= schedule.counts[k] + 1


def period_seconds(levels: Sequence[Level], rates: Sequence[float],
                   schedule: Schedule) -> float:
    """Expected wall seconds of one period between top-level checkpoints."""
    _check(levels, rates, schedule)
    top = len(levels)
    padded = (0.0, *map(float, rates))
    t = schedule.compute_s
    v = (0, *schedule.counts, 1)
    restores = [_exposed(lv.charged_restore_s, padded) for lv in levels]

    @cache
    def unprotected(k: int, c: int) -> Phase:
        """From the latest level-k checkpoint to a level-c one, failures not yet absorbed."""
        if k == 1:
            return _exposed(t + levels[c - 1].charged_save_s, padded)
        if v[k - 1] == 0:
            return unprotected(k - 1, c)
        rest = _then(_repeat(protected(k - 1, k - 1), v[k - 1] - 1), protected(k - 1, c))
        return _then(unprotected(k - 1, k - 1), rest)

    @cache
    def protected(k: int, c: int) -> Phase:
        return _protect(unprotected(k, c), k, restores[k - 1], top)

    period: float = protected(top, top).t_ok
    return period


def efficiency(levels: Sequence[Level], rates: Sequence[float], schedule: Schedule) -> float:
    """Useful compute over expected wall time, in [0, 1]; 0 where a level's interval is
    shorter than its persist (one persist in flight at a time)."""
    _check(levels, rates, schedule)
    segments = 1
    for k, level in enumerate(levels):
        if schedule.compute_s * segments < level.persist_s:
            return 0.0
        if k < len(schedule.counts):
            segments *= schedule.counts[k] + 1
    try:
        period = period_seconds(levels, rates, schedule)
    except Hopeless:
        return 0.0
    return schedule.segments * schedule.compute_s / period if period > 0 else 0.0


@dataclass(frozen=True)
class Optimum:
    schedule: Schedule
    efficiency: float


Score = Callable[[Schedule], float]


def _best_compute(levels: Sequence[Level], score_of: Score, counts: tuple[int, ...],
                  lo: float, hi: float) -> Optimum:
    """Golden-section search of log(t) for one set of counts (efficiency is unimodal in t
    above the floor the persists set: level k's interval, t times its segments, >= L_k)."""
    segments = [math.prod(v + 1 for v in counts[:k]) for k in range(len(levels))]
    floor = max(lv.persist_s / n for lv, n in zip(levels, segments, strict=True))
    lo = max(lo, floor * (1.0 + 1e-12))
    hi = max(hi, lo * 10.0)

    def score(log_t: float) -> float:
        try:
            return score_of(Schedule(math.exp(log_t), counts))
        except (Hopeless, OverflowError, ZeroDivisionError):
            return 0.0

    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5.0) - 1.0) / 2.0
    x1, x2 = b - g * (b - a), a + g * (b - a)
    f1, f2 = score(x1), score(x2)
    for _ in range(80):
        if f1 < f2:
            a, x1, f1 = x1, x2, f2
            x2 = a + g * (b - a)
            f2 = score(x2)
        else:
            b, x2, f2 = x2, x1, f1
            x1 = b - g * (b - a)
            f1 = score(x1)
        if b - a < 1e-9:
            break
    log_t = (a + b) / 2.0
    return Optimum(Schedule(math.exp(log_t), counts), score(log_t))


def search(levels: Sequence[Level], score_of: Score, total_rate: float,
           max_count: int = 200) -> Optimum:
    """The schedule of highest ``score_of`` (an efficiency): t by golden section for each
    set of counts, counts by a coarse grid and then integer steps of one from the best of
    it. Both models (SCR's rules here, the stated rules in ``scoped``) search this way."""
    if total_rate == 0:
        raise SpecError("failure rates are all 0: without failures no checkpoint pays off")
    lo = 1e-3 * max(1.0, min((lv.save_s for lv in levels), default=1.0))
    hi = 100.0 / total_rate
    memo: dict[tuple[int, ...], Optimum] = {}

    def at(counts: tuple[int, ...]) -> Optimum:
        if counts not in memo:
            memo[counts] = _best_compute(levels, score_of, counts, lo, hi)
        return memo[counts]

    coarse = sorted({0, 1, 2, 3, 5, 8, 12, 20, 30, 50, 80, 120, max_count} - {
        c for c in range(max_count + 1, 10**6)})
    grid: list[tuple[int, ...]] = [()]
    for _ in levels[:-1]:
        grid = [(*g, c) for g in grid for c in coarse]
    best = max((at(g) for g in grid), key=lambda o: o.efficiency)
    improved = True
    while improved:
        improved = False
        for k in range(len(levels) - 1):
            for step in (-1, 1):
                counts = list(best.schedule.counts)
                counts[k] += step
                if 0 <= counts[k] <= max_count:
                    candidate = at(tuple(counts))
                    if candidate.efficiency > best.efficiency + 1e-15:
                        best, improved = candidate, True
    return best


def optimum(levels: Sequence[Level], rates: Sequence[float],
            max_count: int = 200) -> Optimum:
    """The schedule of highest efficiency under SCR's rules (:func:`search`)."""
    _check(levels, rates, Schedule(1.0, (0,) * (len(levels) - 1)))
    return search(levels, lambda s: efficiency(levels, rates, s), sum(rates), max_count)


@dataclass(frozen=True)
class LevelsAnswer:
    """The multi-level answer: per-level failure rates, the best schedule, the storage-only
    optimum for comparison, and the schedule the user named (if any)."""

    levels: tuple[Level, ...]
    rates: tuple[float, ...]
    best: Optimum
    last_level_only: Optimum
    named: Optimum | None

    def to_dict(self) -> dict[str, object]:
        def point(o: Optimum | None) -> dict[str, object] | None:
            return None if o is None else {"compute_s": o.schedule.compute_s,
                                           "counts": list(o.schedule.counts),
                                           "efficiency": o.efficiency}
        return {"levels": [{"name": lv.name, "save_s": lv.save_s, "restore_s": lv.restore_s,
                            "persist_s": lv.persist_s, "interference": lv.interference,
                            "failure_rate_per_s": r}
                           for lv, r in zip(self.levels, self.rates, strict=True)],
                "optimum": point(self.best), "last_level_only": point(self.last_level_only),
                "schedule": point(self.named)}


def answer(levels: Sequence[Level], rates: Sequence[float], named: Schedule | None = None,
           alone: Level | None = None) -> LevelsAnswer:
    """The optimum schedule, the last level alone (every failure restored from it: `alone`
    if its restore differs then), and the efficiency of the schedule given."""
    best = optimum(levels, rates)
    alone_best = optimum([alone or levels[-1]], [sum(rates)])
    mine = None if named is None else Optimum(named, efficiency(levels, rates, named))
    return LevelsAnswer(tuple(levels), tuple(rates), best, alone_best, mine)


def level_curves(levels: Sequence[Level], score: Score, best: Optimum,
                 points: int = 60) -> dict[str, list[tuple[float, float]]]:
    """Efficiency against each level's interval, the others held at the optimum: the
    first level's interval is t (varied continuously), level k's is t times the segments
    between its checkpoints (varied through the count below it)."""
    t, counts = best.schedule.compute_s, best.schedule.counts
    out: dict[str, list[tuple[float, float]]] = {}
    first = []
    for i in range(points):
        ti = t * 10 ** (-1.0 + 2.0 * i / (points - 1))  # a tenth to ten times the optimum
        first.append((ti, score(Schedule(ti, counts))))
    out[levels[0].name] = first
    for k in range(1, len(levels)):
        curve = []
        for v in sorted({0, *range(max(0, counts[k - 1] // 4), 4 * counts[k - 1] + 3)}):
            trial = Schedule(t, (*counts[:k - 1], v, *counts[k:]))
            segments = math.prod(c + 1 for c in trial.counts[:k])
            curve.append((t * segments, score(trial)))
        out[levels[k].name] = curve
    return out
