"""The stated recovery rules (docs/cadence.md, "The rules"), checked from outside: the exact
model (``cadence.scoped``) and the event simulation (``simulate``) against an independent
Markov solve of the same rules on small schedules (tests/recovery_solve.py, written from
the rules text alone; it calls neither).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from ckptbench.cadence import multilevel
from ckptbench.cadence.multilevel import Level, Schedule
from ckptbench.cadence.scoped import Kind, efficiency
from ckptbench.simulate import Failures, Topology, simulate
from tests.recovery_solve import SCOPES, Crash, Tier, daly, solve

HOUR = 3600.0
DAY = 86400.0


def _need(tiers: list[Tier], scope: str) -> int:
    """The cheapest level whose scope is at least the failure's (0-based)."""
    return min(k for k, tier in enumerate(tiers)
               if SCOPES.index(tier.scope) >= SCOPES.index(scope))


def _levels(tiers: list[Tier]) -> list[Level]:
    return [Level(tier.name, tier.save_s, tier.restore_s) for tier in tiers]


# ---- the solver on its own -----------------------------------------------------------


@pytest.mark.parametrize(("compute_s", "save_s", "restore_s", "restart_s", "mtbf_s"), [
    (900.0, 60.0, 129.0, 600.0, HOUR),
    (75.0, 2.0, 60.0, 0.0, HOUR / (2e-3 * 1024)),
    (3600.0, 300.0, 600.0, 1200.0, 2 * HOUR),  # efficiency about 0.2
    (30.0, 1.0, 5.0, 20.0, 30 * DAY),
])
def test_one_level_is_dalys_exact_efficiency(compute_s: float, save_s: float,
                                             restore_s: float, restart_s: float,
                                             mtbf_s: float) -> None:
    storage = [Tier("storage", save_s, restore_s, "job")]
    exact = daly(compute_s, save_s, restart_s + restore_s, mtbf_s)
    alone = solve(storage, [Crash(1 / mtbf_s, "job", restart_s)], compute_s, ())
    assert alone.efficiency == pytest.approx(exact, rel=1e-12)
    # classes of any scope restore from the one level; with one restart it is one rate
    split = [Crash(0.3 / mtbf_s, "process", restart_s), Crash(0.7 / mtbf_s, "job", restart_s)]
    assert solve(storage, split, compute_s, ()).efficiency == pytest.approx(exact, rel=1e-12)


def test_without_failures_only_the_saves_cost() -> None:
    tiers = [Tier("memory", 1.0, 30.0, "process"), Tier("peer", 3.0, 90.0, "node"),
             Tier("storage", 51.0, 129.0, "job")]
    # 12 segments: 8 memory saves, 3 peer saves (at 3, 6, 9), the storage save at 12
    got = solve(tiers, [Crash(0.0, "node", 150.0)], 100.0, (2, 3))
    assert got.period_s == pytest.approx(1200.0 + 8 * 1.0 + 3 * 3.0 + 51.0, rel=1e-14)


def test_a_copy_no_failure_takes_is_storage_again() -> None:
    """Process failures only: the memory copy is always the newest checkpoint, so with the
    memory level's costs equal to storage's, any count gives storage alone (Daly)."""
    tiers = [Tier("memory", 2.0, 60.0, "process"), Tier("storage", 2.0, 60.0, "job")]
    rate = 2e-3 * 1024 / HOUR
    exact = daly(75.0, 2.0, 60.0, 1 / rate)
    for count in (0, 1, 5, 14):
        got = solve(tiers, [Crash(rate, "process", 0.0)], 75.0, (count,))
        assert got.efficiency == pytest.approx(exact, rel=1e-12)


# ---- the exact model against the solve -------------------------------------------------

TWO = [Tier("memory", 0.0, 0.0, "process"), Tier("storage", 0.0, 0.0, "job")]
THREE = [Tier("memory", 0.0, 0.0, "process"), Tier("peer", 0.0, 0.0, "node"),
         Tier("storage", 0.0, 0.0, "job")]
# (save, restore) ranges per level name, apart so that the cheaper level is cheaper in
# both; restart ranges per class scope
COSTS = {"memory": ((0.2, 5.0), (2.0, 30.0)), "peer": ((5.0, 20.0), (30.0, 150.0)),
         "storage": ((20.0, 150.0), (150.0, 900.0))}
RESTARTS = {"process": (0.0, 60.0), "node": (30.0, 300.0), "group": (120.0, 900.0),
            "job": (300.0, 1200.0)}
CLASSES = {2: ("process", "node", "job"), 3: ("process", "node", "group", "job")}


# levels, failure classes, compute seconds, counts, the solve's efficiency
Case = tuple[list[Tier], list[Crash], float, tuple[int, ...], float]


