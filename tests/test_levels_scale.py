"""A tiered run's levels scaled from the run's size to the job's (cadence.levels_scale):
a case computed by hand, the measured levels back when the job is the run, twice the
bytes per node twice the time, the scaled figures beside the measured ones in `levels`
and `report`, and one-line errors (exit 2) for bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ckptbench.cadence.job import job_target, run_job
from ckptbench.cadence.levels_job import parse_level
from ckptbench.cadence.levels_report import tier_cadences
from ckptbench.cadence.levels_scale import (
    NODE_NETWORK_BPS,
    JobSize,
    RunTiers,
    TierScaling,
    parse_network,
    scale,
    tier_scaling,
)
from ckptbench.cli import main
from ckptbench.errors import SpecError
from ckptbench.jobmodel import estimate, uniform
from ckptbench.jobmodel.measured import read_results
from ckptbench.report import load
from ckptbench.spec import load_workload
from ckptbench.units import format_duration

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "workloads" / "tiny.toml"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "CKPTBENCH_PROGRESS": "off"}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=ENV, check=False)


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tiered run: the tiny workload's 4 processes as 2 nodes of 2, memory copies
    in /dev/shm, one replica over TCP, storage every checkpoint."""
    tmp = tmp_path_factory.mktemp("tiered")
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    memory = Path(tempfile.mkdtemp(prefix="ckptbench-test-", dir=shm))
    try:
        proc = run("run", str(TINY), "--target", str(tmp / "t"), "--results",
                   str(tmp / "r.jsonl"), "--memory-dir", str(memory), "--tiers",
                   "memory,peer,storage", "--ranks-per-node", "2", "--iterations", "2",
                   "--storage-every", "1")
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        shutil.rmtree(memory, ignore_errors=True)
    return tmp / "r.jsonl"


def test_a_case_computed_by_hand() -> None:
    """1 GB per node at the run, 4 GB at the job; the run's plain transfer moved a node's
    bytes in 1.6 s (0.625 GB/s), the job's network is 400 Gb/s (50 GB/s)."""
    run_ = RunTiers(nodes=2, node_bytes=1e9, replicas=1, levels={
        "memory": (0.5, 0.25, "process"), "peer": (2.0, 3.0, "node"),
        "storage": (10.0, 20.0, "job")}, transfer_s=1.6, transport="tcp")
    job = JobSize(name="job", gpus=16, gpus_per_node=8, nodes=2, node_bytes=4e9,
                  network_Bps=parse_network("400Gb/s") or 0.0, network_source="given",
                  storage=(7.0, 9.0))
    memory, peer, storage = scale(run_, job)
    # memory: x 4 (bytes per node)
    assert (memory.save_s, memory.restore_s) == pytest.approx((2.0, 1.0), rel=1e-12)
    # peer: (t / 1.6 s) x 4 GB / 50 GB/s: 2 s -> 1.25 x 0.08 s = 0.1 s; 3 s -> 0.15 s
    assert (peer.save_s, peer.restore_s) == pytest.approx((0.1, 0.15), rel=1e-12)
    assert (storage.save_s, storage.restore_s) == (7.0, 9.0)  # the job model's, as given
    assert [(lv.measured_save_s, lv.measured_restore_s) for lv in (memory, peer, storage)] \
        == [(0.5, 0.25), (2.0, 3.0), (10.0, 20.0)]
    level, scope = parse_level(peer.text())  # as `levels --level` takes it
    assert (level.save_s, level.restore_s, scope) == pytest.approx((0.1, 0.15, "node"))
    # a replication (0.1 s) faster than the node's memory copy (2 s) is cautioned
    assert "faster than the node's memory copy" in TierScaling(
        "r", run_, job, (memory, peer, storage), None).cautions()[0]
    slow = replace(job, network_Bps=1e9)  # 1 GB/s: 2 / 1.6 x 4 s = 5 s, no caution
    assert scale(run_, slow)[1].save_s == pytest.approx(5.0)
    assert TierScaling("r", run_, slow, scale(run_, slow), None).cautions() == []


@pytest.mark.parametrize(("text", "bytes_per_s"), [
    ("400Gb/s", 50e9), ("400Gbit/s", 50e9), ("400Gbps", 50e9), ("400", 50e9),
    ("3.2Tb/s", 400e9), ("50GB/s", 50e9), ("100MB/s", 100e6), ("measured", None)])
def test_network_bandwidths_in_bits_or_bytes(text: str, bytes_per_s: float | None) -> None:
    assert parse_network(text) == (pytest.approx(bytes_per_s) if bytes_per_s else None)
    assert NODE_NETWORK_BPS == 50e9


