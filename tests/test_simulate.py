"""The simulation of the stated recovery rules (docs/cadence.md, "The rules"): against
Daly's exact efficiency, against a plain one-replica reference written from the rules,
and rule by rule where a rule shows in what the run reads."""

from __future__ import annotations

import json
import math
import random
import re
import statistics

import numpy as np
import pytest

from ckptbench.cadence.multilevel import Level, Schedule
from ckptbench.errors import SpecError
from ckptbench.simulate import Failures, Topology, simulate

HOUR = 3600.0
DAY = 86400.0
STORAGE = [Level("storage", 60.0, 540.0)]
THREE = [Level("memory", 1.0, 30.0), Level("peer", 3.0, 90.0), Level("storage", 51.0, 129.0)]
THREE_SCOPES = ["process", "node", "job"]
NODES = Topology(2000)


def test_one_level_agrees_with_dalys_exact_efficiency() -> None:
    """One storage level, failures of any scope, restart R0: Daly's exact model with
    R = R0 + the restore (a failure during the restart or restore starts both again)."""
    tau, save, restore, restart, mtbf = 900.0, 60.0, 540.0, 60.0, HOUR
    run = simulate(STORAGE, ["job"], [Failures("all", 1 / mtbf, "node", restart)],
                   Schedule(tau, ()), 20 * DAY, NODES, replicas=400, seed=11)
    r = restart + restore
    exact = tau * math.exp(-r / mtbf) / (mtbf * math.expm1((tau + save) / mtbf))
    assert abs(run.mean - exact) < 3 * run.stderr
    assert run.stderr < 0.001
    assert run.failures_per_replica == pytest.approx(20 * 24, rel=0.03)
    assert run.restores_by_level["storage"] < run.failures_per_replica * 400


def test_a_process_failure_during_a_memory_restore_retries_memory() -> None:
    """Only processes fail: node memory always survives, so every restore reads memory,
    also one started again because a failure hit the restart or restore before it."""
    levels = [Level("memory", 1.0, 30.0), Level("storage", 50.0, 300.0)]
    run = simulate(levels, ["process", "job"], [Failures("software", 1 / 100.0, "process", 20.0)],
                   Schedule(60.0, (9,)), DAY, NODES, replicas=50, seed=12)
    completed = sum(run.restores_by_level.values())
    assert run.restores_by_level["storage"] == 0
    assert run.failures_per_replica * 50 > 1.3 * completed  # many restores were hit


def test_a_process_failure_after_a_peer_checkpoint_reads_memory() -> None:
    """Every checkpoint is a peer copy (v_1 = 0): the peer save leaves the memory copy,
    so a failure of processes reads memory, never the peer copy or storage."""
    run = simulate(THREE, THREE_SCOPES, [Failures("software", 1 / 600.0, "process", 20.0)],
                   Schedule(60.0, (0, 9)), DAY, NODES, replicas=20, seed=13)
    assert run.restores_by_level["memory"] > 1000
    assert run.restores_by_level["peer"] == 0 and run.restores_by_level["storage"] == 0


def test_a_second_node_failure_that_takes_the_holder_falls_back_to_storage() -> None:
    """A node failure reads the peer copy; a second one before the next peer save that
    takes the first node's holder (or the node whose holder it was) loses it. With two
    nodes and K = 1 that is every second such failure; with 2,000 nodes almost none."""
    node = [Failures("node", 1 / 600.0, "node", 150.0)]
    reads = {n: simulate(THREE, THREE_SCOPES, node, Schedule(60.0, (0, 9)), DAY,
                         Topology(n, peer_replicas=1), replicas=20, seed=14).restores_by_level
             for n in (2, 2000)}
    for counts in reads.values():
        assert counts["memory"] == 0
    two, many = reads[2], reads[2000]
    assert two["storage"] > 0.05 * sum(two.values())
    assert many["storage"] <= 0.003 * sum(many.values())
    assert many["peer"] > 1000


def test_a_group_failure_takes_the_peer_copy_but_not_a_group_copy() -> None:
    """The peer ring lies inside a group of 32 nodes (K = 1), so a group failure takes a
    part and its holder; a group-scope copy's holder lies in the other group."""
    levels = [Level("memory", 1.0, 30.0), Level("peer", 3.0, 90.0),
              Level("rack", 5.0, 100.0), Level("storage", 51.0, 129.0)]
    run = simulate(levels, ["process", "node", "group", "job"],
                   [Failures("switch", 1 / 1800.0, "group", 30.0)], Schedule(60.0, (0, 0, 9)),
                   DAY, Topology(64, group_nodes=32), replicas=20, seed=15)
    reads = run.restores_by_level
    assert reads["memory"] == 0 and reads["peer"] == 0
    assert reads["rack"] > 0.9 * sum(reads.values())


