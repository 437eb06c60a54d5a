"""The stated rules of recovery (docs/cadence.md, "The rules"), computed exactly.

A failure restarts the job by the mechanism of *its own* scope and restores from the
newest copy that survived it; a copy survives every failure within its scope (a second
crashed process does not fall back from node memory); a checkpoint of a higher level
also leaves the copies of the levels below it. Failures are counted by scope, not drawn
per node (a node failure never takes a peer copy: `simulate` plays the node draws out),
and are exponential; an infinite run.

How it is computed: the periodic schedule is composed stretch by stretch, as SCR's model
is (``multilevel``): the work from a level-k checkpoint to the next one of level >= c,
failures the stretch's inner checkpoints absorb already absorbed, is a :class:`Phase`
whose failure exits are *kinds* (the level a failure needs, the restart it pays). At the
stretch's start, a level-k checkpoint, a failure needing level n <= k rolls back to it
and restores the level-n copy there; this is a small absorbing Markov chain, solved
exactly: the attempt states (first try, or a retry after a restore from level m, which
left the levels below m without a copy until the next save) and the restore states
(reading level m after a restart of kind e; a failure during it that the copy survives
restarts the same restore, one that takes the copy moves to the level it needs, one
needing a level above k leaves the stretch for the stretch that holds that level).

Times may be numpy vectors: then each second is counted by what it was spent on
(compute, blocking save, and per kind: restart, restore, rework), which gives the loss by
cause and by kind of one period exactly (:func:`breakdown`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptbench.cadence.formulas import non_negative
from ckptbench.cadence.multilevel import (
    MAX_LEVELS,
    Hopeless,
    Level,
    Optimum,
    Schedule,
    check_runnable,
    search,
)
from ckptbench.cadence.phases import Phase, Time, exposed, repeat, then
from ckptbench.errors import SpecError


@dataclass(frozen=True)
class Kind:
    """Failures as the model sees them: a rate (1/s), the cheapest level that survives
    them (0-based), and the restart their scope's mechanism takes (s)."""

    rate_per_s: float
    need: int
    restart_s: float


def merged(kinds: Sequence[Kind]) -> tuple[list[Kind], list[int]]:
    """Kinds that need the same level and pay the same restart, added up (the model cannot
    tell them apart); and for each kind given, the merged one it went into."""
    index: dict[tuple[int, float], int] = {}
    out: list[Kind] = []
    where = []
    for k in kinds:
        key = (k.need, k.restart_s)
        if key not in index:
            index[key] = len(out)
            out.append(Kind(0.0, k.need, k.restart_s))
        i = index[key]
        out[i] = Kind(out[i].rate_per_s + k.rate_per_s, k.need, k.restart_s)
        where.append(i)
    return out, where


def _check(levels: Sequence[Level], kinds: Sequence[Kind]) -> None:
    if not 1 <= len(levels) <= MAX_LEVELS:
        raise SpecError(f"levels: {len(levels)} given; allowed: 1 to {MAX_LEVELS}")
    for level in levels:
        for field in ("save_s", "restore_s", "persist_s", "interference"):
            value = non_negative(f"level {level.name} {field}", getattr(level, field))
            if not math.isfinite(value):
                raise SpecError(f"level {level.name} {field} = {value}; allowed: finite")
    for k in kinds:
        if not 0 <= k.need < len(levels):
            raise SpecError(f"a failure kind needs level {k.need + 1} of {len(levels)}")
        non_negative("failure rate", k.rate_per_s)
        non_negative("restart seconds", k.restart_s)