def _random_cases(seed: int, shape: list[Tier], n: int) -> list[Case]:
    """``n`` cases of the given levels whose stated-rules efficiency lies in 0.3..0.99
    (the failures' mean gap drawn around what gives an efficiency drawn in that range),
    where the saves take at most a tenth and the failures at least half of what is
    lost."""
    rng = random.Random(seed)
    cases: list[Case] = []
    while len(cases) < n:
        tiers = []
        for tier in shape:
            (s0, s1), (r0, r1) = COSTS[tier.name]
            tiers.append(Tier(tier.name, rng.uniform(s0, s1), rng.uniform(r0, r1),
                              tier.scope))
        scopes = [s for s in CLASSES[len(shape)] if rng.random() < 0.8] or ["job"]
        counts = tuple(rng.randint(0, 4) for _ in shape[1:])
        segments = math.prod(v + 1 for v in counts)
        saves = sum(tiers[max(k for k in range(len(tiers))
                              if j % math.prod(v + 1 for v in counts[:k]) == 0)].save_s
                    for j in range(1, segments + 1))
        compute_s = saves / segments * math.exp(rng.uniform(math.log(9.0), math.log(300.0)))
        # about what a failure costs: some of the period redone, a restart and a restore
        cost = compute_s * (1 + segments) / 4 + 300.0
        mtbf = cost / -math.log(rng.uniform(0.3, 0.99)) * math.exp(rng.gauss(0.0, 0.3))
        shares = [rng.random() + 0.05 for _ in scopes]
        crashes = [Crash(share / sum(shares) / mtbf, scope, rng.uniform(*RESTARTS[scope]))
                   for share, scope in zip(shares, scopes, strict=True)]
        got = solve(tiers, crashes, compute_s, counts).efficiency
        free = segments * compute_s / (segments * compute_s + saves)
        if 0.3 <= got <= 0.99 and free >= 0.9 and free - got >= (1.0 - got) / 2:
            cases.append((tiers, crashes, compute_s, counts, got))
    return cases


CASES = [("two", *case) for case in _random_cases(20260101, TWO, 30)] + \
        [("three", *case) for case in _random_cases(20260102, THREE, 40)]


@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(CASES)])
def test_exact_model_equals_the_markov_solve(case: int) -> None:
    _, tiers, crashes, compute_s, counts, solved = CASES[case]
    kinds = [Kind(c.rate_per_s, _need(tiers, c.scope), c.restart_s) for c in crashes]
    got = efficiency(_levels(tiers), kinds, Schedule(compute_s, counts))
    assert got == pytest.approx(solved, rel=1e-9), (
        f"{tiers} {crashes} t={compute_s!r} counts={counts}: scoped {got!r}, "
        f"solve {solved!r}")


def test_the_random_cases_span_the_range() -> None:
    values = [case[-1] for case in CASES]
    assert min(values) < 0.35
    assert max(values) > 0.97


# ---- a failure during a same-scope restore does not fall back --------------------------


def test_a_second_process_failure_reads_memory_again_unlike_scr() -> None:
    """Two identical levels, process failures only, restart 0: under the stated rules a
    restore from memory hit by another process failure reads memory again, so a memory
    level costs nothing (75s:14 is storage alone, Daly's 92.09 %); SCR's rules fall back
    to storage and give 91.12 %."""
    tiers = [Tier("memory", 2.0, 60.0, "process"), Tier("storage", 2.0, 60.0, "job")]
    rate = 2e-3 * 1024 / HOUR
    restart = 0.0
    schedule = Schedule(75.0, (14,))
    solved = solve(tiers, [Crash(rate, "process", restart)], 75.0, (14,)).efficiency
    stated = efficiency(_levels(tiers), [Kind(rate, 0, restart)], schedule)
    scr_levels = [Level(t.name, t.save_s, t.restore_s + restart) for t in tiers]
    scr = multilevel.efficiency(scr_levels, [rate, 0.0], schedule)
    storage_alone = multilevel.efficiency(scr_levels, [rate, 0.0], Schedule(75.0, (0,)))
    assert stated == pytest.approx(solved, rel=1e-9)
    assert solved == pytest.approx(storage_alone, rel=1e-12)
    assert scr == pytest.approx(0.9112, abs=5e-5)
    assert storage_alone == pytest.approx(0.9209, abs=5e-5)
    assert solved > scr
    assert stated > scr


# ---- the simulation against the solve --------------------------------------------------


def test_simulated_goodput_matches_the_solve() -> None:
    """memory (process) + storage (job); a process class (restart 20 s) and a job class
    (600 s), 20 failures a day; 400 replicas of 400 days, a standard error of about 8.5e-5.
    The finite run's end is below it: at most a period (about 1,230 s) of a 400-day run,
    3.6e-5, and the partial segment's compute counts (replicas of 2 days still agree).
    Charging each restart to the level read instead of the failure (0.8655) is 60
    standard errors off."""
    tiers = [Tier("memory", 1.0, 20.0, "process"), Tier("storage", 30.0, 120.0, "job")]
    crashes = [Crash(15 / DAY, "process", 20.0), Crash(5 / DAY, "job", 600.0)]
    compute_s, counts = 300.0, (3,)
    solved = solve(tiers, crashes, compute_s, counts).efficiency
    failures = [Failures("software", 15 / DAY, "process", 20.0),
                Failures("hardware", 5 / DAY, "job", 600.0)]
    run = simulate(_levels(tiers), ("process", "job"), failures, Schedule(compute_s, counts),
                   400 * DAY, Topology(nodes=16), replicas=400, seed=7)
    goodput = np.asarray(run.goodput, dtype=float)
    stderr = float(np.std(goodput, ddof=1)) / math.sqrt(len(goodput))
    assert abs(run.mean - solved) < 3 * stderr, (
        f"simulated {run.mean!r} +- {stderr!r} (1 s.e.), solve {solved!r}")
    assert stderr < 5e-4
