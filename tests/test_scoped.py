"""The exact model of the stated rules (`cadence.scoped`): what it must hold whatever the
inputs (efficiency in [0, 1], a level the optimum leaves unused costs nothing, a failure a
copy survives does not fall back), and the refusals before any work.

Its agreement with an independent solve of the rules and with the simulation is in
tests/test_recovery_rules.py."""

from __future__ import annotations

import math

import pytest

from ckptbench.cadence import classes as fc
from ckptbench.cadence import formulas, scoped
from ckptbench.cadence import levels_job as lj
from ckptbench.cadence import multilevel as ml
from ckptbench.cadence import restart as rs
from ckptbench.cadence.multilevel import Level, Schedule
from ckptbench.cli import main
from ckptbench.errors import SpecError

WORKED = ["memory:1s:30s:process", "peer:3s:90s:node", "storage:51s:129s:job"]


def job_of(texts: list[str], gpus: int, classes: tuple[fc.FailureClass, ...] | None = None,
           none: bool = False) -> lj.LevelsJob:
    chosen = {s: "none" for s in fc.SCOPES} if none else rs.by_scope(())
    return lj.levels_job(texts, classes or fc.CLASS_PRESETS["llama3"][1], gpus, 8,
                         lj.Restarts(rs.MECHANISMS, chosen))


@pytest.mark.parametrize("rate", [1e-30, 1e-20, 1e-12, 1e-6, 1e-3, 1.0, 100.0])
@pytest.mark.parametrize("rules", ["stated", "scr"])
def test_efficiency_stays_in_zero_to_one_at_every_rate(rate: float, rules: str) -> None:
    """At tiny rates the closed forms used to cancel to noise (101.46 % at 1e-20, 128.57 %
    at 1e-30); now efficiency never passes the failure-free t / (t + C)."""
    levels = [Level("memory", 2, 60), Level("storage", 2, 60)]
    schedule = Schedule(75.0, (3,))
    free = 75.0 / 77.0
    if rules == "stated":
        e = scoped.efficiency(levels, [scoped.Kind(rate / 3600 * 1024, 1, 0.0)], schedule)
    else:
        e = ml.efficiency(levels, [0.0, rate / 3600 * 1024], schedule)
    assert 0.0 <= e <= free
    if rate <= 1e-12:
        assert e == pytest.approx(free, rel=1e-6)


@pytest.mark.parametrize("rate", [1e-30, 1e-20, 1e-9])
def test_one_level_is_dalys_model_at_tiny_rates_too(rate: float) -> None:
    m = 1.0 / rate
    e = scoped.efficiency([Level("s", 60, 100)], [scoped.Kind(rate, 0, 20)], Schedule(1000, ()))
    assert e <= 1000 / 1060
    assert e == pytest.approx(formulas.efficiency(1000, 60, 120, m), rel=1e-12)


def test_a_level_the_optimum_does_not_use_costs_nothing() -> None:
    """The issue's case: a cheap memory level the optimum leaves unused lowered SCR's
    optimum (91.52 % against 91.64 %), because it changed which restart each failure was
    charged. Under the stated rules a failure's restart is its own, and a memory copy
    taken with every peer save can only help."""
    without = job_of(["peer:0.3s:1s:node", "storage:222s:4s:job"], 16384)
    with_memory = job_of(["memory:0.1s:1s:process", "peer:0.3s:1s:node",
                          "storage:222s:4s:job"], 16384)
    a = lj.answer(without).answer.best.efficiency
    b = lj.answer(with_memory).answer.best.efficiency
    assert b >= a - 1e-9
    scr_a = lj.answer(without, "scr").answer.best.efficiency
    scr_b = lj.answer(with_memory, "scr").answer.best.efficiency
    assert scr_b < scr_a - 1e-3  # the reference model's flaw, kept as it is


def test_a_second_crashed_process_does_not_fall_back_from_node_memory() -> None:
    """Two identical levels, process failures only: under the stated rules the memory copy
    survives every failure, so any count is storage alone (92.09 %); SCR's rule sends a
    failure of a copy's own scope during its restore to the next level (91.12 %)."""
    levels = [Level("memory", 2, 60), Level("storage", 2, 60)]
    kinds = [scoped.Kind(2e-3 * 1024 / 3600, 0, 0.0)]
    alone = scoped.efficiency(levels[1:], [scoped.Kind(kinds[0].rate_per_s, 0, 0.0)],
                              Schedule(75, ()))
    for v in (0, 1, 14):
        assert scoped.efficiency(levels, kinds, Schedule(75, (v,))) == pytest.approx(alone,
                                                                                    rel=1e-12)
    assert round(100 * alone, 2) == 92.09
    assert round(100 * ml.efficiency(levels, [kinds[0].rate_per_s, 0.0],
                                     Schedule(75, (14,))), 2) == 91.12


