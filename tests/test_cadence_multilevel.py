"""The multi-level cadence against LLNL's SCR-model and against Daly's single-level model.

tests/golden/scr/vectors.json holds SCR-model's own efficiencies (made by
tests/golden/make_scr_vectors.py from a checkout of LLNL/SCR-model).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from ckptbench.cadence import formulas
from ckptbench.cadence.multilevel import Level, Schedule, efficiency, optimum, period_seconds
from ckptbench.errors import SpecError

VECTORS = json.loads((Path(__file__).parent / "golden" / "scr" / "vectors.json").read_text())


def levels_of(case: dict[str, Any]) -> list[Level]:
    return [Level(f"L{i}", s, r) for i, (s, r) in
            enumerate(zip(case["save_s"], case["restore_s"], strict=True), 1)]


def test_every_schedule_agrees_with_scr_model_within_a_thousandth() -> None:
    worst = 0.0
    for case in VECTORS["schedules"]:
        ours = efficiency(levels_of(case), case["rates"],
                          Schedule(case["compute_s"], tuple(case["counts"])))
        worst = max(worst, abs(ours - case["efficiency"]))
    assert worst < 1e-3  # 0.1 percentage point; in practice rounding only:
    close = [c for c in VECTORS["schedules"] if c["efficiency"] > 1e-3]
    assert len(close) > 200
    for case in close:
        ours = efficiency(levels_of(case), case["rates"],
                          Schedule(case["compute_s"], tuple(case["counts"])))
        assert ours == pytest.approx(case["efficiency"], rel=1e-8), case


@pytest.mark.parametrize("case", VECTORS["grid_optima"], ids=lambda c: c["machine"])
def test_the_optimum_is_scr_models_best_schedule(case: dict[str, Any]) -> None:
    best = optimum(levels_of(case), case["rates"])
    step = case["t_grid"][2]
    assert best.schedule.counts == tuple(case["counts"])
    assert abs(best.schedule.compute_s - case["compute_s"]) <= step
    # a continuous t can only do better than SCR-model's grid of t, and barely
    assert case["efficiency"] - 1e-12 <= best.efficiency <= case["efficiency"] + 1e-4


@pytest.mark.parametrize(("tau", "save", "restore", "mtbf"), [
    (1500.0, 50.0, 600.0, 3 * 3600.0), (800.0, 5.0, 10.0, 1e5), (60.0, 120.0, 3000.0, 1800.0),
    (7200.0, 0.5, 0.5, 1e7)])
def test_one_level_is_dalys_model_exactly(tau: float, save: float, restore: float,
                                          mtbf: float) -> None:
    ours = efficiency([Level("storage", save, restore)], [1.0 / mtbf], Schedule(tau, ()))
    assert ours == pytest.approx(formulas.efficiency(tau, save, restore, mtbf), rel=1e-12)


def test_one_levels_optimum_is_the_lambert_w_interval() -> None:
    save, restore, mtbf = 51.0, 729.0, 3.1 * 3600
    best = optimum([Level("storage", save, restore)], [1.0 / mtbf])
    assert best.schedule.compute_s == pytest.approx(formulas.optimal_interval(save, mtbf),
                                                    rel=1e-5)


def test_a_cheap_level_that_survives_most_failures_pays() -> None:
    """Memory every few minutes beats storage alone when most failures spare memory."""
    storage = [Level("storage", 60.0, 600.0)]
    both = [Level("memory", 2.0, 20.0), *storage]
    mtbf = 3 * 3600.0
    alone = optimum(storage, [1.0 / mtbf])
    mixed = optimum(both, [0.8 / mtbf, 0.2 / mtbf])
    assert mixed.efficiency > alone.efficiency + 0.02
    assert mixed.schedule.compute_s < alone.schedule.compute_s
    assert mixed.schedule.counts[0] >= 1


def test_no_failures_means_no_loss() -> None:
    levels = [Level("memory", 2.0, 20.0), Level("storage", 60.0, 600.0)]
    schedule = Schedule(1000.0, (4,))
    assert period_seconds(levels, [0.0, 0.0], schedule) == pytest.approx(5 * 1000 + 4 * 2 + 60)


def test_hopeless_schedules_have_efficiency_zero() -> None:
    levels = [Level("memory", 2.0, 20.0), Level("storage", 600.0, 6000.0)]
    assert efficiency(levels, [1e-2, 1e-2], Schedule(1e5, (3,))) == 0.0


@pytest.mark.parametrize(("levels", "rates", "schedule", "message"), [
    ([], [], Schedule(1.0, ()), "levels: 0 given"),
    ([Level("a", 1, 1)], [1e-5, 1e-5], Schedule(1.0, ()), "failure rates: 2 given for 1"),
    ([Level("a", 1, 1), Level("b", 2, 2)], [1e-5, 1e-5], Schedule(1.0, ()), "counts: 0 given"),
    ([Level("a", 1, 1), Level("b", 2, 2)], [1e-5, 1e-5], Schedule(1.0, (-1,)),
     "count of level 1 = -1"),
    ([Level("a", -1, 1)], [1e-5], Schedule(1.0, ()), "level a save_s = -1"),
    ([Level("a", 1, 1)], [-1e-5], Schedule(1.0, ()), "failure rate of severity 1"),
    ([Level("a", 1, 1)], [1e-5], Schedule(0.0, ()), "compute_s = 0"),
    ([Level("a", 1, math.nan)], [1e-5], Schedule(1.0, ()), "restore_s = nan"),
])
def test_bad_input_is_one_line_naming_it(levels: list[Level], rates: list[float],
                                         schedule: Schedule, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        efficiency(levels, rates, schedule)


def test_no_failures_at_all_has_no_optimum() -> None:
    with pytest.raises(SpecError, match="all 0"):
        optimum([Level("storage", 60.0, 600.0)], [0.0])


def test_an_asynchronous_level_is_charged_as_the_one_level_cadence_charges_it() -> None:
    from ckptbench.cadence.answer import CheckpointCost

    cost = CheckpointCost(2.0, 600.0, 51.0, 0.1)
    level = Level("storage", 2.0, 600.0, persist_s=51.0, interference=0.1)
    mtbf = 3 * 3600.0
    for tau in (60.0, 300.0, 900.0):
        assert efficiency([level], [1 / mtbf], Schedule(tau, ())) == pytest.approx(
            formulas.efficiency(tau, cost.effective_save_s, cost.effective_restore_s, mtbf),
            rel=1e-12)
    # one persist in flight at a time: an interval shorter than the persist is not a schedule
    assert efficiency([level], [1 / mtbf], Schedule(50.0, ())) == 0.0
    best = optimum([level], [1 / mtbf])
    assert best.schedule.compute_s >= 51.0 and best.efficiency > 0.9


def test_the_persist_floor_binds_each_level_at_its_own_interval() -> None:
    """Storage persists in 600 s; with 4 peer copies between storage copies, t >= 120 s."""
    levels = [Level("peer", 3.0, 90.0), Level("storage", 3.0, 300.0, persist_s=600.0)]
    rates = [1 / 600.0, 1 / 7200.0]  # failures so frequent that the optimum wants t < floor
    assert efficiency(levels, rates, Schedule(119.0, (4,))) == 0.0
    assert efficiency(levels, rates, Schedule(121.0, (4,))) > 0.0
    best = optimum(levels, rates)
    assert best.schedule.compute_s * (best.schedule.counts[0] + 1) >= 600.0
