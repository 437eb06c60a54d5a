"""Asynchronous checkpoints in the cadence model: the persist's interference charged to
goodput (against a simulation), and `cadence --results` of a --mode async run."""

from __future__ import annotations

import json

import pytest
from test_cadence import simulate

import ckptbench.cli as cli_module
from ckptbench import cadence
from ckptbench.cadence import CheckpointCost
from ckptbench.cli.cadence_cmd import cadence_command
from tests import synthetic

MIN, HOUR = 60.0, 3600.0
PER_RANK = 2 * 10**12 // 2048  # a 2 TB checkpoint on 2,048 GPUs


@pytest.mark.parametrize(("tau", "save", "restore", "mtbf", "persist", "slowdown"), [
    (20 * MIN, 10.0, 10 * MIN, 3 * HOUR, 5 * MIN, 0.5),
    (3 * MIN, 0.59, 129.0, 3.1 * HOUR, 50.0, 0.1),  # ByteCheckpoint's 405B costs
    (30 * MIN, 1.0, 5 * MIN, 4 * HOUR, 10 * MIN, 1.0),  # steps twice as long, 10 min
])
def test_interference_charge_against_monte_carlo(tau, save, restore, mtbf, persist, slowdown):
    # First order, like the persist window: the model charges the slowdown to every
    # period, also the first after a restart (no persist in flight then), so it errs low.
    cost = CheckpointCost(save, restore, persist, slowdown)
    point = cadence.operating_point("t", tau, cost, mtbf)
    simulated, _ = simulate(tau, save, restore, mtbf, persist, slowdown=slowdown)
    assert point.goodput == pytest.approx(simulated, rel=0.03)


def test_interference_costs_goodput_and_lengthens_the_interval():
    base = CheckpointCost(1.0, 120.0, 600.0)
    slowed = CheckpointCost(1.0, 120.0, 600.0, interference=0.25)
    assert slowed.effective_save_s == pytest.approx(1.0 + 600 * 0.25 / 1.25)
    a, b = cadence.analyze(base, 3 * HOUR), cadence.analyze(slowed, 3 * HOUR)
    assert b.exact.goodput < a.exact.goodput
    assert b.exact.interval_s == pytest.approx(cadence.optimal_interval(121.0, 3 * HOUR))
    # The simulation tells the two apart by as much as the model does.
    tau = b.exact.interval_s
    gap = (simulate(tau, 1.0, 120.0, 3 * HOUR, 600.0)[0]
           - simulate(tau, 1.0, 120.0, 3 * HOUR, 600.0, slowdown=0.25)[0])
    model = (cadence.operating_point("a", tau, base, 3 * HOUR).goodput
             - cadence.operating_point("b", tau, slowed, 3 * HOUR).goodput)
    assert gap == pytest.approx(model, rel=0.25) and gap > 0.005


@pytest.fixture
def run(monkeypatch, capsys):
    monkeypatch.setattr(cli_module, "_register",
                        lambda: cli_module.cli.add_command(cadence_command))

    def invoke(*args: str) -> tuple[int, str, str]:
        rc = cli_module.main(["cadence", *args])
        out, err = capsys.readouterr()
        return rc, out, err

    return invoke


def _results(tmp_path, interference: float | None) -> str:
    """A run's records (synthetic: 8 ranks on one node, 5 iterations, 4 GB/s save per
    node, the persist; 8 GB/s restore) and its async summary: 0.5 s blocking for 2 GB of
    state per process."""
    node = 8 * PER_RANK
    records = synthetic.records(bytes_per_rank=PER_RANK, save_s=[node / 4e9] * 5,
                                restore_s=[node / 8e9] * 5, save_meta_s=0.0,
                                restore_meta_s=0.0)
    records.append({"type": "async_summary", "blocking_without_wait_s": {"median": 0.5},
                    "bytes_per_process": 2_000_000_000, "interference": interference})
    return synthetic.write(tmp_path / f"async-{interference}.jsonl", records)


def test_cadence_from_an_async_run(run, tmp_path):
    rc, out, err = run("--results", _results(tmp_path, 0.2), "--checkpoint-size", "2TB",
                       "--gpus", "2048", "--mtbf", "4h", "--json")
    assert rc == 0, err
    payload = json.loads(out)
    save = 2e12 / (4e9 * 256)  # the persist, scaled by the job model as a sync save is
    blocking = 0.5 * (2e12 / 2048) / 2e9  # 0.5 s per 2 GB -> 0.98 GB per GPU
    assert payload["cost"]["save_s"] == pytest.approx(blocking)
    assert payload["cost"]["persist_s"] == pytest.approx(save - blocking)
    assert payload["cost"]["interference"] == 0.2
    assert payload["floor_s"] == pytest.approx(save - blocking)  # one persist in flight
    assert payload["async"]["bytes_per_process"] == 2_000_000_000
    assert payload["job_model"]["inputs"]["target"]["nodes"] == 256
    # The same run's table says where the numbers come from.
    rc, out, err = run("--results", _results(tmp_path, 0.2), "--checkpoint-size", "2TB",
                       "--gpus", "2048", "--mtbf", "4h")
    assert rc == 0, err
    assert "asynchronous run" in out and "20 % slower while persisting" in out


def test_measured_interference_below_zero_is_charged_as_none_and_a_given_one_wins(run,
                                                                                  tmp_path):
    args = ("--checkpoint-size", "2TB", "--gpus", "2048", "--mtbf", "4h", "--json")
    rc, out, err = run("--results", _results(tmp_path, -0.03), *args)
    assert rc == 0, err
    assert json.loads(out)["cost"]["interference"] == 0.0
    rc, out, err = run("--results", _results(tmp_path, 0.2), "--interference", "5%", *args)
    assert json.loads(out)["cost"]["interference"] == pytest.approx(0.05)
    rc, out, err = run("--results", _results(tmp_path, 0.2), "--interference", "-1", *args)
    assert rc == 2 and "--interference '-1' must be >= 0" in err
    # A run whose load drifted so much that the interference was not measurable: 0,
    # and the table says why.
    rc, out, err = run("--results", _results(tmp_path, None), *args)
    assert json.loads(out)["cost"]["interference"] == 0.0
    rc, out, err = run("--results", _results(tmp_path, None), *args[:-1])
    assert rc == 0 and "interference not measurable in that run" in out