def test_a_failure_during_a_persist_loses_that_copy() -> None:
    """A failure inside the persist window (200 s after a save) rolls back one checkpoint
    more: about L more rework per failure (L times the failures after the first segment
    of a stretch; the restored checkpoint has no persist in flight)."""
    per_failure = {}
    for persist in (0.0, 200.0):
        level = [Level("storage", 2.0, 10.0, persist_s=persist)]
        run = simulate(level, ["job"], [Failures("all", 1 / HOUR, "process", 10.0)],
                       Schedule(300.0, ()), 20 * DAY, NODES, replicas=200, seed=16)
        per_failure[persist] = run.rework * run.wall_s / run.failures_per_replica
    extra = per_failure[200.0] - per_failure[0.0]
    after_first = math.exp(-302.0 / HOUR)  # a failure after the stretch's first segment
    assert extra == pytest.approx(200.0 * after_first, rel=0.1)


def test_the_slowdown_after_an_asynchronous_save() -> None:
    """No failures: the compute after each asynchronous save (not the first, after the
    start) takes L i / (1 + i) longer."""
    level = [Level("storage", 2.0, 10.0, persist_s=100.0, interference=0.25)]
    run = simulate(level, ["job"], [], Schedule(300.0, ()), DAY, NODES, replicas=2)
    segments = 1 + (DAY - 302.0) // 322.0
    useful = segments * 300.0 + min(DAY - 302.0 - (segments - 1) * 322.0, 300.0)
    assert run.goodput == (pytest.approx(useful / DAY, rel=1e-12),) * 2
    assert run.failures_per_replica == 0 and run.rework == run.restart == run.restore == 0


def test_weibull_of_shape_one_is_the_exponential() -> None:
    """Shape 1 (the classes pooled on one clock) and a shape of 1 + 1e-9 (a Weibull clock
    per class): the same process."""
    classes = [Failures("software", 0.3 / HOUR, "process", 20.0),
               Failures("node", 0.5 / HOUR, "node", 150.0),
               Failures("job", 0.1 / HOUR, "job", 600.0)]
    runs = [simulate(THREE, THREE_SCOPES, classes, Schedule(300.0, (2, 4)), 10 * DAY, NODES,
                     replicas=300, seed=17, shape=shape) for shape in (1.0, 1.0 + 1e-9)]
    combined = math.hypot(runs[0].stderr, runs[1].stderr)
    assert abs(runs[0].mean - runs[1].mean) < 3 * combined
    for run in runs:
        assert run.failures_per_replica == pytest.approx(10 * 24 * 0.9, rel=0.03)


def test_weibull_of_shape_one_half_keeps_the_mean_failure_count() -> None:
    run = simulate(STORAGE, ["job"], [Failures("all", 1 / HOUR, "node", 60.0)],
                   Schedule(900.0, ()), 20 * DAY, NODES, replicas=300, seed=18, shape=0.5)
    # a renewal process from time 0: t / mean + (cv^2 - 1) / 2, cv^2 = 5 at shape 1/2
    assert run.failures_per_replica == pytest.approx(20 * 24 + 2, rel=0.03)
    exponential = simulate(STORAGE, ["job"], [Failures("all", 1 / HOUR, "node", 60.0)],
                           Schedule(900.0, ()), 20 * DAY, NODES, replicas=300, seed=18)
    # clustered failures fall on restarts more often, and cost less in all
    assert run.mean > exponential.mean


LEVELS4 = [Level("memory", 1.0, 20.0), Level("peer", 3.0, 40.0),
           Level("rack", 5.0, 80.0, persist_s=150.0, interference=0.2),
           Level("storage", 10.0, 200.0, persist_s=400.0, interference=0.1)]
SCOPES4 = ["process", "node", "group", "job"]
CLASSES4 = [Failures("software", 1 / 2000.0, "process", 10.0),
            Failures("node", 1 / 1500.0, "node", 30.0, no_spare=0.5),
            Failures("switch", 1 / 6000.0, "group", 60.0, no_spare=0.5),
            Failures("dependency", 1 / 20000.0, "job", 100.0)]
SCHEDULE4 = Schedule(100.0, (1, 1, 1))
TOPOLOGY4 = Topology(6, group_nodes=2, peer_replicas=1)