def test_the_job_equal_to_the_run_gives_the_measured_levels(tiered: Path) -> None:
    """4 GPUs of 2 per node, as the run's emulated nodes, over the run's own transport:
    memory and peer exactly as measured; storage is the job model's estimate."""
    out = run("levels", "--tiers-results", str(tiered), "--failure-classes", "llama3",
              "--gpus", "4", "--gpus-per-node", "2", "--node-network", "measured", "--json")
    assert out.returncode == 0, out.stderr
    scaling = json.loads(out.stdout)["scaling"]
    assert scaling["run"]["nodes"] == scaling["job"]["nodes"] == 2
    assert scaling["run"]["node_bytes"] == scaling["job"]["node_bytes"]
    levels = {lv["level"]: lv for lv in scaling["levels"]}
    for name in ("memory", "peer"):
        assert levels[name]["save_s"] == levels[name]["measured_save_s"] > 0
        assert levels[name]["restore_s"] == levels[name]["measured_restore_s"] > 0
    job = run_job(read_results(tiered), 4, 2)
    assert job.restore is not None
    assert levels["storage"]["save_s"] == pytest.approx(job.save.total_s)
    assert levels["storage"]["restore_s"] == pytest.approx(job.restore.total_s)


def test_twice_the_bytes_per_node_twice_the_time(tiered: Path) -> None:
    """Twice the job's bytes per node: memory and peer take twice as long (with any
    network), the storage's data part too at fixed nodes. The same 4 GPUs on one node of 4
    instead of two of 2: each level in proportion to the node's bytes (about 2x; the
    plan's nodes differ by a few bytes)."""
    base = tier_scaling(str(tiered), 4, 2, 50e9)
    doubled = scale(base.run, replace(base.job, node_bytes=2 * base.job.node_bytes))
    for a, b in zip(base.levels[:2], doubled[:2], strict=True):
        assert (b.save_s, b.restore_s) == pytest.approx((2 * a.save_s, 2 * a.restore_s),
                                                        rel=1e-12)
    one = tier_scaling(str(tiered), 4, 4, 50e9)
    ratio = one.job.node_bytes / base.job.node_bytes
    assert ratio == pytest.approx(2, rel=1e-4)
    for a, b in zip(base.levels[:2], one.levels[:2], strict=True):
        assert (b.save_s, b.restore_s) == pytest.approx((ratio * a.save_s,
                                                         ratio * a.restore_s), rel=1e-12)
    m = read_results(tiered)
    small, large = (estimate(m, uniform("x", total, 16, 8), restart_overhead_s=0.0,
                             restart_source="none", need_restore=True, force=True)
                    for total in (1e12, 2e12))
    assert large.save.data_s == pytest.approx(2 * small.save.data_s, rel=1e-9)
    assert large.restore and small.restore
    assert large.restore.data_s == pytest.approx(2 * small.restore.data_s, rel=1e-9)


def test_another_workload_as_the_job(tiered: Path) -> None:
    """--workload: the 405B job's plan gives the bytes per node (2,048 nodes of 8)."""
    w = ROOT / "workloads" / "llama3.1-405b-tp8-pp16-fsdp-16384.toml"
    out = run("levels", "--tiers-results", str(tiered), "--failure-classes", "llama3",
              "--gpus", "16384", "--workload", str(w), "--json")
    assert out.returncode == 0, out.stderr
    scaling = json.loads(out.stdout)["scaling"]
    target = job_target(load_workload(w), 16384, 8)
    assert scaling["job"]["node_bytes"] == target.heaviest_node_bytes
    assert scaling["job"]["workload"] == target.name != "tiny"
    memory = scaling["levels"][0]
    ratio = target.heaviest_node_bytes / scaling["run"]["node_bytes"]
    assert memory["save_s"] == pytest.approx(memory["measured_save_s"] * ratio, rel=1e-12)


def test_levels_prints_the_scaled_beside_the_measured(tiered: Path) -> None:
    out = run("levels", "--tiers-results", str(tiered), "--failure-classes", "llama3",
              "--gpus", "16384", "--node-network", "3.2Tb/s")
    assert out.returncode == 0, out.stderr
    s = tier_scaling(str(tiered), 16384, 8, 400e9, "--node-network 3.2Tb/s")
    for line in s.lines():
        assert line in out.stdout.splitlines()
    (peer,) = [line for line in out.stdout.splitlines() if line.startswith("peer ")]
    assert format_duration(s.levels[1].save_s) in peer  # the level used is the scaled one
    at_run = run("levels", "--tiers-results", str(tiered), "--failure-classes", "llama3",
                 "--gpus", "16384", "--at-run-size")
    assert at_run.returncode == 0, at_run.stderr
    assert "scaled to the job" not in at_run.stdout
    measured = format_duration(s.levels[1].measured_save_s)
    assert measured in next(line for line in at_run.stdout.splitlines()
                            if line.startswith("peer "))


