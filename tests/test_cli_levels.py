"""`ckptbench levels` as a user runs it: a real subprocess, JSON and text, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptbench.cadence import classes as fc
from ckptbench.cadence import formulas, scoped
from ckptbench.cadence import levels_job as lj
from ckptbench.cadence import multilevel as ml
from ckptbench.cadence import restart as rs
from ckptbench.cli import main

ROOT = Path(__file__).resolve().parent.parent
THREE = ["--level", "memory:3s:30s:process", "--level", "peer:5s:90s:node",
         "--level", "storage:60s:15min:job"]
NO_RESTART = [a for scope in ("process", "node", "group", "job")
              for a in ("--restart", f"{scope}=none")]


def levels(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", "levels", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def one_line_error(capsys: pytest.CaptureFixture[str], command: str, *args: str) -> str:
    """main() in this process (the subprocess tests cover the entry point)."""
    rc = main([command, *args])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (rc, out)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_the_llama3_classes_are_the_419_interruptions_of_54_days() -> None:
    _, preset = fc.CLASS_PRESETS["llama3"]
    rates = fc.severity_rates(["job"], preset, 16_384, 8)
    assert rates[0] * 54 * 86_400 == pytest.approx(419)
    by_level = fc.severity_rates(["process", "node", "job"], preset, 16_384, 8)
    process, node, rest = (r * 54 * 86_400 for r in by_level)
    assert process == pytest.approx(61) and rest == pytest.approx(37)
    assert process + node + rest == pytest.approx(419)


@pytest.mark.parametrize(("preset", "per_1k_node_days"), [("rsc1", 6.50), ("rsc2", 2.34)])
def test_the_rsc_classes_are_the_papers_node_failure_rates(preset: str,
                                                            per_1k_node_days: float) -> None:
    """Kokolis et al.: failures per 1,000 node-days, all taking their node: a copy in node
    memory never survives them, a peer copy does."""
    _, classes = fc.CLASS_PRESETS[preset]
    nodes = 2048  # 16,384 GPUs, 8 per node
    per_day = fc.severity_rates(["job"], classes, 16_384, 8)[0] * 86_400
    assert per_day == pytest.approx(per_1k_node_days * nodes / 1000)
    memory, peer = fc.severity_rates(["process", "node"], classes, 16_384, 8)
    assert memory == 0 and peer * 86_400 == pytest.approx(per_day)
    r = levels(*THREE, "--failure-classes", preset, "--gpus", "16384", "--json", *NO_RESTART)
    assert r.returncode == 0, r.stderr
    rates = [x["failure_rate_per_s"] for x in json.loads(r.stdout)["levels"]]
    assert rates[0] == 0 and rates[1] * 86_400 == pytest.approx(per_day)


def _stated(*args: str, schedule: str | None = None) -> tuple[lj.LevelsJob, ml.Schedule | None]:
    """The job the CLI builds for THREE and llama3 at 16,384 GPUs (restarts none)."""
    texts = ["memory:3s:30s:process", "peer:5s:90s:node", "storage:60s:15min:job"]
    restarts = lj.Restarts(rs.MECHANISMS, {s: "none" for s in fc.SCOPES})
    job = lj.levels_job(texts, fc.CLASS_PRESETS["llama3"][1], 16384, 8, restarts, schedule)
    return job, job.schedule


def test_json_gives_the_optimum_the_named_schedule_and_storage_alone() -> None:
    r = levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384", "--schedule", "5min:3,5",
               "--json", *NO_RESTART)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["rules"] == "stated"
    job, schedule = _stated(schedule="5min:3,5")
    assert schedule == ml.Schedule(300, (3, 5))
    lv = [ml.Level(x["name"], x["save_s"], x["restore_s"]) for x in out["levels"]]
    assert lv == list(job.levels)  # the copies' restores: each failure adds its own restart
    named = out["schedule"]
    assert named["compute_s"] == 300 and named["counts"] == [3, 5]
    assert named["efficiency"] == pytest.approx(scoped.efficiency(lv, job.kinds, schedule),
                                                rel=1e-12)
    best = out["optimum"]
    assert best["efficiency"] >= named["efficiency"]
    assert best["efficiency"] == pytest.approx(scoped.efficiency(
        lv, job.kinds, ml.Schedule(best["compute_s"], tuple(best["counts"]))), rel=1e-12)
    alone = out["last_level_only"]
    rates = [x["failure_rate_per_s"] for x in out["levels"]]
    mtbf = 1.0 / sum(rates)
    assert alone["efficiency"] == pytest.approx(
        formulas.efficiency(formulas.optimal_interval(60, mtbf), 60, 900, mtbf), rel=1e-9)
    assert best["efficiency"] > alone["efficiency"]
    # SCR's rules, on request, are LLNL's model of the same inputs
    r = levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384", "--schedule",
               "5min:3,5", "--json", "--rules", "scr", *NO_RESTART)
    scr = json.loads(r.stdout)
    assert scr["rules"] == "scr" and scr["other_rules"]["rules"] == "stated"
    assert scr["schedule"]["efficiency"] == pytest.approx(
        ml.efficiency(lv, rates, ml.Schedule(300, (3, 5))), rel=1e-12)
    assert scr["other_rules"]["optimum"] == best


def test_text_names_each_level_and_the_schedule() -> None:
    r = levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["memory", "peer", "storage"]
    assert sorted(line.split()[1] for line in lines[3:6]) == ["in-process", "replacement",
                                                             "warm-spare"]
    assert all(line.startswith("restart ") and "detect" in line for line in lines[3:6])
    assert lines[6].startswith("optimum (stated rules)")
    assert "then 1 peer" in lines[6] and "then 1 storage" in lines[6] and "efficiency" in lines[6]
    assert lines[7].startswith("storage alone")
    assert lines[8] == "at the optimum, per level:"
    assert [line.split()[0] for line in lines[9:12]] == ["memory", "peer", "storage"]
    assert lines[12].startswith("time lost (stated rules, exact): saves ")
    by_class = {line.split("  ")[1].strip() for line in lines[14:]
                if line.startswith("  ") and "/day" in line}
    assert by_class == {name for name, _, _ in fc.LLAMA3_CAUSES}


def test_planning_figures_per_level_and_per_class() -> None:
    """Each level's interval in compute, wall clock and steps; what it needs per node;
    failures per day by class and their loss by cause, adding up to the whole loss."""
    out = json.loads(levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384",
                            "--schedule", "5min:3,5", "--step-seconds", "6s",
                            "--node-state", "2GB", "--peer-replicas", "2", "--json").stdout)
    memory, peer, storage = out["per_level"]
    assert memory["interval_compute_s"] == 300 and memory["interval_wall_s"] == 303
    assert peer["interval_compute_s"] == 1200 and peer["interval_wall_s"] == 1200 + 3 * 3 + 5
    assert storage["interval_compute_s"] == 7200
    # 24 segments: 18 end with a memory save, 5 with a peer one, the last with storage
    assert storage["interval_wall_s"] == 7200 + 18 * 3 + 5 * 5 + 60
    assert [x["interval_steps"] for x in out["per_level"]] == [50, 200, 1200]
    assert memory["host_memory_bytes_per_node"] == 4e9 and memory["network_bytes_per_s_per_node"] == 0
    assert peer["host_memory_bytes_per_node"] == 8e9
    assert peer["network_bytes_per_s_per_node"] == pytest.approx(2 * 2e9 / 1214)
    assert storage["network_bytes_per_s_per_node"] == pytest.approx(2e9 / 7339)
    per_day = out["failures_per_day_by_class"]
    assert sum(per_day.values()) == pytest.approx(419 / 54)
    lost = out["lost"]
    by_class = out["lost_by_class"]
    for cause in ("rework", "restart", "restore"):
        assert sum(c["lost"][cause] for c in by_class) == pytest.approx(lost[cause], rel=1e-9)
    total = lost["efficiency"] + lost["blocking"] + lost["rework"] + lost["restart"] \
        + lost["restore"]
    assert total == pytest.approx(1.0, abs=1e-12)
    assert lost["efficiency"] == pytest.approx(out["schedule"]["efficiency"], rel=1e-12)
    reads = {c["class"]: (c["reads"], c["restart"]) for c in by_class}
    assert reads["software bug"] == ("memory", "in-process")
    assert reads["faulty GPU"] == ("peer", "warm-spare")
    assert reads["network switch/cable"] == ("storage", "replacement")


@pytest.mark.parametrize(("args", "needle"), [
    (["--level", "memory:3s:process"], "--level 'memory:3s:process': allowed: NAME:SAVE"),
    (["--level", "memory:3s:30s:rack"], "scope 'rack' is not known"),
    (["--level", "a:3s:30s:node", "--level", "b:5s:60s:process"], "wider scope"),
    (["--level", "memory:3s:30s:process", "--level", "peer:5s:90s:node"],
     "network switch/cable (scope group) is survived by no level"),
    ([*THREE, "--schedule", "5min:3"], "1 counts given; allowed: one per level below the top (2)"),
    ([*THREE, "--schedule", "5min:a,b"], "allowed: DUR[:V1,V2,...]"),
    (["--level", "storage:-1s:30s:job"], "--level storage SAVE"),
    (["--level", "storage:3s:30s:job:51s:150%"], "--level storage INTERFERENCE '150%'"),
    (["--level", "storage:3s:30s:job:x"], "--level storage PERSIST"),
    (["--level", "a:1s:1s:job:1s:1%:extra"], "allowed: NAME:SAVE:RESTORE:SCOPE[:PERSIST"),
])
def test_bad_input_is_one_line(args: list[str], needle: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert needle in one_line_error(capsys, "levels", *args, "--failure-classes", "llama3",
                                    "--gpus", "16384")


@pytest.mark.parametrize(("args", "needle"), [
    (["--failure-classes", "nope"], "--failure-classes 'nope' is not known; allowed: llama3"),
    ([], "failure classes are required"),
    (["--failure-class", "gpu:node:x"], "allowed: NAME:SCOPE:RATE[:UNIT]"),
    (["--failure-class", "gpu:node:1e-5:rack"], "unit 'rack' is not known"),
    (["--failure-class", "gpu:node:-1"], "rate = -1.0 must be >= 0"),
])
def test_bad_classes_are_one_line(args: list[str], needle: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert needle in one_line_error(capsys, "levels", *THREE, *args, "--gpus", "16384")


def test_user_classes_add_to_a_preset() -> None:
    base = json.loads(levels(*THREE, "--failure-classes", "llama3", "--gpus", "1024",
                             "--json").stdout)
    more = json.loads(levels(*THREE, "--failure-classes", "llama3", "--gpus", "1024", "--json",
                             "--failure-class", "rack:group:0.01:job").stdout)
    added = more["levels"][2]["failure_rate_per_s"] - base["levels"][2]["failure_rate_per_s"]
    assert added == pytest.approx(0.01 / 3600)


def test_simulate_runs_the_optimum_and_agrees_with_the_model() -> None:
    r = subprocess.run([sys.executable, "-m", "ckptbench", "simulate", *THREE,
                        "--failure-classes", "llama3", "--gpus", "16384", "--days", "20",
                        "--replicas", "200", "--seed", "3", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    best = json.loads(levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384",
                             "--json").stdout)["optimum"]
    assert out["schedule"] == {"compute_s": best["compute_s"], "counts": best["counts"]}
    assert out["rules"] == "stated" and out["topology"]["nodes"] == 2048
    # node draws: a second lost node takes a peer copy's last holder about 1 in 2,048 times
    assert abs(out["goodput_mean"] - out["exact_efficiency"]) < out["goodput_ci99"] + 2e-4
    assert out["exact_efficiency"] == pytest.approx(best["efficiency"])
    assert out["goodput_p5"] < out["goodput_mean"] < out["goodput_p95"]
    assert set(out["lost_by_class"]) == {name for name, _, _ in fc.LLAMA3_CAUSES}
    assert set(out["restores_by_level"]) == {"memory", "peer", "storage"}


@pytest.mark.parametrize(("gpus", "schedule"), [(16384, None), (131072, None)])
def test_the_worked_example_levels_within_a_third_of_a_point_of_simulate(
        gpus: int, schedule: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/cadence.md's worked example: the exact model at its optimum against the
    simulation, node draws and all, at the same schedule (200 runs of 54 days)."""
    worked = ["--level", "memory:1s:30s:process", "--level", "peer:3s:90s:node",
              "--level", "storage:51s:129s:job", "--failure-classes", "llama3", "--gpus",
              str(gpus)]
    assert main(["levels", *worked, "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["optimum"]
    assert main(["simulate", *worked, "--replicas", "200", "--seed", "1", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["schedule"]["counts"] == best["counts"]
    assert abs(sim["goodput_mean"] - best["efficiency"]) < 0.003
    assert sim["goodput_ci99"] < 0.003


def test_simulate_text_and_a_bound(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", *THREE, "--failure-classes", "llama3", "--gpus", "1024",
               "--days", "5", "--replicas", "20", "--schedule", "10min:2,6"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "goodput over 20 runs of 5 days" in out and "lost by class" in out
    err = one_line_error(capsys, "simulate", *THREE, "--failure-classes", "llama3", "--gpus",
                         "1024", "--days", "3650", "--replicas", "100000")
    assert "events" in err and "fewer replicas or a shorter run" in err


def _simulated(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    rc = main(["simulate", *THREE, "--failure-classes", "llama3", "--gpus", "16384", "--days",
               "5", "--replicas", "50", "--schedule", "10min:2,6", "--json", *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def test_restarts_onto_fewer_nodes_cost_the_resharded_restore(
        capsys: pytest.CaptureFixture[str]) -> None:
    """No spare for node and group failures: their restores take FACTOR times as long;
    a factor of 1 (or no share) is the plain run, failure for failure."""
    plain = _simulated(capsys)
    assert _simulated(capsys, "--fewer-nodes", "0.5:1")["goodput_mean"] == plain["goodput_mean"]
    assert _simulated(capsys, "--fewer-nodes", "0:3")["goodput_mean"] == plain["goodput_mean"]
    fewer = _simulated(capsys, "--fewer-nodes", "1:3")
    assert fewer["lost"]["restore"] > plain["lost"]["restore"]
    assert fewer["goodput_mean"] < plain["goodput_mean"] and fewer["exact_efficiency"] is None
    assert plain["exact_efficiency"] is not None
    # software faults (process scope) lose no node: each still restarts in-process (20 s)
    bug, plain_bug = fewer["lost_by_class"]["software bug"], plain["lost_by_class"]["software bug"]
    assert bug["restart"] / bug["failures_per_day"] == pytest.approx(
        plain_bug["restart"] / plain_bug["failures_per_day"], rel=0.05)
    for bad in ("2:1.5", "0.5", "0.5:0.9", "x:y", "0.5:inf"):
        assert "--fewer-nodes" in one_line_error(capsys, "simulate", *THREE, "--failure-classes",
                                                 "llama3", "--gpus", "1024", "--fewer-nodes", bad)


def test_restarts_are_added_by_the_mechanism_of_each_failures_scope() -> None:
    """Default mechanisms: in-process for process faults, a warm spare for a lost node, a
    replacement for group and job failures. Under the stated rules each failure pays its
    own; SCR's rules (--rules scr) give each level's restore the rate-weighted mean of the
    failures that need it."""
    out = json.loads(levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384",
                            "--json").stdout)
    bare = json.loads(levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384",
                             "--json", *NO_RESTART).stdout)
    restarts = out["restarts"]
    m = restarts["mechanisms"]
    assert restarts["by_scope"] == {"process": "in-process", "node": "warm-spare",
                                    "group": "replacement", "job": "replacement"}
    assert m["in-process"]["seconds"] == 20 and m["warm-spare"]["seconds"] == 150
    assert m["replacement"]["seconds"] == 600 and "arXiv" in m["replacement"]["source"]
    assert restarts["restart_s_per_level_scr"] == pytest.approx([20, 150, 600])
    assert out["levels"] == bare["levels"]  # the copies' restores, restarts apart
    assert out["optimum"]["efficiency"] < bare["optimum"]["efficiency"]
    by_class = {c["class"]: c for c in out["lost_by_class"]}
    assert by_class["software bug"]["restart"] == "in-process"
    assert by_class["faulty GPU"]["restart"] == "warm-spare"
    # storage alone: every failure restores from storage, each after its own restart
    rates = {"process": 61, "node": 321, "group": 35, "job": 2}
    mean = (61 * 20 + 321 * 150 + 37 * 600) / 419
    assert sum(rates.values()) == 419
    alone = out["last_level_only"]
    mtbf = 54 * 86400 / 419
    daly = formulas.efficiency(alone["compute_s"], 60, 900 + mean, mtbf)
    assert alone["efficiency"] == pytest.approx(daly, rel=1e-3)
    scr = json.loads(levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384",
                            "--json", "--rules", "scr").stdout)
    for with_restart, without, extra in zip(scr["levels"], bare["levels"], [20, 150, 600],
                                            strict=True):
        assert with_restart["restore_s"] == pytest.approx(without["restore_s"] + extra)
    alone = scr["last_level_only"]
    assert alone["efficiency"] == pytest.approx(formulas.efficiency(
        alone["compute_s"], 60, 900 + mean, mtbf), rel=1e-9)


def test_restart_mechanisms_and_parts_can_be_changed() -> None:
    out = json.loads(levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384", "--json",
                            "--restart", "node=in-process", "--restart-part",
                            "in-process.detect=40s").stdout)
    m = out["restarts"]["mechanisms"]["in-process"]
    assert m["detect"] == 40 and m["seconds"] == 50 and "detect given" in m["source"]
    assert out["restarts"]["restart_s_per_level_scr"][:2] == pytest.approx([50, 50])


@pytest.mark.parametrize(("args", "needle"), [
    (["--restart", "rack=none"], "--restart 'rack=none': allowed: SCOPE=MECHANISM"),
    (["--restart", "node=reboot"], "MECHANISM in-process|warm-spare|replacement|none"),
    (["--restart-part", "warm-spare.boot=1s"], "PART detect|reschedule|start|warmup"),
    (["--restart-part", "warm-spare.detect=-1s"], "--restart-part warm-spare.detect"),
])
def test_bad_restart_options_are_one_line(args: list[str], needle: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert needle in one_line_error(capsys, "levels", *THREE, "--failure-classes", "llama3",
                                    "--gpus", "16384", *args)


def test_plots_are_written_with_the_answer_in_their_title(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    from PIL import Image

    curves, hist = tmp_path / "levels.png", tmp_path / "sim.png"
    assert main(["levels", *THREE, "--failure-classes", "llama3", "--gpus", "16384",
                 "--plot", str(curves)]) == 0
    text = capsys.readouterr().out
    title = Image.open(curves).text["Title"]
    optimum_line = next(line for line in text.splitlines() if line.startswith("optimum "))
    assert optimum_line.split("rules): ")[1].split(" ->")[0] in title
    assert "stated rules" in title
    assert main(["simulate", *THREE, "--failure-classes", "llama3", "--gpus", "1024",
                 "--days", "3", "--replicas", "30", "--plot", str(hist)]) == 0
    capsys.readouterr()
    assert "30 runs of 3 days" in Image.open(hist).text["Title"]
    # an existing plot is refused before any work, and --force replaces it
    err = one_line_error(capsys, "simulate", *THREE, "--failure-classes", "llama3", "--gpus",
                         "1024", "--days", "3650", "--replicas", "100000", "--plot", str(hist))
    assert "exists there" in err
    assert main(["levels", *THREE, "--failure-classes", "llama3", "--gpus", "1024",
                 "--plot", str(curves), "--force"]) == 0
    assert "1024 GPUs" in Image.open(curves).text["Title"]


def test_failure_classes_from_a_toml_file(tmp_path: Path) -> None:
    classes = tmp_path / "classes.toml"
    classes.write_text('source = "our cluster, 2026"\n'
                       '[[class]]\nname = "xid"\nscope = "node"\nrate = 2e-5\n'
                       '[[class]]\nname = "fabric"\nscope = "group"\nrate = 0.01\nunit = "job"\n')
    out = json.loads(levels("--level", "peer:3s:90s:node", "--level", "storage:60s:10min:job",
                            "--failure-classes", str(classes), "--gpus", "1024", "--json",
                            *NO_RESTART).stdout)
    rates = [lv["failure_rate_per_s"] for lv in out["levels"]]
    assert rates == pytest.approx([2e-5 * 1024 / 3600, 0.01 / 3600])


@pytest.mark.parametrize(("body", "needle"), [
    ("[[class]]\nname = 'x'\nscope = 'node'\nrate = 'often'\n", "rate = 'often' must be a number"),
    ("[[class]]\nname = 'x'\nscope = 'rack'\nrate = 1.0\n", "scope 'rack' is not known"),
    ("[[class]]\nname = 'x'\nscope = 'node'\nrate = 1.0\nmtbf = 3\n", "unknown key 'mtbf'"),
    ("[failures]\n", "unknown key 'failures'"),
    ("class = 3\n", "allowed: 1 to 1000 [[class]] tables"),
    ("[[class]\n", "not TOML"),
])
def test_a_bad_classes_file_is_one_line(tmp_path: Path, body: str, needle: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    classes = tmp_path / "classes.toml"
    classes.write_text(body)
    assert needle in one_line_error(capsys, "levels", *THREE, "--failure-classes", str(classes),
                                    "--gpus", "16")


def test_a_classes_file_that_is_a_fifo_is_refused_without_waiting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    fifo = tmp_path / "classes.toml"
    os.mkfifo(fifo)
    assert "is a FIFO" in one_line_error(capsys, "levels", *THREE, "--failure-classes",
                                         str(fifo), "--gpus", "16")


def test_a_runs_measured_start_sets_the_relaunches_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run records what a restart's start costs here (process start and imports, the
    ranks' set-up); --measured-start puts it in the relaunches' start part, and an
    explicit --restart-part still wins."""
    results = tmp_path / "r.jsonl"
    r = subprocess.run([sys.executable, "-m", "ckptbench", "run", str(ROOT / "workloads" /
                        "tiny.toml"), "--target", str(tmp_path / "t"), "--results",
                        str(results), "--no-restore", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    (start,) = [json.loads(line) for line in results.read_text().splitlines()
                if json.loads(line)["type"] == "startup"]
    measured = start["process_start_and_imports_s"] + start["ranks_set_up_s"]
    assert 0 < measured < 600
    out = json.loads(levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384", "--json",
                            "--measured-start", str(results)).stdout)
    plain = json.loads(levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384",
                              "--json").stdout)
    mech, before = out["restarts"]["mechanisms"], plain["restarts"]["mechanisms"]
    for name in ("warm-spare", "replacement"):
        assert mech[name]["start"] == pytest.approx(measured)
        assert mech[name]["seconds"] == pytest.approx(
            before[name]["seconds"] - before[name]["start"] + measured)
        assert "measured by" in mech[name]["source"]
    assert mech["in-process"] == before["in-process"]
    given = json.loads(levels(*THREE, "--failure-classes", "llama3", "--gpus", "16384", "--json",
                              "--measured-start", str(results), "--restart-part",
                              "warm-spare.start=7s").stdout)["restarts"]["mechanisms"]
    assert given["warm-spare"]["start"] == 7.0
    no_start = tmp_path / "old.jsonl"
    no_start.write_text("".join(line + "\n" for line in results.read_text().splitlines()
                                if '"startup"' not in line))
    for bad in (no_start, tmp_path / "missing.jsonl"):
        assert str(bad) in one_line_error(capsys, "levels", *THREE, "--failure-classes",
                                          "llama3", "--gpus", "1024", "--measured-start",
                                          str(bad))

