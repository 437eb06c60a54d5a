"""The simulation against the analytic models it must agree with where both apply."""

from __future__ import annotations

import pytest

from ckptbench.cadence import formulas
from ckptbench.cadence.multilevel import Level, Schedule, efficiency, optimum
from ckptbench.errors import SpecError
from ckptbench.simulate import Failures, simulate

HOUR = 3600.0
DAY = 86400.0
STORAGE = [Level("storage", 60.0, 600.0)]
THREE = [Level("memory", 2.0, 20.0), Level("peer", 5.0, 90.0), Level("storage", 60.0, 600.0)]
CLASSES = [Failures("software", 0.3 / HOUR, 0), Failures("node", 0.5 / HOUR, 1),
           Failures("switch", 0.2 / HOUR, 2)]


def test_one_level_agrees_with_dalys_exact_efficiency() -> None:
    run = simulate(STORAGE, [Failures("all", 1 / HOUR, 0)], Schedule(900.0, ()), 20 * DAY,
                   replicas=300, seed=11)
    exact = formulas.efficiency(900.0, 60.0, 600.0, HOUR)
    assert run.analytic == pytest.approx(exact, rel=1e-12)
    assert abs(run.mean - exact) < run.ci99 < 0.003
    assert run.failures_per_replica == pytest.approx(20 * 24, rel=0.05)


def test_three_levels_agree_with_the_multilevel_model() -> None:
    schedule = Schedule(300.0, (2, 4))
    run = simulate(THREE, CLASSES, schedule, 20 * DAY, replicas=300, seed=12)
    exact = efficiency(THREE, [0.3 / HOUR, 0.5 / HOUR, 0.2 / HOUR], schedule)
    assert abs(run.mean - exact) < run.ci99 < 0.004


def test_weibull_of_shape_one_is_the_exponential() -> None:
    """Every class on a clock of its own (the Weibull path) at shape 1."""
    schedule = Schedule(300.0, (2, 4))
    run = simulate(THREE, CLASSES, schedule, 20 * DAY, replicas=300, seed=13, pool=False)
    exact = efficiency(THREE, [0.3 / HOUR, 0.5 / HOUR, 0.2 / HOUR], schedule)
    assert abs(run.mean - exact) < run.ci99


def test_weibull_keeps_the_mean_rate_and_has_no_closed_form() -> None:
    run = simulate(STORAGE, [Failures("all", 1 / HOUR, 0)], Schedule(900.0, ()), 20 * DAY,
                   replicas=200, seed=14, shape=0.7)
    assert run.analytic is None
    assert run.failures_per_replica == pytest.approx(20 * 24, rel=0.05)


def test_time_is_accounted_for_and_charged_to_classes() -> None:
    run = simulate(THREE, CLASSES, Schedule(300.0, (2, 4)), 10 * DAY, replicas=100, seed=15)
    assert run.mean + run.blocking + run.rework + run.restore == pytest.approx(1.0, abs=1e-9)
    assert sum(run.by_class.values()) == pytest.approx(run.rework + run.restore, rel=1e-6)
    # a switch failure costs a storage restore and a long rollback; software a memory one
    assert run.by_class["switch"] > run.by_class["software"]


def test_the_analytic_optimum_is_the_best_simulated_interval() -> None:
    rates = [1 / HOUR]
    best = optimum(STORAGE, rates).schedule.compute_s
    runs = {f: simulate(STORAGE, [Failures("all", 1 / HOUR, 0)], Schedule(best * f, ()),
                        20 * DAY, replicas=300, seed=16)
            for f in (0.4, 1.0, 2.5)}
    top = runs[1.0]
    for f in (0.4, 2.5):
        assert top.mean > runs[f].mean - top.ci99 - runs[f].ci99, f