def test_time_is_accounted_for_and_charged_to_classes() -> None:
    run = simulate(LEVELS4, SCOPES4, CLASSES4, SCHEDULE4, 2 * DAY, TOPOLOGY4, replicas=100,
                   seed=19, reshard_factor=1.5)
    lost = run.lost_by_replica
    for i, goodput in enumerate(run.goodput):
        total = goodput + sum(lost[k][i] for k in ("blocking", "rework", "restart", "restore"))
        assert total == pytest.approx(1.0, abs=1e-9)
        assert min(lost[k][i] for k in lost) >= 0
    for kind in ("rework", "restart", "restore"):
        charged = sum(c[kind] for c in run.by_class.values())
        assert charged == pytest.approx(getattr(run, kind), rel=1e-9)
    assert sum(c["failures_per_day"] for c in run.by_class.values()) * 2 == pytest.approx(
        run.failures_per_replica, rel=1e-9)
    assert run.overflowed == 0 and run.from_start == 0
    assert json.loads(json.dumps(run.to_dict()))["lost"]["restart"] == run.restart
    assert set(run.to_dict()) >= {"replicas", "wall_s", "goodput_mean", "goodput_ci99",
                                  "goodput_p5", "goodput_p95", "lost", "lost_by_class",
                                  "failures_per_replica", "restores_by_level"}


def test_where_no_copy_survives_the_run_starts_over() -> None:
    """A last level of node scope (no class is wider): with two nodes, a second node
    failure before the next peer save takes every part or its holder; the run then goes
    back to its start, a checkpoint that cannot be lost."""
    levels = [Level("memory", 1.0, 30.0), Level("peer", 3.0, 90.0)]
    run = simulate(levels, ["process", "node"], [Failures("node", 1 / 600.0, "node", 150.0)],
                   Schedule(60.0, (4,)), DAY, Topology(2), replicas=20, seed=23)
    assert run.from_start > 0 and run.restores_by_level["memory"] == 0
    for i, goodput in enumerate(run.goodput):
        total = goodput + sum(v[i] for v in run.lost_by_replica.values())
        assert total == pytest.approx(1.0, abs=1e-9)


def test_restarts_are_charged_by_the_classs_own_restart() -> None:
    classes = [Failures("software", 1 / (6 * HOUR), "process", 20.0),
               Failures("node", 1 / (6 * HOUR), "node", 150.0)]
    run = simulate(THREE, THREE_SCOPES, classes, Schedule(240.0, (0, 13)), 20 * DAY, NODES,
                   replicas=200, seed=20)
    software, node = run.by_class["software"], run.by_class["node"]
    per_failure = [c["restart"] / c["failures_per_day"] * DAY for c in (software, node)]
    assert per_failure[0] == pytest.approx(20.0, rel=0.02)
    assert per_failure[1] == pytest.approx(150.0, rel=0.02)


def test_a_restore_onto_fewer_nodes_takes_the_factor() -> None:
    """Share 1 with factor 1 is the plain run, failure for failure (the spares draw on a
    stream of their own); with factor 2 the restores take about twice as long."""
    def run(share: float, factor: float) -> object:
        classes = [Failures("node", 1 / HOUR, "node", 150.0, no_spare=share),
                   Failures("switch", 0.2 / HOUR, "group", 600.0, no_spare=share)]
        return simulate(THREE, THREE_SCOPES, classes, Schedule(240.0, (0, 13)), 10 * DAY,
                        NODES, replicas=200, seed=21, reshard_factor=factor)
    plain, same, slower = run(0.0, 1.0), run(1.0, 1.0), run(1.0, 2.0)
    assert same.goodput == plain.goodput  # type: ignore[attr-defined]
    assert slower.mean < plain.mean  # type: ignore[attr-defined]
    assert slower.restore == pytest.approx(2 * plain.restore, rel=0.1)  # type: ignore[attr-defined]


def test_no_failures_means_only_saves_are_lost() -> None:
    run = simulate(STORAGE, ["job"], [Failures("none", 0.0, "job", 600.0)], Schedule(940.0, ()),
                   DAY, NODES, replicas=3)
    assert run.failures_per_replica == 0 and run.rework == 0 and run.restore == 0
    assert run.mean == pytest.approx(940 / 1000, abs=1e-3)