class _Recovery:
    """What follows a rollback, for one set of levels and kinds (schedules share it): for
    each stretch level k and each restore state (reading level m after a restart of kind
    e), how the restore ends: done at level m' (the job computes again, levels below m'
    without a copy) or leaving the stretch with a failure of a kind needing more than k;
    with the expected time to each end. ``vector``: times split by category (compute,
    blocking, then per kind restart, restore, rework)."""

    def __init__(self, levels: Sequence[Level], kinds: Sequence[Kind], vector: bool) -> None:
        self.levels, self.kinds = levels, kinds
        self.rates = tuple(k.rate_per_s for k in kinds)
        self.need = tuple(k.need + 1 for k in kinds)  # 1-based, as the levels below
        self.vector = vector
        self.width = 2 + 3 * len(kinds) if vector else 0
        self.zero: Time = np.zeros(self.width) if vector else 0.0
        self.ends: dict[int, dict[tuple[int, int], tuple[list[float], list[Time]]]] = {}

    def unit(self, index: int) -> Time:
        if not self.vector:
            return 1.0
        u = np.zeros(self.width)
        u[index] = 1.0
        return u

    def rework(self, time: Time, e: int) -> Time:
        """The compute and saves of an attempt a rollback undid: rework of kind e."""
        if not self.vector:
            return time
        out = np.array(time, dtype=float)
        out[4 + 3 * e] += out[0] + out[1]
        out[0] = out[1] = 0.0
        return out

    def exits(self, k: int) -> list[int]:
        """The kinds that leave a level-k stretch (they need a level above k)."""
        return [e for e in range(len(self.kinds)) if self.need[e] > k]

    def restore_ends(self, k: int) -> dict[tuple[int, int], tuple[list[float], list[Time]]]:
        """Per restore state (m, e) of a level-k stretch: the probability of each end and
        the expected time on the way to it; ends: done at level 1..k (index m' - 1), then
        the exits (index k + i)."""
        if k in self.ends:
            return self.ends[k]
        kinds = range(len(self.kinds))
        exits = self.exits(k)
        slot = {e: k + i for i, e in enumerate(exits)}
        width = k + len(exits)
        states = [(m, e) for m in range(1, k + 1) for e in kinds if self.need[e] <= m]
        moves = []
        for m, e in states:
            phase = then(exposed(self.kinds[e].restart_s, self.rates, self.unit(2 + 3 * e)),
                         exposed(self.levels[m - 1].charged_restore_s, self.rates,
                                 self.unit(3 + 3 * e)))
            out: list[tuple[float, Time, Any]] = [(phase.p_ok, phase.t_ok, ("end", m - 1))]
            for f in kinds:
                p, t = phase.p_fail[f], phase.t_fail[f]
                if p > 0.0:
                    n = self.need[f]
                    out.append((p, t, ("end", slot[f]) if n > k else (max(n, m), f)))
            moves.append(out)

        def value(target: Any) -> tuple[list[float], list[Time]]:
            h = [0.0] * width
            h[target[1]] = 1.0
            return h, [self.zero] * width

        self.ends[k] = _solve(states, moves, value, width, self.zero)
        return self.ends[k]


class _Model:
    """One schedule's periodic arithmetic over a shared :class:`_Recovery`."""

    def __init__(self, recovery: _Recovery, schedule: Schedule) -> None:
        self.r, self.t = recovery, schedule.compute_s
        self.top = len(recovery.levels)
        self.v = (0, *schedule.counts, 1)
        self.memo: dict[tuple[str, int, int], Phase] = {}

    def unprotected(self, k: int, c: int) -> Phase:
        """From a level-k checkpoint to a level-c one, failures not yet absorbed."""
        key = ("u", k, c)
        if key not in self.memo:
            r = self.r
            if k == 1:
                phase = then(exposed(self.t, r.rates, r.unit(0)),
                             exposed(r.levels[c - 1].charged_save_s, r.rates, r.unit(1)))
            elif self.v[k - 1] == 0:
                phase = self.unprotected(k - 1, c)
            else:
                rest = then(repeat(self.protected(k - 1, k - 1), self.v[k - 1] - 1),
                            self.protected(k - 1, c))
                phase = then(self.unprotected(k - 1, k - 1), rest)
            self.memo[key] = phase
        return self.memo[key]

    def protected(self, k: int, c: int) -> Phase:
        key = ("p", k, c)
        if key not in self.memo:
            self.memo[key] = self.protect(self.unprotected(k, c), k)
        return self.memo[key]

    def protect(self, work: Phase, k: int) -> Phase:
        """``work`` from a level-k checkpoint, its rollbacks to that checkpoint absorbed:
        attempt states 0 (the first try, every level below k holding a copy there) and
        m = 1..k (a retry after a restore from level m); a rollback needing level n reads
        level max(n, m). Attempts only move up, so back-substitution from k solves them."""
        r = self.r
        ends = r.restore_ends(k)
        exits = r.exits(k)
        width = 1 + len(exits)  # 0: the work succeeds; then the exits
        zero = r.zero
        # a restore's exit i (ends index k + i) is the stretch's outcome 1 + i
        h_a: dict[int, list[float]] = {}
        g_a: dict[int, list[Time]] = {}
        direct_h = [0.0] * width
        direct_g: list[Time] = [zero] * width
        direct_h[0], direct_g[0] = work.p_ok, work.p_ok * work.t_ok
        for i, e in enumerate(exits):
            direct_h[1 + i] = work.p_fail[e]
            direct_g[1 + i] = work.p_fail[e] * work.t_fail[e]
        rollbacks = [(e, work.p_fail[e], r.rework(work.t_fail[e], e))
                     for e in range(len(r.kinds)) if r.need[e] <= k and work.p_fail[e] > 0]
        for m in range(k, -1, -1):
            h = list(direct_h)
            g = list(direct_g)
            loop = 0.0
            loop_g: Time = zero
            for e, p, t in rollbacks:
                eh, eg = ends[(max(r.need[e], m), e)]
                for j in range(k):  # done at level j + 1: the attempt state j + 1
                    q = eh[j]
                    if q <= 0.0:
                        continue
                    mj = j + 1
                    if mj == m:
                        loop += p * q
                        loop_g = loop_g + p * (t * q + eg[j])
                        continue
                    for a in range(width):
                        h[a] += p * q * h_a[mj][a]
                        g[a] = g[a] + p * ((t * q + eg[j]) * h_a[mj][a] + q * g_a[mj][a])
                for i in range(len(exits)):
                    q = eh[k + i]
                    h[1 + i] += p * q
                    g[1 + i] = g[1 + i] + p * (t * q + eg[k + i])
            if loop > 0.0:
                if loop >= 1.0:
                    raise Hopeless(f"the work guarded by level {k} never finishes: failures "
                                   "strike faster")
                h = [x / (1.0 - loop) for x in h]
                g = [(y + loop_g * x) / (1.0 - loop) for x, y in zip(h, g, strict=True)]
            h_a[m], g_a[m] = h, g
        h, g = h_a[0], g_a[0]
        if h[0] <= 0.0:
            raise Hopeless(f"the work guarded by level {k} never finishes: failures strike "
                           "faster")
        p_fail: list[float] = [0.0] * len(r.kinds)
        t_fail: list[Time] = [zero] * len(r.kinds)
        for i, e in enumerate(exits):
            p_fail[e] = h[1 + i]
            t_fail[e] = g[1 + i] / h[1 + i] if h[1 + i] > 0 else zero
        return Phase(h[0], g[0] / h[0], tuple(p_fail), tuple(t_fail))

    def period(self) -> Time:
        """Expected wall time of one period between top-level checkpoints."""
        return self.protected(self.top, self.top).t_ok


