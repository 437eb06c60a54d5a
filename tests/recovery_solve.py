"""An independent solve of the stated recovery rules (docs/cadence.md, "The rules"), for
small schedules: a finite Markov chain over explicit states, solved with numpy.

Written from the rules text alone, under the exact model's simplifications: exponential
failures, failures counted by scope (a failure of scope s takes every copy of a level
whose scope is narrower than s: ``process`` takes none, ``node`` the memory copy but
never a peer copy, ``group`` every copy narrower than ``group``, ``job`` every copy but
storage's), synchronous levels only (no persist), an infinite run. It knows nothing of
``ckptbench.cadence.scoped`` or ``ckptbench.simulate``; tests/test_recovery_rules.py
checks both against it.

States. One period holds ``S = prod(v_i + 1)`` segments; segment j (1..S) is ``t`` seconds
of compute and the blocking save of the highest level due at j (level k, 0-based, is due
every ``prod(v_0+1 .. v_{k-1}+1)`` segments; at j = S every level is due, so the top).
Holdings ``H`` say, per level, the position (0..S-1) of the checkpoint whose copy the
level holds, or None where its copy was lost. The start is position 0 with every level
holding 0 (the previous period's top save, which leaves a copy at every level).

- ``("run", p, H)``: computing segment p + 1 from the checkpoint at p, then its save;
  a phase of ``t + save(due(p + 1))`` seconds. Success: every level up to the one saved
  holds p + 1 (at p + 1 = S the period is done: the absorbing end, where the state is the
  start again). A failure of class c: the copies its scope takes are lost, then
  ``("back", c, H')``.
- ``("back", c, H)``: the restart that failure c began, then the restore of the newest
  checkpoint a surviving copy holds (q = max of H), read from the cheapest level holding
  it; one phase of ``restart(c) + restore(level)`` seconds (a failure during the restart
  and one during the restore play out the same way, rule 6). Success: ``("run", q, H)``:
  every surviving copy is at or before q, so nothing newer than q survives to be
  unusable. A failure of class c2 during it: its copies are lost, ``("back", c2, H')``,
  which reads the same copy again if it survived.

Every phase of ``d`` seconds, exposed to every class (total rate ``Lambda``), succeeds with
probability ``exp(-Lambda d)``, ends in a failure of class c with probability
``rate_c / Lambda * (1 - exp(-Lambda d))``, and lasts ``(1 - exp(-Lambda d)) / Lambda`` on
average. ``T(state)`` (expected seconds until the period's top save completes) is the
solution of ``T = duration + P T``; efficiency is ``S t / T(start)``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SCOPES = ("process", "node", "group", "job")

Holdings = tuple[int | None, ...]
State = tuple[str, int, Holdings]


@dataclass(frozen=True)
class Tier:
    """One checkpoint level: its blocking save, the restore of its copy (no restart), its
    scope (where its copy lives: what survives it)."""

    name: str
    save_s: float
    restore_s: float
    scope: str


@dataclass(frozen=True)
class Crash:
    """One failure class: its rate (1/s), its scope, the restart it costs (s)."""

    rate_per_s: float
    scope: str
    restart_s: float


def _rank(scope: str) -> int:
    if scope not in SCOPES:
        raise ValueError(f"scope {scope!r}: allowed {SCOPES}")
    return SCOPES.index(scope)


def _lose(holdings: Holdings, crash: Crash, tiers: Sequence[Tier]) -> Holdings:
    """The copies that survive a failure: a copy survives unless its scope is narrower
    than the failure's."""
    return tuple(None if _rank(tier.scope) < _rank(crash.scope) else at
                 for tier, at in zip(tiers, holdings, strict=True))


@dataclass(frozen=True)
class Solved:
    period_s: float  # T(start): expected wall seconds of one period
    efficiency: float  # S t / T(start)
    states: int


def solve(tiers: Sequence[Tier], crashes: Sequence[Crash], compute_s: float,
          counts: Sequence[int]) -> Solved:
    """Expected period and efficiency of the schedule ``compute_s`` and ``counts`` (one
    count per level below the top) under the stated rules; see the module's docstring."""
    if len(counts) != len(tiers) - 1:
        raise ValueError("one count per level below the top")
    top = max(_rank(tier.scope) for tier in tiers)
    if any(_rank(crash.scope) > top for crash in crashes):
        raise ValueError("a failure class takes every level's copy: nothing to restore")
    every = [math.prod(v + 1 for v in counts[:k]) for k in range(len(tiers))]
    segments = math.prod(v + 1 for v in counts)
    rates = np.array([crash.rate_per_s for crash in crashes], dtype=float)
    total = float(rates.sum())

    def due(j: int) -> int:
        """The highest level saved at the end of segment j (1..S)."""
        return max(k for k in range(len(tiers)) if j % every[k] == 0)

    def phase(duration: float) -> tuple[float, float, np.ndarray]:
        """(p_success, mean seconds, p_failure per class) of ``duration`` exposed seconds."""
        if total == 0.0:
            return 1.0, duration, np.zeros(len(crashes))
        hit = -math.expm1(-total * duration)
        return 1.0 - hit, hit / total, rates / total * hit

    def step(state: State) -> tuple[float, list[tuple[float, State | None]]]:
        """Expected seconds in ``state``'s phase, and (probability, next) (None: done)."""
        kind, x, held = state
        if kind == "run":
            saved = due(x + 1)
            ok, mean, fail = phase(compute_s + tiers[saved].save_s)
            after: State | None = None
            if x + 1 < segments:
                after = ("run", x + 1, tuple(x + 1 if k <= saved else at
                                             for k, at in enumerate(held)))
        else:
            newest = max(at for at in held if at is not None)
            read = min(k for k, at in enumerate(held) if at == newest)
            ok, mean, fail = phase(crashes[x].restart_s + tiers[read].restore_s)
            after = ("run", newest, held)
        moves: list[tuple[float, State | None]] = [(ok, after)]
        moves += [(float(fail[c]), ("back", c, _lose(held, crash, tiers)))
                  for c, crash in enumerate(crashes)]
        return mean, moves

    start: State = ("run", 0, (0,) * len(tiers))
    index: dict[State, int] = {start: 0}
    steps: list[tuple[float, list[tuple[float, State | None]]]] = []
    queue = deque([start])
    while queue:
        state = queue.popleft()
        mean, moves = step(state)
        steps.append((mean, moves))
        for _, nxt in moves:
            if nxt is not None and nxt not in index:
                index[nxt] = len(index)
                queue.append(nxt)
    n = len(index)
    a = np.eye(n)
    b = np.empty(n)
    for i, (mean, moves) in enumerate(steps):
        b[i] = mean
        for p, nxt in moves:
            if nxt is not None:
                a[i, index[nxt]] -= p
    t = np.linalg.solve(a, b)
    t += np.linalg.solve(a, b - a @ t)  # one step of refinement
    period = float(t[0])
    return Solved(period, segments * compute_s / period, n)


def daly(compute_s: float, save_s: float, restart_restore_s: float, mtbf_s: float) -> float:
    """Daly's exact efficiency for one level and exponential failures:
    tau e^{-R/M} / (M (e^{(tau + C)/M} - 1))."""
    m = mtbf_s
    return compute_s * math.exp(-restart_restore_s / m) / (
        m * math.expm1((compute_s + save_s) / m))
