"""A whole training run simulated under the stated recovery rules, many replicas at once.

``docs/cadence.md`` states the rules a job goes through (1-7 under "The rules"); this
module plays them out event by event over a finite run (say Llama 3's 54 days), for many
replicas in lockstep (numpy arrays, one event per replica per iteration: a failure or a
restore that completes). It shares no code with the closed-form model
(``cadence.multilevel``, ``cadence.scoped``) beyond the input types, so that the two can
check each other. It gives the spread of goodput and not only its mean, takes failures
that are not exponential (Weibull gaps per class), and tells where the time went.

The rules, as played here:

- *Schedule.* Segment j (j = 1, 2, ...) is ``t`` seconds of compute, then the blocking
  save of level ``L(j)``, the highest k with j divisible by ``(v_1+1)...(v_k+1)`` (level 0
  every segment). Position p is the checkpoint at the end of segment p; position 0 is
  the run start, a checkpoint every level holds. A save leaves a copy of its checkpoint
  at its level and every level below it.
- *Asynchronous levels* (``persist_s`` L > 0, ``interference`` i): a level's copy counts
  at the end of the blocking save that left it plus the level's own persist (a
  synchronous level's at the end of the blocking). Until then the level keeps its
  previous copy; a failure before then loses the new one (the persist dies with the
  processes). The compute right after an asynchronous save takes ``L i / (1 + i)``
  longer, except right after the start or a restore.
- *Copies.* Each level holds one copy, its newest counted. Level scope ``process``: node
  n's part on n only, so any node taken loses the copy; ``node``: on n and n+1 .. n+K (mod
  the node count N, K = ``Topology.peer_replicas``); ``group``: on n and n + jG (mod N,
  j = 1..K, G = ``Topology.group_nodes``); ``job``: never lost. A copy is lost once some
  node and all its holders have been taken since it was written.
- *Failures.* Each class is a renewal process of Weibull gaps of mean ``1/rate`` (shape 1:
  exponential; then the classes share one clock and a failure's class is drawn), from
  time 0, striking during compute, saves, restarts and restores alike. ``process`` takes
  no node; ``node`` takes one node drawn at random; ``group`` one aligned block of G
  consecutive nodes drawn at random (the last block may be short); ``job`` every node.
- *Restart, restore.* At a failure the job restarts by that failure's ``restart_s``, then
  restores from the newest checkpoint a surviving copy holds (a tie: the cheapest level)
  in that level's ``restore_s`` (times ``reshard_factor`` when the failure found no spare,
  drawn with the class's ``no_spare``; a restore started again keeps that layout). A
  failure during a restart or restore does the same again with its own restart: the same
  copy when it survived. After the restore, compute resumes at the restored position;
  lost copies stay lost until their level's (or a higher level's) next save.
- *Accounting.* Useful: ``t`` per segment the final timeline keeps, plus the partial
  segment's compute at the end (at most ``t``). Blocking: the rest of the final timeline
  (saves, slowdown). Rework: the time a rollback undid, from the moment the run first
  reached the restored position to the failure, charged to the class that rolled back.
  Restart and restore time is charged to the class whose failure began that restart; at
  the end of the run a restart or restore cut off counts as such.

Between two events the timeline is deterministic, so the run steps from failure to
failure, never checkpoint by checkpoint: the time a position is reached is a closed sum
over the schedule's levels, inverted level by level. The nodes taken since a copy was
written are kept per replica and level as a short list of node intervals
(``CAPACITY``); a copy whose list is full when another node is taken is treated as lost,
and counted (``Simulated.overflowed``). Where no copy survives at all (possible only
when the last level is narrower than ``job``), the job restores from the run start, at
the last level's restore cost (counted in ``Simulated.from_start`` and, when completed,
under the last level's name).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ckptbench.cadence.classes import SCOPES
from ckptbench.cadence.formulas import non_negative, positive
from ckptbench.cadence.multilevel import Level, Schedule
from ckptbench.errors import SpecError

MAX_REPLICAS = 100_000
# replica-events, each iteration counted as ITERATION_COST replicas more (about a minute)
MAX_WORK = 300_000_000
ITERATION_COST = 1000
MAX_CLOCKS = 20_000_000  # replicas x classes, where each class has a clock of its own
MAX_SEGMENTS = 1e15  # positions stay exact in float arithmetic
CAPACITY = 16  # node intervals taken since a copy was written, per replica and level
MIN_SHAPE, MAX_SHAPE = 0.2, 10.0
Z99 = 2.5758293035489004  # two-sided 99 % normal quantile
SECONDS_PER_DAY = 86400.0
_PROCESS, _NODE, _GROUP, _JOB = (SCOPES.index(s) for s in ("process", "node", "group", "job"))


def _int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise SpecError(f"{name} = {value!r}: allowed: an integer >= {low}")
    return int(value)


@dataclass(frozen=True)
class Failures:
    """One failure class: its rate for the whole job (1/s), its scope, the seconds of the
    restart that follows it, and the share of its failures that find no spare."""

    name: str
    rate_per_s: float
    scope: str
    restart_s: float
    no_spare: float = 0.0

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise SpecError(f"failure class {self.name}: scope {self.scope!r} is not known; "
                            f"allowed: {', '.join(SCOPES)}")
        non_negative(f"failure class {self.name} rate", self.rate_per_s)
        non_negative(f"failure class {self.name} restart", self.restart_s)
        if not 0.0 <= self.no_spare <= 1.0:
            raise SpecError(f"failure class {self.name}: the share without a spare "
                            f"{self.no_spare:g} is not a probability; allowed: 0 to 1")


@dataclass(frozen=True)
class Topology:
    """The job's nodes, the nodes a group failure takes, and K, the holders of a node- or
    group-scope level's part."""

    nodes: int
    group_nodes: int = 32
    peer_replicas: int = 1

    def __post_init__(self) -> None:
        for name, value in (("nodes", self.nodes), ("--group-nodes", self.group_nodes),
                            ("--peer-replicas", self.peer_replicas)):
            _int(name, value, 1)