def _solve(states: list[tuple[Any, ...]], moves: list[list[tuple[float, Time, tuple[Any, ...]]]],
           value: Callable[[tuple[Any, ...]], tuple[list[float], list[Time]]], width: int,
           zero: Time) -> dict[tuple[Any, ...], tuple[list[float], list[Time]]]:
    """First-step equations of a block of transient states whose other targets are known:
    the probability of ending in each absorbing outcome (h) and the expected time spent
    on the way, per outcome (g), by Gaussian elimination (the matrix is diagonally
    dominant: every state leaves the block with some probability)."""
    n = len(states)
    pos = {s: i for i, s in enumerate(states)}
    q = [[0.0] * n for _ in range(n)]
    rhs_h = [[0.0] * width for _ in range(n)]
    for i, out in enumerate(moves):
        for p, _, target in out:
            j = pos.get(target)
            if j is not None:
                q[i][j] += p
            else:
                th, _ = value(target)
                for a in range(width):
                    rhs_h[i][a] += p * th[a]
    h = _eliminate(q, rhs_h)
    rhs_g: list[list[Time]] = [[zero] * width for _ in range(n)]
    for i, out in enumerate(moves):
        for p, t, target in out:
            j = pos.get(target)
            th, tg = (h[j], None) if j is not None else value(target)
            for a in range(width):
                rhs_g[i][a] = rhs_g[i][a] + p * (t * th[a] + (0.0 if tg is None else tg[a]))
    g = _eliminate(q, rhs_g)
    return {s: (h[i], g[i]) for i, s in enumerate(states)}


def _eliminate(q: list[list[float]], rhs: list[list[Any]]) -> list[list[Any]]:
    """Solve (I - q) x = rhs for x (rows of values: floats or vectors)."""
    n = len(q)
    a = [[(1.0 if i == j else 0.0) - q[i][j] for j in range(n)] for i in range(n)]
    b = [list(row) for row in rhs]
    for c in range(n):
        pivot = a[c][c]
        if not pivot > 0.0:
            raise Hopeless("a restore never finishes: failures strike faster")
        for r in range(c + 1, n):
            f = a[r][c] / pivot
            if f == 0.0:
                continue
            for j in range(c, n):
                a[r][j] -= f * a[c][j]
            b[r] = [x - f * y for x, y in zip(b[r], b[c], strict=True)]
    x: list[list[Any]] = [[] for _ in range(n)]
    for r in range(n - 1, -1, -1):
        row = b[r]
        for j in range(r + 1, n):
            if a[r][j] != 0.0:
                row = [u - a[r][j] * w for u, w in zip(row, x[j], strict=True)]
        x[r] = [u / a[r][r] for u in row]
    return x