def _call(**change: object) -> None:
    args: dict[str, object] = {
        "levels": THREE, "scopes": THREE_SCOPES, "schedule": Schedule(60.0, (1, 9)),
        "failures": [Failures("node", 1 / HOUR, "node", 150.0)], "wall_s": DAY,
        "topology": NODES, "replicas": 10}
    args.update(change)
    simulate(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("change", "message"), [
    (lambda: {"shape": 0.001}, "--weibull-shape 0.001: allowed: 0.2 to 10 (published"),
    (lambda: {"replicas": 0}, "--replicas 0: allowed: 1 to 100000"),
    (lambda: {"replicas": 100_000, "wall_s": 3650 * DAY}, "--replicas 100000 x --days 3.65e+03"),
    (lambda: {"wall_s": -1.0}, "--days = -1.0 must be > 0"),
    (lambda: {"wall_s": math.nan}, "--days = nan must be > 0"),
    (lambda: {"levels": [THREE[0], Level("peer", 3.0, 90.0, persist_s=200.0), THREE[2]]},
     "level peer: its interval 120 s is shorter than its persist 200 s"),
    (lambda: {"topology": Topology(0)}, "nodes = 0: allowed: an integer >= 1"),
    (lambda: {"topology": Topology(8, group_nodes=0)}, "--group-nodes = 0"),
    (lambda: {"topology": Topology(8, peer_replicas=0)}, "--peer-replicas = 0"),
    (lambda: {"scopes": ["node", "process", "job"]}, "each level must survive a wider scope"),
    (lambda: {"scopes": ["process", "node", "group"],
              "failures": [Failures("dependency", 1 / HOUR, "job", 600.0)]},
     "failure class dependency (scope job) is survived by no level"),
    (lambda: {"reshard_factor": 0.5}, "reshard factor = 0.5: allowed: a finite number >= 1"),
    (lambda: {"schedule": Schedule(60.0, (1,))}, "counts: 1 given"),
    (lambda: {"failures": [Failures("node", 1 / HOUR, "rack", 1.0)]}, "scope 'rack' is not"),
    (lambda: {"failures": [Failures("node", 1 / HOUR, "node", 1.0, no_spare=1.5)]},
     "not a probability"),
])
def test_bad_or_unbounded_input_is_refused_before_work(change: object, message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)) as info:
        _call(**change())  # type: ignore[operator]
    assert "\n" not in str(info.value)


# --- a plain reference: one replica, checkpoint by checkpoint, nodes as Python sets ------