@dataclass(frozen=True)
class Simulated:
    """Goodput over replicas, and the share of wall time each cause took (means)."""

    replicas: int
    wall_s: float
    goodput: tuple[float, ...]  # one per replica: useful compute / wall
    blocking: float
    rework: float
    restart: float
    restore: float
    # per class: rework, restart, restore (shares of wall time), failures_per_day
    by_class: dict[str, dict[str, float]]
    failures_per_replica: float
    restores_by_level: dict[str, int]  # restores completed, by the level read
    # per replica: blocking, rework, restart, restore, shares of its wall time
    lost_by_replica: dict[str, tuple[float, ...]]
    overflowed: int = 0  # copies treated as lost: their list of taken nodes was full
    from_start: int = 0  # rollbacks to the run start: no copy survived

    @property
    def mean(self) -> float:
        return float(np.mean(self.goodput))

    @property
    def stderr(self) -> float:
        n = len(self.goodput)
        return float(np.std(self.goodput, ddof=1)) / math.sqrt(n) if n > 1 else math.inf

    @property
    def ci99(self) -> float:
        """Half-width of the 99 % confidence interval of the mean."""
        return Z99 * self.stderr

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.goodput, q))

    def to_dict(self) -> dict[str, object]:
        return {"replicas": self.replicas, "wall_s": self.wall_s, "goodput_mean": self.mean,
                "goodput_ci99": self.ci99, "goodput_stderr": self.stderr,
                "goodput_p5": self.percentile(5), "goodput_p95": self.percentile(95),
                "lost": {"blocking": self.blocking, "rework": self.rework,
                         "restart": self.restart, "restore": self.restore},
                "lost_by_class": self.by_class,
                "failures_per_replica": self.failures_per_replica,
                "restores_by_level": self.restores_by_level,
                "overflowed": self.overflowed, "from_start": self.from_start}