def test_each_failure_pays_its_own_restart() -> None:
    """A software bug restarts in-process and reads node memory: its loss does not grow
    when the node's restart (a warm spare) grows, as it did under SCR's averaging."""
    base = job_of(WORKED, 16384)
    slow = lj.levels_job(WORKED, fc.CLASS_PRESETS["llama3"][1], 16384, 8,
                         lj.Restarts(rs.with_overrides(["warm-spare.reschedule=20min"]),
                                     rs.by_scope(())))
    schedule = Schedule(240.0, (0, 13))
    bug = [c.name for c in base.classes].index("software bug")
    a = scoped.breakdown(base.levels, base.kinds, schedule).by_kind[bug]
    b = scoped.breakdown(slow.levels, slow.kinds, schedule).by_kind[bug]
    assert a["restart"] == pytest.approx(b["restart"], rel=0.02)
    assert base.kinds[bug].restart_s == 20 and base.kinds[bug].need == 0


def test_the_loss_by_cause_adds_up_and_compute_is_what_the_schedule_keeps() -> None:
    job = job_of(WORKED, 131072)
    schedule = Schedule(90.0, (0, 11))
    found = scoped.breakdown(job.levels, job.kinds, schedule)
    assert found.efficiency == pytest.approx(scoped.efficiency(job.levels, job.kinds, schedule),
                                             rel=1e-12)
    assert math.fsum([found.efficiency, found.blocking, found.rework, found.restart,
                      found.restore]) == pytest.approx(1.0, abs=1e-12)
    # the saves of one period over its compute: what the failure-free run blocks
    saves = 11 * 3 + 51
    assert found.blocking / found.efficiency == pytest.approx(saves / (12 * 90), rel=1e-9)


def test_a_schedule_shorter_than_a_persist_is_refused_with_the_reason() -> None:
    levels = [Level("memory", 1, 30), Level("storage", 3, 129, persist_s=51)]
    with pytest.raises(SpecError, match="level storage is saved every 40 s of compute, shorter "
                                        "than its persist of 51 s"):
        scoped.efficiency(levels, [scoped.Kind(1e-4, 1, 600)], Schedule(20, (1,)))


def one_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc = main(list(args))
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (rc, out)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("command", "args", "needle"), [
    ("levels", ["--gpus", "0"], "--gpus 0: allowed: 1 to 16,777,216"),
    ("levels", ["--gpus", "33554432"], "--gpus 33554432: allowed: 1 to 16,777,216"),
    ("levels", ["--gpus", "1024", "--gpus-per-node", "0"], "--gpus-per-node 0: allowed"),
    ("levels", ["--gpus", "1024", "--failure-class", "x:job:1e30"],
     "allowed: a job MTBF of at least 1 min"),
    ("levels", ["--gpus", "1024", "--level", "memory:1e9s:30s:process"],
     "--level memory SAVE"),
    ("levels", ["--gpus", "1024", "--schedule", "75s:0"], "shorter than its persist"),
    ("simulate", ["--gpus", "1024", "--days", "0"], "--days 0: allowed"),
    ("simulate", ["--gpus", "1024", "--days", "5000"], "--days 5000: allowed"),
    ("simulate", ["--gpus", "1024", "--weibull-shape", "0.001"], "--weibull-shape"),
    ("simulate", ["--gpus", "1024", "--rules", "scr"], "--rules scr: allowed only"),
    ("simulate", ["--gpus", "1024", "--group-nodes", "0"], "--group-nodes 0"),
    ("levels", ["--gpus", "1024", "--peer-replicas", "0"], "--peer-replicas 0"),
    ("levels", ["--gpus", "1024", "--step-seconds", "0"], "--step-seconds"),
])
def test_unbounded_input_is_refused_before_work(command: str, args: list[str], needle: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    levels = ["--level", "memory:1s:30s:process", "--level", "storage:3s:129s:job:90s"]
    if not any(a.startswith("memory:1e9") for a in args):
        args = [*levels, *args]
    else:
        args = [*args, "--level", "storage:3s:129s:job"]
    if "--failure-class" not in args:
        args = [*args, "--failure-classes", "llama3"]
    assert needle in one_line(capsys, command, *args)