def test_no_failures_means_only_saves_are_lost() -> None:
    run = simulate(STORAGE, [Failures("none", 0.0, 0)], Schedule(940.0, ()), 1 * DAY,
                   replicas=3)
    assert run.failures_per_replica == 0 and run.rework == 0 and run.restore == 0
    assert run.mean == pytest.approx(940 / 1000, abs=1e-3)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"replicas": 0}, "--replicas 0: allowed: 1 to 100000"),
    ({"replicas": 100_000, "wall_s": 365 * DAY}, "events"),
    ({"shape": 0.0}, "--weibull-shape = 0.0 must be > 0"),
    ({"wall_s": -1.0}, "--days = -1.0 must be > 0"),
])
def test_bad_or_unbounded_input_is_refused_before_work(kwargs: dict, message: str) -> None:
    args = {"wall_s": DAY, "replicas": 10, **kwargs}
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        simulate(STORAGE, [Failures("all", 1 / HOUR, 0)], Schedule(900.0, ()), **args)


def test_a_class_needing_a_missing_level_is_refused() -> None:
    with pytest.raises(SpecError, match="level 3 is not one of the 1 levels"):
        simulate(STORAGE, [Failures("x", 1 / HOUR, 3)], Schedule(900.0, ()), DAY, replicas=2)


def test_a_failure_during_a_persist_loses_that_checkpoint() -> None:
    """The simulation plays the persist window out (the model charges it as R + L): the
    longer the persist, the lower the goodput, and the model stays close."""
    rates = [Failures("all", 1 / HOUR, 0)]
    runs = {}
    for persist in (0.0, 200.0):
        level = [Level("storage", 2.0, 600.0, persist_s=persist)]
        runs[persist] = simulate(level, rates, Schedule(300.0, ()), 20 * DAY, replicas=300,
                                 seed=17)
    assert runs[200.0].mean < runs[0.0].mean - 0.01
    for run in runs.values():
        assert run.analytic is not None and abs(run.mean - run.analytic) < 0.005


def _shrinking(share: float, software: float = 0.0) -> list[Failures]:
    """Node and switch failures find no spare `share` of the time; software failures
    `software` of the time (none: they lose no node)."""
    return [Failures(f.name, f.rate_per_s, f.level, software if f.level == 0 else share)
            for f in CLASSES]


RESHARD = [0.0, 45.0, 300.0]  # per level: what the resharded restore costs more


def test_a_restart_onto_fewer_nodes_pays_the_resharded_restore() -> None:
    """Without missing spares the run is the same failure for failure; when no failure
    finds one, it is the run whose restores all cost the resharded plan (the spares have
    their own random draws)."""
    schedule = Schedule(300.0, (2, 4))
    run = {share: simulate(THREE, _shrinking(share), schedule, 10 * DAY, replicas=200, seed=21,
                           reshard_extra_s=RESHARD) for share in (0.0, 0.5, 1.0)}
    plain = simulate(THREE, CLASSES, schedule, 10 * DAY, replicas=200, seed=21)
    assert run[0.0].goodput == plain.goodput and run[0.0].analytic == plain.analytic
    slower = [Level(lv.name, lv.save_s, lv.restore_s + extra)
              for lv, extra in zip(THREE, RESHARD, strict=True)]
    every = simulate(THREE, _shrinking(1.0, software=1.0), schedule, 10 * DAY, replicas=200,
                     seed=21, reshard_extra_s=RESHARD)
    assert every.goodput == simulate(slower, CLASSES, schedule, 10 * DAY, replicas=200,
                                     seed=21).goodput
    assert run[1.0].analytic is None
    assert run[1.0].mean < run[0.5].mean < run[0.0].mean
    assert run[1.0].restore > run[0.0].restore


def test_a_share_without_spares_must_be_a_probability() -> None:
    with pytest.raises(SpecError, match="not a probability"):
        Failures("node", 1 / HOUR, 1, 1.5)
    with pytest.raises(SpecError, match="one per level"):
        simulate(THREE, CLASSES, Schedule(300.0, (2, 4)), DAY, replicas=2,
                 reshard_extra_s=[1.0])
    with pytest.raises(SpecError, match="resharded restore"):
        simulate(THREE, CLASSES, Schedule(300.0, (2, 4)), DAY, replicas=2,
                 reshard_extra_s=[0.0, -1.0, 0.0])