class _Timeline:
    """The schedule in closed form: when a stretch of compute that starts at position p0
    reaches position p, and back.

    With ``w_k`` a level-k save's blocking plus the slowdown of the compute after it,
    ``G(p) = sum_{j<=p} (t + w_{L(j)})`` and ``F(p) = G(p) - slow_{L(p)}``. A stretch that
    starts at time T0 from position p0 (no slowdown in its first segment) reaches p > p0
    at ``T0 + F(p) - G(p0)``.
    """

    def __init__(self, levels: Sequence[Level], schedule: Schedule) -> None:
        self.t = schedule.compute_s
        self.counts = schedule.counts
        per = [1]
        for v in schedule.counts:
            per.append(per[-1] * (v + 1))
        self.per = per  # level k every per[k] segments
        self.top = len(levels) - 1
        save = np.array([lv.save_s for lv in levels], dtype=float)
        self.slow = np.array([lv.persist_s * lv.interference / (1.0 + lv.interference)
                              for lv in levels], dtype=float)
        self.slowed = bool((self.slow > 0).any())
        w = save + self.slow
        self.dw = np.diff(w, prepend=0.0)
        inner = [self.t]  # a level-k block of segments, less its last save
        for k, v in enumerate(schedule.counts):
            inner.append((v + 1) * inner[-1] + v * w[k])
        self.unit = [inner[k] + w[k] for k in range(self.top)]  # a block ending in level k
        self.period_s = inner[self.top] + w[self.top]

    def level(self, p: np.ndarray) -> np.ndarray:
        out = np.zeros(p.shape, dtype=np.int64)
        for k in range(1, self.top + 1):
            out += p % self.per[k] == 0
        return out

    def g(self, p: np.ndarray) -> np.ndarray:
        out: np.ndarray = p * (self.t + self.dw[0])
        for k in range(1, self.top + 1):
            out += (p // self.per[k]) * self.dw[k]
        return out

    def f(self, p: np.ndarray) -> np.ndarray:
        out = self.g(p)
        if self.slowed:
            out -= self.slow[self.level(p)]
        return out

    def reached(self, c: np.ndarray) -> np.ndarray:
        """The largest p with F(p) <= c (c >= 0): G inverted block by block from the top,
        then one segment more when its save ends in time (F(p + 1) < G(p + 1))."""
        q = np.maximum(np.floor(c / self.period_s), 0.0)
        rem = c - q * self.period_s
        base = q.astype(np.int64) * self.per[self.top]
        for k in range(self.top - 1, -1, -1):
            m = np.clip(np.floor(rem / self.unit[k]), 0, self.counts[k]).astype(np.int64)
            base += m * self.per[k]
            rem -= m * self.unit[k]
        if self.slowed:
            base += self.f(base + 1) <= c
        out: np.ndarray = base
        return out


@dataclass
class _Copies:
    """Per replica and level: the newest copy's position, the time the run had kept
    (wall time of the final timeline) when it reached it, whether it is still whole, and
    for node- and group-scope levels the node intervals taken since it was written."""

    pos: np.ndarray
    kept: np.ndarray
    whole: np.ndarray
    starts: list[np.ndarray | None]
    ends: list[np.ndarray | None]
    used: list[np.ndarray | None]


class _Clocks:
    """When each replica's next failure strikes, and of which class.

    Each class is a renewal process with Weibull gaps of mean 1/rate. Exponential gaps
    (shape 1) forget their past, so all classes then share one clock at the total rate and
    a failure's class is drawn when it strikes.
    """

    def __init__(self, rates: np.ndarray, shape: float, n: int,
                 rng: np.random.Generator) -> None:
        self.shape, self.rng = shape, rng
        self.pooled = shape == 1.0
        total = float(rates.sum())
        if self.pooled:
            self.cumulative = np.cumsum(rates / total) if total > 0 else np.ones(rates.size)
            self.scale = np.array([1.0 / total if total > 0 else np.inf])
        else:
            with np.errstate(divide="ignore"):
                self.scale = np.where(rates > 0,
                                      1.0 / (rates * math.gamma(1.0 + 1.0 / shape)), np.inf)
        self.at = self._gaps(np.broadcast_to(self.scale, (n, self.scale.size)).copy())
        self.rows = np.arange(n)

    def _gaps(self, scale: np.ndarray) -> np.ndarray:
        e = self.rng.standard_exponential(scale.shape)
        with np.errstate(invalid="ignore"):
            gaps = scale * (e if self.shape == 1.0 else e ** (1.0 / self.shape))
        out: np.ndarray = np.where(np.isinf(scale), np.inf, gaps)  # a class of rate 0
        return out

    def next(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Each replica's next failure time, and its class's column (None: pooled)."""
        if self.pooled:
            return self.at[:, 0], None
        column = self.at.argmin(axis=1)
        return self.at[self.rows, column], column

    def strike(self, rows: np.ndarray, now: np.ndarray, column: np.ndarray | None) -> np.ndarray:
        """Renew the clocks that struck; the failures' classes."""
        if column is None:
            self.at[rows, 0] = now + self._gaps(np.full(rows.size, self.scale[0]))
            drawn = np.searchsorted(self.cumulative, self.rng.random(rows.size), side="right")
            out: np.ndarray = np.minimum(drawn, self.cumulative.size - 1)
            return out
        self.at[rows, column] = now + self._gaps(self.scale[column])
        return column


def _check_levels(levels: Sequence[Level], scopes: Sequence[str],
                  failures: Sequence[Failures]) -> list[int]:
    """The levels, their scopes and the classes they survive; the scopes' indices."""
    if not levels:
        raise SpecError("levels: none given; allowed: 1 to 4, cheapest first")
    if len(scopes) != len(levels):
        raise SpecError(f"levels: {len(scopes)} scopes for {len(levels)} levels; allowed: one "
                        "per level")
    reach = []
    for lv, scope in zip(levels, scopes, strict=True):
        if scope not in SCOPES:
            raise SpecError(f"level {lv.name}: scope {scope!r} is not known; allowed: "
                            f"{', '.join(SCOPES)}")
        reach.append(SCOPES.index(scope))
        for what, value in (("save", lv.save_s), ("restore", lv.restore_s),
                            ("persist", lv.persist_s), ("interference", lv.interference)):
            non_negative(f"level {lv.name} {what}", value)
    if any(b <= a for a, b in itertools.pairwise(reach)):
        raise SpecError("levels: each level must survive a wider scope than the one before "
                        f"(given: {', '.join(scopes)}); allowed order: {', '.join(SCOPES)}")
    if len({lv.name for lv in levels}) != len(levels):
        raise SpecError(f"levels: names repeat ({', '.join(lv.name for lv in levels)}); "
                        "allowed: one name per level")
    for f in failures:
        if SCOPES.index(f.scope) > reach[-1]:
            raise SpecError(f"failure class {f.name} (scope {f.scope}) is survived by no level "
                            f"(the last, {levels[-1].name}, has scope {scopes[-1]}); allowed: "
                            f"a last level of scope {f.scope} or wider (e.g. storage: job)")
    return reach


def _check_schedule(levels: Sequence[Level], schedule: Schedule, wall_s: float) -> None:
    """The schedule's counts, and each asynchronous level's interval against its persist."""
    t = positive("compute seconds between checkpoints", schedule.compute_s)
    if len(schedule.counts) != len(levels) - 1:
        raise SpecError(f"counts: {len(schedule.counts)} given; allowed: one per level below "
                        f"the last ({len(levels) - 1})")
    per = [1]
    for k, v in enumerate(schedule.counts):
        _int(f"count of level {levels[k].name}", v, 0)
        per.append(per[-1] * (v + 1))
        if per[-1] > MAX_SEGMENTS:
            raise SpecError(f"counts {tuple(schedule.counts)}: a period of more than "
                            f"{MAX_SEGMENTS:.0e} checkpoints; allowed: fewer")
    for lv, every in zip(levels, per, strict=True):
        if t * every < lv.persist_s:
            raise SpecError(f"level {lv.name}: its interval {t * every:g} s is shorter than "
                            f"its persist {lv.persist_s:g} s; allowed: an interval of at least "
                            "the persist (one persist of a level at a time)")
    if positive("--days", wall_s) / t > MAX_SEGMENTS:
        raise SpecError(f"--days: {wall_s / t:.3g} checkpoints of {t:g} s; allowed: at most "
                        f"{MAX_SEGMENTS:.0e}")


def _check_run(failures: Sequence[Failures], wall_s: float, topology: Topology,
               replicas: int, shape: float, reshard_factor: float) -> None:
    """The run's options, and a bound on its work."""
    if not MIN_SHAPE <= shape <= MAX_SHAPE:
        raise SpecError(f"--weibull-shape {shape:g}: allowed: {MIN_SHAPE:g} to {MAX_SHAPE:g} "
                        "(published fits of the gaps between failures on HPC systems have "
                        "shapes of about 0.5 to 0.9, Schroeder & Gibson, DSN 2006; below "
                        f"{MIN_SHAPE:g} a class's mean is made of gaps far shorter than a "
                        "restart and gaps longer than the run)")
    if not (math.isfinite(reshard_factor) and reshard_factor >= 1.0):
        raise SpecError(f"reshard factor = {reshard_factor!r}: allowed: a finite number >= 1")
    if not isinstance(topology, Topology):
        raise SpecError("topology: allowed: a Topology")
    if isinstance(replicas, bool) or not isinstance(replicas, int | np.integer) \
            or not 1 <= replicas <= MAX_REPLICAS:
        raise SpecError(f"--replicas {replicas}: allowed: 1 to {MAX_REPLICAS}")
    clocks = 1 if shape == 1.0 else max(len(failures), 1)  # one per class, unless pooled
    if replicas * clocks > MAX_CLOCKS:
        raise SpecError(f"--replicas {replicas} x {clocks} failure classes, each on a clock of "
                        f"its own (--weibull-shape {shape:g}); allowed: at most {MAX_CLOCKS:.0e}")
    rate = sum(f.rate_per_s for f in failures)
    events = 2.0 * wall_s * rate + 1.0  # a failure and a restore each, per replica
    per_iteration = replicas * (1.0 + clocks / 16.0) + ITERATION_COST
    if events * per_iteration > MAX_WORK:
        raise SpecError(f"--replicas {replicas} x --days {wall_s / SECONDS_PER_DAY:.3g}: about "
                        f"{events:.3g} events per run at {rate * SECONDS_PER_DAY:.3g} failures "
                        f"a day; allowed: at most {MAX_WORK / per_iteration:.3g} events per run "
                        "at this many replicas (fewer replicas or a shorter run)")


def simulate(levels: Sequence[Level], scopes: Sequence[str], failures: Sequence[Failures],
             schedule: Schedule, wall_s: float, topology: Topology, replicas: int = 1000,
             seed: int = 0, shape: float = 1.0, reshard_factor: float = 1.0) -> Simulated:
    """Simulate `replicas` runs of `wall_s` seconds each under one schedule (a seed makes
    it reproducible). `levels[k].restore_s` is the copy's restore alone (the restart comes
    from the failure); `scopes[k]` the widest failure scope level k's copy survives.
    `shape`: the Weibull shape of every class's gaps. `reshard_factor`: what a restore
    onto fewer nodes takes, times the copy's restore."""
    reach = _check_levels(levels, scopes, failures)
    _check_schedule(levels, schedule, wall_s)
    shape = float(shape)
    _check_run(failures, wall_s, topology, replicas, shape, float(reshard_factor))
    return _Run(levels, reach, failures, schedule, float(wall_s), topology, int(replicas),
                seed, float(shape), float(reshard_factor)).play()


class _Run:
    """The replicas' state, and one iteration per event."""

    def __init__(self, levels: Sequence[Level], reach: list[int],
                 failures: Sequence[Failures], schedule: Schedule, wall_s: float,
                 topology: Topology, n: int, seed: int, shape: float, factor: float) -> None:
        self.levels, self.reach, self.failures = levels, reach, failures
        self.wall, self.n, self.factor = wall_s, n, factor
        self.line = _Timeline(levels, schedule)
        self.nodes, self.group = topology.nodes, topology.group_nodes
        self.blocks = -(-self.nodes // self.group)
        k = topology.peer_replicas
        # distinct holders beyond the node itself: the ring wraps at N nodes, the groups'
        # holders n + jG at N / gcd(N, G)
        self.peer_need = min(k + 1, self.nodes)
        self.group_k = min(k, self.nodes // math.gcd(self.nodes, self.group) - 1)
        # the fewest consecutive nodes, less one, that hold two of a part's holders (0: one)
        self.holders_gap = min((min(j * self.group % self.nodes,
                                    self.nodes - j * self.group % self.nodes)
                                for j in range(1, self.group_k + 1)), default=0)
        self.restore_s = np.array([lv.restore_s for lv in levels], dtype=float)
        self.persist = np.array([lv.persist_s for lv in levels], dtype=float)
        self.by_persist: dict[float, list[int]] = {}
        for i, lv in enumerate(levels):
            self.by_persist.setdefault(float(lv.persist_s), []).append(i)
        self.class_scope = np.array([SCOPES.index(f.scope) for f in failures], dtype=np.int64)
        self.class_restart = np.array([f.restart_s for f in failures], dtype=float)
        self.no_spare = np.array([f.no_spare for f in failures], dtype=float)
        self.any_spare_missing = bool((self.no_spare > 0).any())
        rates = np.array([f.rate_per_s for f in failures], dtype=float)
        self.rng = np.random.default_rng(seed)
        # draws of their own, so that runs that differ only there share their failures
        self.spare_rng = np.random.default_rng([seed, 1])
        self.node_rng = np.random.default_rng([seed, 2])
        self.clocks = _Clocks(rates if rates.size else np.zeros(1), shape, n, self.rng)
        nl = len(levels)
        tracked = [r in (_NODE, _GROUP) for r in reach]
        self.copies = _Copies(
            pos=np.zeros((n, nl), dtype=np.int64), kept=np.zeros((n, nl)),
            whole=np.ones((n, nl), dtype=bool),
            starts=[np.zeros((n, CAPACITY), dtype=np.int64) if t else None for t in tracked],
            ends=[np.zeros((n, CAPACITY), dtype=np.int64) if t else None for t in tracked],
            used=[np.zeros(n, dtype=np.int64) if t else None for t in tracked])
        # the replica's phase: computing from (T0, p0), or restarting since T0
        self.restarting = np.zeros(n, dtype=bool)
        self.t0 = np.zeros(n)
        self.p0 = np.zeros(n, dtype=np.int64)
        self.g0 = np.zeros(n)  # G(p0)
        self.kept = np.zeros(n)  # the final timeline's wall time at p0
        self.length = np.zeros(n)  # restart + restore
        self.restart_len = np.zeros(n)
        self.cause = np.zeros(n, dtype=np.int64)
        self.source = np.zeros(n, dtype=np.int64)
        self.fewer = np.zeros(n, dtype=bool)
        nc = max(len(failures), 1)
        self.lost = {k: np.zeros(n) for k in ("rework", "restart", "restore")}
        self.by_class = {k: np.zeros(nc) for k in ("rework", "restart", "restore")}
        self.count = np.zeros(n, dtype=np.int64)
        self.class_count = np.zeros(nc, dtype=np.int64)
        self.restored = np.zeros(nl, dtype=np.int64)
        self.useful = np.zeros(n)
        self.final = np.zeros(n)  # the final timeline's wall time
        self.overflowed = 0
        self.from_start = 0

    # --- the loop ----------------------------------------------------------------------

    def play(self) -> Simulated:
        live = np.ones(self.n, dtype=bool)
        while True:
            strike, column = self.clocks.next()
            end = np.where(self.restarting, self.t0 + self.length, np.inf)
            stop = live & (np.minimum(strike, end) >= self.wall)
            if stop.any():
                self._finish(np.flatnonzero(stop))
                live &= ~stop
                if not live.any():
                    break
            fail = live & (strike < end)
            done = np.flatnonzero(live & ~fail)
            if done.size:
                self._restored(done)
            rows = np.flatnonzero(fail)
            if rows.size:
                now = strike[rows]
                c = self.clocks.strike(rows, now, None if column is None else column[rows])
                self._fail(rows, now, c)
        return self._result()

    def _charge(self, kind: str, rows: np.ndarray, seconds: np.ndarray,
                classes: np.ndarray) -> None:
        self.lost[kind][rows] += seconds
        self.by_class[kind] += np.bincount(classes, weights=seconds,
                                           minlength=self.by_class[kind].size)

    def _charge_restart(self, rows: np.ndarray, elapsed: np.ndarray) -> None:
        """A restart and restore, whole or cut short, to the class that began it."""
        restart = np.minimum(elapsed, self.restart_len[rows])
        self._charge("restart", rows, restart, self.cause[rows])
        self._charge("restore", rows, elapsed - restart, self.cause[rows])

    def _restored(self, rows: np.ndarray) -> None:
        self._charge_restart(rows, self.length[rows])
        self.restored += np.bincount(self.source[rows], minlength=self.restored.size)
        self.restarting[rows] = False
        self.t0[rows] += self.length[rows]

    def _fail(self, rows: np.ndarray, now: np.ndarray, c: np.ndarray) -> None:
        self.count[rows] += 1
        self.class_count += np.bincount(c, minlength=self.class_count.size)
        was = self.restarting[rows]
        kept_at = self.kept[rows].copy()
        computing = rows[~was]
        if computing.size:
            self._saves_until(computing, now[~was])
            kept_at[~was] += now[~was] - self.t0[computing]
        if was.any():
            self._charge_restart(rows[was], now[was] - self.t0[rows[was]])
        self._destroy(rows, self.class_scope[c])
        # the newest checkpoint a whole copy holds, read from the cheapest level holding it
        newest = np.where(self.copies.whole[rows], self.copies.pos[rows], -1)
        level = newest.argmax(axis=1)
        position = newest[np.arange(rows.size), level]
        kept = self.copies.kept[rows, level]
        none = position < 0
        if none.any():  # no copy survived: back to the run start
            self.from_start += int(none.sum())
            level[none], position[none], kept[none] = self.line.top, 0, 0.0
        self._charge("rework", rows, kept_at - kept, c)
        missing = (self.spare_rng.random(rows.size) < self.no_spare[c]) \
            if self.any_spare_missing else np.zeros(rows.size, dtype=bool)
        fewer = missing | (self.fewer[rows] & was)  # a restore started again keeps its layout
        self.fewer[rows] = fewer
        restart = self.class_restart[c]
        self.restarting[rows] = True
        self.t0[rows] = now
        self.restart_len[rows] = restart
        self.length[rows] = restart + self.restore_s[level] * np.where(fewer, self.factor, 1.0)
        self.cause[rows] = c
        self.source[rows] = level
        self.p0[rows] = position
        self.g0[rows] = self.line.g(position)
        self.kept[rows] = kept

    def _saves_until(self, rows: np.ndarray, now: np.ndarray) -> None:
        """The copies the stretch of compute now ended has left: for each level, its newest
        checkpoint in the stretch whose save (and persist) ended by `now`."""
        line, copies = self.line, self.copies
        t0, p0, g0, kept = self.t0[rows], self.p0[rows], self.g0[rows], self.kept[rows]
        for persist, levels in self.by_persist.items():
            reached = line.reached(now - persist - t0 + g0)
            for k in levels:
                j = reached - reached % line.per[k] if k else reached
                newer = j > p0
                if not newer.any():
                    continue
                at, j = rows[newer], j[newer]
                copies.pos[at, k] = j
                copies.kept[at, k] = kept[newer] + line.f(j) - g0[newer]
                copies.whole[at, k] = True
                used = copies.used[k]
                if used is not None:
                    used[at] = 0

    # --- what a failure takes ----------------------------------------------------------

    def _destroy(self, rows: np.ndarray, scope: np.ndarray) -> None:
        whole = self.copies.whole
        job = rows[scope == _JOB]
        if job.size:
            for k, r in enumerate(self.reach):
                if r < _JOB:
                    whole[job, k] = False
        taking = (scope == _NODE) | (scope == _GROUP)
        if not taking.any():
            return
        at = rows[taking]
        group = scope[taking] == _GROUP
        if group.any():
            drawn = self.node_rng.integers(0, self.blocks, size=at.size)
            first = np.where(group, drawn * self.group, self.node_rng.integers(
                0, self.nodes, size=at.size))
            last = np.where(group, np.minimum(first + self.group, self.nodes), first + 1)
        else:
            first = self.node_rng.integers(0, self.nodes, size=at.size)
            last = first + 1
        for k, r in enumerate(self.reach):
            if r == _PROCESS:
                whole[at, k] = False
            elif r in (_NODE, _GROUP):
                keep = whole[at, k]
                if keep.any():
                    self._take(k, r, at[keep], first[keep], last[keep])

    def _take(self, k: int, reach: int, rows: np.ndarray, a: np.ndarray,
              b: np.ndarray) -> None:
        """Add nodes [a, b) to the nodes taken since level k's copy was written; the copy is
        lost when some node and all its holders are among them."""
        starts, ends, used = self.copies.starts[k], self.copies.ends[k], self.copies.used[k]
        assert starts is not None and ends is not None and used is not None
        u = used[rows]
        empty = u == 0
        if reach == _NODE and empty.any():  # mostly: the new nodes alone, a run of b - a
            at = rows[empty]
            starts[at, 0], ends[at, 0], used[at] = a[empty], b[empty], 1
            self.copies.whole[at[b[empty] - a[empty] >= self.peer_need], k] = False
            rows, a, b, u = rows[~empty], a[~empty], b[~empty], u[~empty]
            if not rows.size:
                return
        s, e = starts[rows], ends[rows]
        valid = np.arange(CAPACITY)[None, :] < u[:, None]
        inside = (valid & (s <= a[:, None]) & (b[:, None] <= e)).any(axis=1)
        new = ~inside  # nodes already taken change nothing
        full = new & (u >= CAPACITY)
        if full.any():
            self.overflowed += int(full.sum())
            self.copies.whole[rows[full], k] = False
        add = new & ~full
        if not add.any():
            return
        rows, a, b, u = rows[add], a[add], b[add], u[add]
        starts[rows, u] = a
        ends[rows, u] = b
        used[rows] = u + 1
        s, e = starts[rows], ends[rows]
        valid = np.arange(CAPACITY)[None, :] <= u[:, None]
        if reach == _NODE:
            lost = self._ring_lost(s, e, valid, a, b)
        else:
            lost = self._groups_lost(s, e, valid, a, b, u == 0)
        self.copies.whole[rows[lost], k] = False

    def _ring_lost(self, s: np.ndarray, e: np.ndarray, valid: np.ndarray, a: np.ndarray,
                   b: np.ndarray) -> np.ndarray:
        """Node n's part is on n .. n+K (mod N): lost when a run of K+1 consecutive nodes
        (all N where K+1 > N) is taken. Only a run through the new nodes can be new."""
        n, need = self.nodes, self.peer_need
        run = b - a
        for step in (1, -1):
            y = b % n if step == 1 else (a - 1) % n
            going = run < need
            for _ in range(CAPACITY):
                if not going.any():
                    break
                holding = valid & (s <= y[:, None]) & (y[:, None] < e)
                hit = going & holding.any(axis=1)
                if step == 1:
                    far = np.where(holding, e, -1).max(axis=1)
                    run = run + np.where(hit, far - y, 0)
                    y = np.where(hit, far % n, y)
                else:
                    near = np.where(holding, s, n).min(axis=1)
                    run = run + np.where(hit, y - near + 1, 0)
                    y = np.where(hit, (near - 1) % n, y)
                going = hit & (run < need)
        lost: np.ndarray = run >= need
        return lost

    def _groups_lost(self, s: np.ndarray, e: np.ndarray, valid: np.ndarray, a: np.ndarray,
                     b: np.ndarray, alone: np.ndarray) -> np.ndarray:
        """Node n's part is on n and n + jG (mod N, j = 1..K): lost when for some n all of
        them are taken. Only an n whose holders include a new node can be new. `alone`: the
        new nodes are the only ones taken."""
        lost = np.zeros(a.size, dtype=bool)
        # a run of nodes no longer than the closest two holders of a part holds no part's all
        check = ~(alone & (b - a <= self.holders_gap))
        for wide in (False, True):  # single nodes apart from blocks: arrays as wide as needed
            rows = np.flatnonzero(check & ((b - a > 1) == wide))
            if rows.size:
                lost[rows] = self._chains_taken(s[rows], e[rows], valid[rows], a[rows], b[rows])
        return lost

    def _chains_taken(self, s: np.ndarray, e: np.ndarray, valid: np.ndarray, a: np.ndarray,
                      b: np.ndarray) -> np.ndarray:
        n, g, k = self.nodes, self.group, self.group_k
        width = int((b - a).max())
        x = a[:, None] + np.arange(width)[None, :]  # the new nodes
        real = x < b[:, None]
        s3, e3, v3 = s[:, None, :], e[:, None, :], valid[:, None, :]
        lost = np.zeros(a.size, dtype=bool)
        for o in range(k + 1):
            owner = (x - o * g) % n
            every = real.copy()
            for j in range(k + 1):
                y = ((owner + j * g) % n)[:, :, None]
                every &= (v3 & (s3 <= y) & (y < e3)).any(axis=2)
            lost |= every.any(axis=1)
        return lost

    # --- the end -----------------------------------------------------------------------

    def _finish(self, rows: np.ndarray) -> None:
        """The run ends at wall_s in the middle of a phase."""
        line = self.line
        was = self.restarting[rows]
        if was.any():
            at = rows[was]
            self._charge_restart(at, self.wall - self.t0[at])
            self.useful[at] = self.p0[at] * line.t
            self.final[at] = self.kept[at]
        at = rows[~was]
        if at.size:
            t0, p0, g0 = self.t0[at], self.p0[at], self.g0[at]
            p = np.maximum(line.reached(self.wall - t0 + g0), p0)
            began = np.where(p > p0, t0 + line.f(p) - g0, t0)  # the last segment
            self.useful[at] = p * line.t + np.clip(self.wall - began, 0.0, line.t)
            self.final[at] = self.kept[at] + self.wall - t0

    def _result(self) -> Simulated:
        wall, n = self.wall, self.n
        days = wall / SECONDS_PER_DAY
        by_class: dict[str, dict[str, float]] = {}
        for i, f in enumerate(self.failures):
            entry = by_class.setdefault(f.name, {"rework": 0.0, "restart": 0.0, "restore": 0.0,
                                                 "failures_per_day": 0.0})
            for kind in ("rework", "restart", "restore"):
                entry[kind] += float(self.by_class[kind][i] / n / wall)
            entry["failures_per_day"] += float(self.class_count[i] / n / days)
        shares = {"blocking": (self.final - self.useful) / wall,
                  **{k: v / wall for k, v in self.lost.items()}}
        return Simulated(
            replicas=n, wall_s=wall, goodput=tuple((self.useful / wall).tolist()),
            blocking=float(shares["blocking"].mean()), rework=float(shares["rework"].mean()),
            restart=float(shares["restart"].mean()), restore=float(shares["restore"].mean()),
            by_class=by_class, failures_per_replica=float(self.count.mean()),
            restores_by_level={lv.name: int(c) for lv, c in zip(self.levels, self.restored,
                                                                strict=True)},
            lost_by_replica={k: tuple(v.tolist()) for k, v in shares.items()},
            overflowed=self.overflowed, from_start=self.from_start)