def test_report_shows_each_level_at_the_run_and_scaled_to_the_job(tiered: Path) -> None:
    """One node of 4 GPUs (report's 8 per node): twice the run's node bytes."""
    (cadence,) = tier_cadences([load(str(tiered))], "llama3", 4)
    names = [c.name for c in cadence.grid.columns]
    assert names[:5] == ["level", "save", "save", "restore", "restart + restore"]
    assert [c.stat for c in cadence.grid.columns[1:5]] == ["at run", "job", "at run", "job"]
    s = tier_scaling(str(tiered), 4, 8)
    rows = {row[0]: row for row in cadence.grid.rows}
    memory = s.levels[0]
    ratio = s.job.node_bytes / s.run.node_bytes
    assert ratio == pytest.approx(2, rel=1e-4)
    assert memory.save_s == pytest.approx(ratio * memory.measured_save_s, rel=1e-12)
    assert rows["memory"][1:3] == (format_duration(memory.measured_save_s),
                                   format_duration(memory.save_s))
    assert any(n.startswith("scaled to the job") for n in cadence.grid.notes)
    text = run("report", str(tiered), "--failure-preset", "llama3", "--gpus", "4", "--wide")
    assert text.returncode == 0, text.stderr
    assert "scaled to the job" in text.stdout and "at run" in text.stdout


def one_line_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc = main(list(args))
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (rc, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("value", ["0", "-400Gb/s", "fast", "400furlongs", "1e400Gb/s",
                                   "400Xb/s"])
def test_a_bad_network_is_one_line(capsys: pytest.CaptureFixture[str], tiered: Path,
                                   value: str) -> None:
    for command in (["levels", "--tiers-results", str(tiered), "--failure-classes", "llama3",
                     "--gpus", "64"],
                    ["report", str(tiered), "--failure-preset", "llama3"]):
        err = one_line_error(capsys, *command, "--node-network", value)
        assert "--node-network" in err and "allowed" in err


@pytest.mark.parametrize(("args", "named"), [
    (["--level", "storage:1s:2s:job", "--node-network", "400Gb/s"], "--node-network"),
    (["--level", "storage:1s:2s:job", "--at-run-size"], "--at-run-size"),
    (["--level", "storage:1s:2s:job", "--workload", str(TINY)], "--workload"),
    (["--tiers-results", "TIERED", "--at-run-size", "--node-network", "1"], "--node-network"),
    (["--tiers-results", "TIERED", "--at-run-size", "--workload", str(TINY)], "--workload"),
    (["--tiers-results", "TIERED", "--gpus-per-node", "0"], "--gpus-per-node"),
    (["--tiers-results", "PLAIN"], "no tier measurements"),
    (["--tiers-results", "MISSING"], "--tiers-results"),
])
def test_bad_levels_input_is_one_line(capsys: pytest.CaptureFixture[str], tiered: Path,
                                      tmp_path: Path, args: list[str], named: str) -> None:
    plain = tmp_path / "plain.jsonl"
    if "PLAIN" in args:
        proc = run("run", str(TINY), "--target", str(tmp_path / "t"), "--results", str(plain),
                   "--iterations", "1")
        assert proc.returncode == 0, proc.stderr[-2000:]
    paths = {"TIERED": str(tiered), "PLAIN": str(plain), "MISSING": str(tmp_path / "no.jsonl")}
    given = [paths.get(a, a) for a in args]
    gpus: list[str] = [] if "--gpus" in given else ["--gpus", "64"]
    err = one_line_error(capsys, "levels", *given, "--failure-classes", "llama3", *gpus)
    assert named in err


def test_report_refuses_a_network_without_a_preset(capsys: pytest.CaptureFixture[str],
                                                   tiered: Path) -> None:
    err = one_line_error(capsys, "report", str(tiered), "--node-network", "400Gb/s")
    assert "--failure-preset" in err


def test_a_run_with_no_workload_recorded_is_one_line(tiered: Path, tmp_path: Path) -> None:
    records: list[dict[str, Any]] = [json.loads(line) for line in tiered.read_text().splitlines()]
    for r in records:
        if r.get("type") == "run":
            r.pop("workload", None)
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(SpecError, match="no full-size workload"):
        tier_scaling(str(old), 64, 8)
