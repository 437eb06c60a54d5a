"""The cadence calculator against Daly's published numbers, a Monte-Carlo simulation of
the same failure model, and the edge cases where first-order formulas break."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ckptbench import cadence
from ckptbench.cadence import (
    CheckpointCost,
    Component,
    analyze,
    daly_interval,
    efficiency,
    failure_fraction,
    failure_loss,
    failure_model,
    lambert_w0,
    loss_per_day,
    loss_per_failure,
    optimal_interval,
    parse_component,
    required_save_seconds,
    series_mtbf_s,
    young_interval,
)
from ckptbench.errors import SpecError

MIN, HOUR = 60.0, 3600.0


# --- a Monte-Carlo simulation of Daly's failure model -----------------------------------


def simulate(tau: float, save: float, restore: float, mtbf: float, persist: float = 0.0,
             failures: int = 4000, seed: int = 0, slowdown: float = 0.0) -> tuple[float, float]:
    """Run a job through exponential failures; return (efficiency, mean loss per failure).

    Failures strike anywhere: in compute, in saves, in restarts (which then start over).
    With ``persist`` > 0 a checkpoint becomes durable only that long after its blocking
    part, and a failure before then falls back to the previous one; with ``slowdown``
    the steps run that much slower while it is in flight (a segment that starts with a
    persist in flight, not the first after a restart, takes persist x slowdown /
    (1 + slowdown) longer). The job is sized so that about ``failures`` failures happen.
    """
    rng = np.random.default_rng(seed)
    period = tau + save
    extra = persist * slowdown / (1 + slowdown)
    segments = max(50, math.ceil(failures * mtbf / (period + extra)))
    wall, position, durable, pending_until, n_failures = 0.0, 0, 0, None, 0
    while position < segments:
        length = period + (extra if pending_until is not None else 0.0)
        strike = rng.exponential(mtbf)
        if pending_until is not None and min(strike, length) >= pending_until:
            durable, pending_until = position, None
        if strike >= length:
            wall += length
            position += 1
            if persist > 0:
                pending_until = persist
            else:
                durable = position
            continue
        wall += strike
        n_failures += 1
        pending_until = None
        while (again := rng.exponential(mtbf)) < restore:  # the restart can fail too
            wall += again
            n_failures += 1
        wall += restore
        position = durable
    useful = segments * tau
    return useful / wall, (wall - segments * period) / n_failures


# --- Daly's published examples ----------------------------------------------------------


@pytest.mark.parametrize(
    ("mtbf_min", "expected_min", "tolerance"),
    [(24 * 60, 117, 0.5), (6 * 60, 57, 0.5), (15, 9.1, 0.05)],
)
def test_daly_published_examples(mtbf_min: float, expected_min: float, tolerance: float) -> None:
    # Daly (FGCS 2006): C = 5 min, R = 10 min.
    tau = daly_interval(5 * MIN, mtbf_min * MIN) / MIN
    assert tau == pytest.approx(expected_min, abs=tolerance)


def test_exact_optimum_against_daly_series() -> None:
    # Reference: Daly's series is within 0.05 % of the exact optimum for C/M <= 0.1 and
    # 1.8 % at C = M; the gap grows with C/M.
    gaps = [
        optimal_interval(c, 1.0) / daly_interval(c, 1.0) - 1 for c in (1e-4, 1e-2, 0.1, 1.0)
    ]
    assert all(g > 0 for g in gaps)
    assert gaps == sorted(gaps)
    assert gaps[2] < 5e-4
    assert gaps[3] == pytest.approx(0.018, abs=0.001)


def test_exact_and_young_converge_for_small_save_times() -> None:
    # C/M = 1e-12: the branch-point cancellation must not cost digits.
    assert optimal_interval(1.0, 1e12) / daly_interval(1.0, 1e12) == pytest.approx(1, abs=1e-9)
    assert optimal_interval(1.0, 1e12) / young_interval(1.0, 1e12) == pytest.approx(1, abs=1e-5)
    assert young_interval(5 * MIN, 24 * HOUR) == pytest.approx(120 * MIN)


@pytest.mark.parametrize("save", [1.0, 60.0, 900.0, 3600.0, 4 * 3600.0])
@pytest.mark.parametrize("restore", [0.0, 600.0, 30_000.0])
def test_exact_optimum_maximizes_efficiency_and_ignores_restore(save: float, restore: float
                                                                 ) -> None:
    mtbf = 2 * HOUR
    best = optimal_interval(save, mtbf)
    grid = np.geomspace(best / 50, best * 50, 2001)
    on_grid = max(efficiency(t, save, restore, mtbf) for t in grid)
    at_best = efficiency(best, save, restore, mtbf)
    assert at_best >= on_grid * (1 - 1e-12)
    assert at_best > efficiency(best * 1.01, save, restore, mtbf)
    assert at_best > efficiency(best * 0.99, save, restore, mtbf)


def test_lambert_w0_known_values() -> None:
    assert lambert_w0(0.0) == 0.0
    assert lambert_w0(1.0) == pytest.approx(0.5671432904097838, rel=1e-15)  # the omega constant
    assert lambert_w0(math.e) == pytest.approx(1.0, rel=1e-15)
    assert lambert_w0(-1 / math.e) == pytest.approx(-1.0, abs=1e-7)
    assert lambert_w0(-math.log(2) / 2) == pytest.approx(-math.log(2), rel=1e-14)
    for x in (-0.3678, -0.36, -0.3, -0.1, -1e-9, 1e-9, 0.5, 2.9, 3.1, 10.0, 1e5, 1e300):
        w = lambert_w0(x)
        assert w >= -1
        assert w * math.exp(w) == pytest.approx(x, rel=1e-13)
    with pytest.raises(ValueError):
        lambert_w0(-0.4)


# --- efficiency and losses --------------------------------------------------------------


def _first_order(tau: float, save: float, restore: float, mtbf: float) -> float:
    return 1 - save / tau - (restore + tau / 2) / mtbf


@pytest.mark.parametrize(
    ("tau", "save", "restore", "mtbf"),
    [
        (3 * HOUR, 5 * MIN, 10 * MIN, 1 * HOUR),  # tau >> M
        (MIN, 3 * HOUR, 10 * MIN, 1 * HOUR),  # C >= 2M
        (30 * MIN, 5 * MIN, 20 * HOUR, 1 * HOUR),  # R >> M
        (1e6 * HOUR, 1e4, 1e5, 10.0),  # absurd everything: no overflow
    ],
)
def test_efficiency_is_never_negative_where_first_order_is(tau: float, save: float,
                                                           restore: float, mtbf: float) -> None:
    assert _first_order(tau, save, restore, mtbf) < 0
    e = efficiency(tau, save, restore, mtbf)
    assert 0.0 <= e < 1.0


def test_efficiency_matches_daly_closed_form() -> None:
    tau, save, restore, mtbf = 50 * MIN, 5 * MIN, 10 * MIN, 6 * HOUR
    closed = tau * math.exp(-restore / mtbf) / (mtbf * (math.exp((tau + save) / mtbf) - 1))
    assert efficiency(tau, save, restore, mtbf) == pytest.approx(closed, rel=1e-13)
    # every branch of the evaluation: (tau + C)/M tiny, moderate, beyond exp's comfort
    for segment_over_m in (1e-9, 5e-5, 2e-4, 0.3, 49.0, 51.0, 300.0):
        tau, save, restore, mtbf = 0.9 * segment_over_m, 0.1 * segment_over_m, 0.2, 1.0
        closed = tau * math.exp(-restore) / math.expm1(tau + save)
        assert efficiency(tau, save, restore, mtbf) == pytest.approx(closed, rel=1e-12)
    # and approaches the first-order form when everything is small against M
    args = (1e5, 1.0, 10.0, 1e12)
    assert efficiency(*args) == pytest.approx(_first_order(*args), abs=1e-9)


def test_large_save_time_against_mtbf() -> None:
    save, mtbf = 3 * HOUR, 1 * HOUR  # C >= 2M
    assert daly_interval(save, mtbf) == mtbf
    exact = optimal_interval(save, mtbf)
    assert 0.9 * mtbf < exact < mtbf
    e = efficiency(exact, save, 0.0, mtbf)
    assert 0 < e < 0.05


def test_restore_time_far_above_mtbf() -> None:
    # R = 20 M: e^-20 caps goodput; the formula still gives a tiny positive number.
    e = efficiency(optimal_interval(60, HOUR), 60, 20 * HOUR, HOUR)
    assert 0 < e < math.exp(-20)


def test_no_failures() -> None:
    inf = math.inf
    assert young_interval(60, inf) == daly_interval(60, inf) == optimal_interval(60, inf) == inf
    assert efficiency(inf, 60, 600, inf) == 1.0
    assert efficiency(540, 60, 600, inf) == pytest.approx(0.9)
    assert failure_fraction(540, 60, 600, inf) == 0.0
    assert loss_per_day(540, 60, 600, inf) == 0.0
    assert loss_per_failure(540, 60, 600, inf) == 600 + 300
    assert efficiency(inf, 60, 600, HOUR) == 0.0  # never saving while failures happen


def test_shares_of_wall_time_add_up() -> None:
    report = analyze(CheckpointCost(51, 129), 3.1 * HOUR, current_interval_s=HOUR)
    for p in report.points:
        assert p.goodput + p.save_fraction + p.failure_fraction == pytest.approx(1.0, abs=1e-12)


def test_loss_per_failure_and_per_day() -> None:
    tau, save, restore, mtbf = 20 * MIN, MIN, 2 * MIN, 3 * HOUR
    per_failure = loss_per_failure(tau, save, restore, mtbf)
    # close to R + (tau + C)/2 when tau + C << M, but less: early failures are likelier
    assert per_failure == pytest.approx(restore + (tau + save) / 2, rel=0.05)
    assert per_failure < restore + (tau + save) / 2
    assert loss_per_day(tau, save, restore, mtbf) == pytest.approx(
        86400 / mtbf * per_failure, rel=1e-12
    )


@pytest.mark.parametrize(
    ("tau", "save", "restore", "mtbf", "persist"),
    [
        (50 * MIN, 5 * MIN, 10 * MIN, 6 * HOUR, 0.0),  # Daly's example
        (17 * MIN, 51.0, 129.0, 3.1 * HOUR, 0.0),  # Llama 3 scale, ByteCheckpoint costs
        (20 * MIN, 10 * MIN, 20 * MIN, 1 * HOUR, 0.0),  # C, R, tau all large against M
        (3 * MIN, 0.59, 129.0, 3.1 * HOUR, 50.0),  # asynchronous: 0.59 s blocking, 51 s save
        (30 * MIN, 1.0, 5 * MIN, 4 * HOUR, 25 * MIN),  # persist nearly the whole interval
    ],
)
def test_formula_against_monte_carlo(tau: float, save: float, restore: float, mtbf: float,
                                     persist: float) -> None:
    simulated, simulated_loss = simulate(tau, save, restore, mtbf, persist)
    cost = CheckpointCost(save, restore, persist)
    point = cadence.operating_point("t", tau, cost, mtbf)
    assert point.goodput == pytest.approx(simulated, rel=0.03)
    assert point.loss_per_failure_s == pytest.approx(simulated_loss, rel=0.04)


def test_monte_carlo_sees_the_persist_window() -> None:
    # The simulation is sensitive enough to tell a long persist from none.
    sync, _ = simulate(30 * MIN, 1.0, 5 * MIN, 4 * HOUR, 0.0)
    late, _ = simulate(30 * MIN, 1.0, 5 * MIN, 4 * HOUR, 25 * MIN)
    assert late < sync - 0.05


def test_failure_loss_at_a_fraction_of_the_run() -> None:
    run, tau, save, restore = 100 * HOUR, HOUR, 0.5 * MIN, 10 * MIN
    assert failure_loss(0.9, run, math.inf, save, restore) == pytest.approx(90 * HOUR + restore)
    period = tau + save
    at = 10 * period + 20 * MIN
    assert failure_loss(at / run, run, tau, save, restore) == pytest.approx(20 * MIN + restore)
    # asynchronous: 20 min after the snapshot, a 30-min persist has not finished
    assert failure_loss(at / run, run, tau, save, restore, persist_s=30 * MIN) == pytest.approx(
        20 * MIN + period + restore
    )
    assert failure_loss(0.0, run, tau, save, restore) == restore
    uniform = np.linspace(0, 1, 20_001)
    mean = np.mean([failure_loss(f, run, tau, save, restore) for f in uniform])
    assert mean == pytest.approx(restore + period / 2, rel=0.01)
    with pytest.raises(SpecError, match="fraction"):
        failure_loss(1.5, run, tau, save, restore)


# --- failure models ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "hours_at_1k", "hours_at_16k"),
    [
        ("llama3", 50.7, 3.09),
        ("rsc1", 29.5, 1.8),
        ("rsc2", 82, 5.0),
        ("opt175b", 13.6, 0.83),
        ("bloom", 43, 2.6),
    ],
)
def test_presets_reproduce_the_reference_table(preset: str, hours_at_1k: float,
                                               hours_at_16k: float) -> None:
    assert cadence.FAILURE_PRESETS[preset].citation
    at_1k = failure_model(preset=preset, gpus=1000).mtbf_s / HOUR
    at_16k = failure_model(preset=preset, gpus=16_384).mtbf_s / HOUR
    # the table prints two or three digits (BLOOM's 2.65 h shows as 2.6)
    assert at_1k == pytest.approx(hours_at_1k, rel=0.03)
    assert at_16k == pytest.approx(hours_at_16k, rel=0.03)


def test_components_make_a_series_system() -> None:
    gpu, host, nic = (parse_component(t) for t in ("gpu=1e-5", "host=2e-5", "nic=1e-6:8"))
    assert gpu == Component("gpu", 1e-5, None)
    assert host.per_host == 1.0
    assert nic.per_host == 8.0
    # 20 GPUs on 8-GPU hosts: 3 hosts, 24 NICs
    rate = 20 * 1e-5 + 3 * 2e-5 + 24 * 1e-6
    assert series_mtbf_s(20, [gpu, host, nic], gpus_per_host=8) == pytest.approx(HOUR / rate)
    assert series_mtbf_s(20, [Component("gpu", 0.0)]) == math.inf
    both = failure_model(preset="llama3", components=[host], gpus=16, gpus_per_host=8)
    assert both.mtbf_s == pytest.approx(HOUR / (16 * 1.97e-5 + 2 * 2e-5))
    assert "llama3" in both.source and "host" in both.source


@pytest.mark.parametrize("text", ["gpu", "=1e-5", "gpu=fast", "gpu=-1", "nic=1e-6:0", "a=1:x"])
def test_bad_components(text: str) -> None:
    with pytest.raises(SpecError, match="--component"):
        parse_component(text)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "failure model is required"),
        ({"preset": "llama4"}, "not known; allowed: llama3, rsc1"),
        ({"preset": "llama3"}, "--gpus is required"),
        ({"mtbf_s": 3600.0, "preset": "llama3", "gpus": 8}, "cannot be combined"),
        ({"mtbf_s": 0.0}, "--mtbf"),
        ({"mtbf_s": -5.0}, "--mtbf"),
    ],
)
def test_bad_failure_models(kwargs: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        failure_model(**kwargs)


# --- the report and the inverse question ------------------------------------------------


def test_report_at_llama3_scale() -> None:
    mtbf = failure_model(preset="llama3", gpus=16_384).mtbf_s
    report = analyze(CheckpointCost(51, 129), mtbf, gpus=16_384, current_interval_s=HOUR,
                     gpu_hour_price=2.0)
    assert report.recommended is report.exact
    assert [p.label for p in report.points] == ["Young (1974)", "Daly (2006)", "exact optimum",
                                                "current"]
    assert report.young.interval_s == pytest.approx(math.sqrt(2 * 51 * mtbf))
    assert report.exact.goodput > report.current.goodput
    assert report.exact.goodput >= report.young.goodput
    for p in report.points:
        assert p.gpu_hours_lost_per_day == pytest.approx(16_384 * 24 * (1 - p.goodput))
        assert p.cost_per_day == pytest.approx(2.0 * p.gpu_hours_lost_per_day)
    assert report.failures_per_day == pytest.approx(86400 / mtbf)


def test_persist_time_raises_the_interval() -> None:
    # 1 s blocking would checkpoint every ~2.5 min; a 10-min persist forbids that.
    cost = CheckpointCost(1.0, 120.0, persist_s=10 * MIN)
    report = analyze(cost, 3 * HOUR)
    assert report.exact.interval_s < 10 * MIN
    assert report.recommended.interval_s == 10 * MIN
    assert "persist" in report.floor_reason
    assert report.recommended in report.points
    # the persist is charged with the restart
    assert report.recommended.goodput == pytest.approx(efficiency(10 * MIN, 1.0, 120 + 600, 3 * HOUR))


def test_storage_bandwidth_bounds_bytes_per_interval() -> None:
    # 10 TB every interval through 2 GB/s sustained: at least 5000 s per period.
    report = analyze(CheckpointCost(10.0, 60.0), 3 * HOUR, checkpoint_bytes=10e12,
                     storage_bandwidth=2e9)
    assert report.recommended.interval_s == pytest.approx(5000 - 10)
    assert report.recommended.interval_s > report.exact.interval_s


def test_required_save_time_reaches_the_target() -> None:
    restore, mtbf = 129.0, 3.1 * HOUR
    max_save = required_save_seconds(0.95, restore, mtbf)
    assert max_save is not None
    assert cadence.best_goodput(max_save, restore, mtbf) == pytest.approx(0.95, abs=1e-9)
    assert cadence.best_goodput(max_save * 1.05, restore, mtbf) < 0.95
    # restarts alone cap goodput at e^(-R/M): 0.97 is out of reach with R = M/30
    assert required_save_seconds(0.97, mtbf / 30, mtbf) is None
    assert required_save_seconds(0.95, restore, math.inf) == math.inf
    with pytest.raises(SpecError, match="target goodput"):
        required_save_seconds(1.0, restore, mtbf)


@pytest.mark.parametrize(
    "call",
    [
        lambda: young_interval(0.0, HOUR),
        lambda: optimal_interval(-1.0, HOUR),
        lambda: daly_interval(60.0, 0.0),
        lambda: efficiency(0.0, 60.0, 60.0, HOUR),
        lambda: efficiency(60.0, 60.0, -1.0, HOUR),
        lambda: CheckpointCost(0.0, 10.0),
        lambda: CheckpointCost(1.0, 10.0, persist_s=-1.0),
        lambda: analyze(CheckpointCost(1.0, 1.0), HOUR, current_interval_s=0.0),
    ],
)
def test_bad_times_are_spec_errors(call) -> None:
    with pytest.raises(SpecError, match="must be"):
        call()