class _Reference:
    """The rules of docs/cadence.md played out literally for one replica, checkpoint by
    checkpoint (exponential failures, nodes as sets): the shares of wall time, and the
    restores completed by level."""

    def __init__(self, levels: list[Level], scopes: list[str], classes: list[Failures],
                 schedule: Schedule, topology: Topology, factor: float) -> None:
        self.levels, self.scopes, self.classes = levels, scopes, classes
        self.t, self.topology, self.factor = schedule.compute_s, topology, factor
        self.per = [1]
        for v in schedule.counts:
            self.per.append(self.per[-1] * (v + 1))
        self.slow = [lv.persist_s * lv.interference / (1 + lv.interference) for lv in levels]

    def due(self, j: int) -> int:
        """The level saved at the end of segment j."""
        return max(k for k in range(len(self.levels)) if j % self.per[k] == 0)

    def holders(self, m: int, scope: str) -> set[int]:
        n, k = self.topology.nodes, self.topology.peer_replicas
        if scope == "process":
            return {m}
        step = 1 if scope == "node" else self.topology.group_nodes
        return {(m + i * step) % n for i in range(k + 1)}

    def run(self, wall: float, seed: int) -> dict[str, float]:
        self.rng = random.Random(seed)
        self.total = sum(c.rate_per_s for c in self.classes)
        self.copies = [{"pos": 0, "kept": 0.0, "taken": set(), "whole": True}
                       for _ in self.levels]
        self.pending: list[tuple[int, float, float] | None] = [None] * len(self.levels)
        self.lost = {"rework": 0.0, "restart": 0.0, "restore": 0.0}
        self.reads = [0] * len(self.levels)
        self.next_fail = self.rng.expovariate(self.total)
        self.restarting, self.fresh, self.fewer = False, True, False
        self.pos, self.start, self.kept = 0, 0.0, 0.0  # position, phase start, kept at pos
        self.restart_len = self.length = 0.0
        self.source = 0
        while True:
            step = self._restart_step(wall) if self.restarting else self._compute_step(wall)
            if step is not None:
                useful, final = step
                break
        return {"goodput": useful / wall, "blocking": (final - useful) / wall,
                **{kind: v / wall for kind, v in self.lost.items()},
                **{lv.name: float(r) for lv, r in zip(self.levels, self.reads, strict=True)}}

    def _compute_step(self, wall: float) -> tuple[float, float] | None:
        j = self.pos + 1
        slowed = 0.0 if self.fresh else self.slow[self.due(self.pos)]
        seg_end = self.start + self.t + slowed + self.levels[self.due(j)].save_s
        persisted = min((p[2] for p in self.pending if p), default=math.inf)
        event = min(self.next_fail, seg_end, persisted, wall)
        if event == wall:
            return self.pos * self.t + min(wall - self.start, self.t), \
                self.kept + wall - self.start
        if event == persisted:
            k = next(i for i, p in enumerate(self.pending) if p and p[2] == persisted)
            pos, kept, _ = self.pending[k]  # type: ignore[misc]
            self.copies[k] = {"pos": pos, "kept": kept, "taken": set(), "whole": True}
            self.pending[k] = None
        elif event == seg_end:
            self.pos, self.kept = j, self.kept + seg_end - self.start
            for k in range(self.due(j) + 1):
                if self.levels[k].persist_s == 0:
                    self.copies[k] = {"pos": j, "kept": self.kept, "taken": set(),
                                      "whole": True}
                else:
                    self.pending[k] = (j, self.kept, seg_end + self.levels[k].persist_s)
            self.start, self.fresh = seg_end, False
        else:
            self._fail(self.kept + self.next_fail - self.start)
        return None

    def _restart_step(self, wall: float) -> tuple[float, float] | None:
        event = min(self.next_fail, self.start + self.length, wall)
        elapsed = event - self.start
        self.lost["restart"] += min(elapsed, self.restart_len)
        self.lost["restore"] += elapsed - min(elapsed, self.restart_len)
        if event == wall:
            return self.pos * self.t, self.kept
        if event == self.start + self.length:
            self.reads[self.source] += 1
            self.restarting, self.fresh, self.start = False, True, event
        else:
            self._fail(self.kept)
        return None

    def _fail(self, kept_at: float) -> None:
        now, n, g = self.next_fail, self.topology.nodes, self.topology.group_nodes
        c = self.rng.choices(self.classes, [c.rate_per_s for c in self.classes])[0]
        self.next_fail = now + self.rng.expovariate(self.total)
        self.pending = [None] * len(self.levels)
        taken: set[int] = set()
        if c.scope == "node":
            taken = {self.rng.randrange(n)}
        elif c.scope == "group":
            b = self.rng.randrange(-(-n // g))
            taken = set(range(b * g, min(b * g + g, n)))
        elif c.scope == "job":
            taken = set(range(n))
        for copy, scope in zip(self.copies, self.scopes, strict=True):
            if scope != "job" and copy["whole"]:
                copy["taken"] |= taken
                if any(self.holders(m, scope) <= copy["taken"] for m in range(n)):
                    copy["whole"] = False
        best = max(range(len(self.levels)),
                   key=lambda i: (self.copies[i]["whole"], self.copies[i]["pos"], -i))
        assert self.copies[best]["whole"]
        self.lost["rework"] += kept_at - self.copies[best]["kept"]
        self.fewer = self.rng.random() < c.no_spare or (self.fewer and self.restarting)
        self.pos, self.kept, self.source = self.copies[best]["pos"], \
            self.copies[best]["kept"], best
        self.restarting, self.start, self.restart_len = True, now, c.restart_s
        self.length = c.restart_s + self.levels[best].restore_s * (
            self.factor if self.fewer else 1.0)


def test_the_simulation_agrees_with_a_plain_reference_of_the_rules() -> None:
    """Four levels (two asynchronous, with interference), every scope of failure, six
    nodes in groups of two (so parts and holders are often taken together), restores
    onto fewer nodes: the lockstep simulation and a literal one-replica reference agree
    on every share of wall time and on what restores read."""
    wall, factor = DAY, 1.5
    reference = _Reference(LEVELS4, SCOPES4, CLASSES4, SCHEDULE4, TOPOLOGY4, factor)
    ref = [reference.run(wall, seed) for seed in range(150)]
    run = simulate(LEVELS4, SCOPES4, CLASSES4, SCHEDULE4, wall, TOPOLOGY4, replicas=2000,
                   seed=22, reshard_factor=factor)
    ours = {"goodput": run.goodput, **run.lost_by_replica}
    for kind, values in ours.items():
        theirs = [r[kind] for r in ref]
        se = math.hypot(statistics.stdev(values) / math.sqrt(len(values)),
                        statistics.stdev(theirs) / math.sqrt(len(theirs)))
        assert abs(statistics.mean(values) - statistics.mean(theirs)) < 4 * se, kind
    reads = np.array([sum(r[lv.name] for r in ref) for lv in LEVELS4])
    mine = np.array([run.restores_by_level[lv.name] for lv in LEVELS4], dtype=float)
    assert np.allclose(mine / mine.sum(), reads / reads.sum(), atol=0.02)
    assert all(mine > 0)