def efficiency(levels: Sequence[Level], kinds: Sequence[Kind], schedule: Schedule) -> float:
    """Useful compute over expected wall time under the stated rules, in [0, 1]; 0 where
    failures strike faster than the work can finish. A schedule that cannot run (a level's
    interval shorter than its persist) is refused (SpecError)."""
    _check(levels, kinds)
    check_runnable(levels, schedule)
    types, _ = merged(kinds)
    return _efficiency(_Recovery(levels, types, vector=False), schedule)


def _efficiency(recovery: _Recovery, schedule: Schedule) -> float:
    work = schedule.segments * schedule.compute_s
    if not any(rate > 0 for rate in recovery.rates):
        return work / (work + _saves_per_period(recovery.levels, schedule))
    try:
        period = _Model(recovery, schedule).period()
    except (Hopeless, OverflowError, ZeroDivisionError):
        return 0.0
    return min(1.0, max(0.0, work / period)) if period > 0 and math.isfinite(period) else 0.0


def _saves_per_period(levels: Sequence[Level], schedule: Schedule) -> float:
    """Blocking seconds of the saves of one period (each segment ends with the highest
    level due)."""
    total, period = 0.0, 1
    periods = [1]
    for v in schedule.counts:
        period *= v + 1
        periods.append(period)
    segments = periods[-1]
    for k, level in enumerate(levels):
        # segments ending with level k: multiples of periods[k] that are not of periods[k+1]
        count = segments // periods[k] - (segments // periods[k + 1] if k + 1 < len(levels)
                                          else 0)
        total += count * level.charged_save_s
    return total


def optimum(levels: Sequence[Level], kinds: Sequence[Kind], max_count: int = 200) -> Optimum:
    """The schedule of highest efficiency under the stated rules."""
    _check(levels, kinds)
    types, _ = merged(kinds)
    recovery = _Recovery(levels, types, vector=False)
    return search(levels, lambda s: _efficiency(recovery, s),
                  math.fsum(k.rate_per_s for k in types), max_count)


@dataclass(frozen=True)
class Breakdown:
    """Where one period's expected wall time goes, as shares of it: useful compute,
    blocking saves, and per cause the time lost, in total and per kind given."""

    efficiency: float
    blocking: float
    rework: float
    restart: float
    restore: float
    by_kind: tuple[dict[str, float], ...]  # per kind given: rework, restart, restore

    def to_dict(self) -> dict[str, Any]:
        return {"efficiency": self.efficiency, "blocking": self.blocking, "rework": self.rework,
                "restart": self.restart, "restore": self.restore}


def breakdown(levels: Sequence[Level], kinds: Sequence[Kind], schedule: Schedule) -> Breakdown:
    """The loss by cause and by kind at a schedule (kinds merged by the model are split
    by their rates)."""
    _check(levels, kinds)
    check_runnable(levels, schedule)
    types, where = merged(kinds)
    if not any(k.rate_per_s > 0 for k in types):
        eff = efficiency(levels, kinds, schedule)
        return Breakdown(eff, 1.0 - eff, 0.0, 0.0, 0.0,
                         tuple({"rework": 0.0, "restart": 0.0, "restore": 0.0} for _ in kinds))
    try:
        recovery = _Recovery(levels, types, vector=True)
        period = np.asarray(_Model(recovery, schedule).period(), dtype=float)
    except (Hopeless, OverflowError, ZeroDivisionError):
        return Breakdown(0.0, 0.0, 1.0, 0.0, 0.0,
                         tuple({"rework": math.nan, "restart": math.nan, "restore": math.nan}
                               for _ in kinds))
    share = period / period.sum()
    per_type = [{"restart": float(share[2 + 3 * e]), "restore": float(share[3 + 3 * e]),
                 "rework": float(share[4 + 3 * e])} for e in range(len(types))]
    by_kind = []
    for k, e in zip(kinds, where, strict=True):
        part = k.rate_per_s / types[e].rate_per_s if types[e].rate_per_s > 0 else 0.0
        by_kind.append({cause: part * v for cause, v in per_type[e].items()})
    return Breakdown(float(share[0]), float(share[1]),
                     float(sum(p["rework"] for p in per_type)),
                     float(sum(p["restart"] for p in per_type)),
                     float(sum(p["restore"] for p in per_type)), tuple(by_kind))
