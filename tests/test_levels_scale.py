"""A tiered run's levels scaled from the run's size to the job's (cadence.levels_scale),
on one footing: stated figures for the job's nodes (the default) or the run's own nodes
as measured. A case computed by hand for each footing, the measured levels back when
the job is the run, twice the bytes per node twice the time, each figure's source
printed, orderings no hardware produces refused unless --force, the storage measurement
refused as `cadence --results` refuses it, the scaled figures beside the measured ones in
`levels` and `report`, and one-line errors (exit 2) for bad input."""

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
from ckptbench.cadence.levels_report import REPORT_FORCED, tier_cadences
from ckptbench.cadence.levels_scale import (
    MEASURED_FOOTING,
    NODE_MEMORY_BPS,
    NODE_MEMORY_SHORT,
    NODE_MEMORY_SOURCE,
    NODE_NETWORK_BPS,
    NODE_NETWORK_SHORT,
    NODE_NETWORK_SOURCE,
    STATED_FOOTING,
    STORAGE_SOURCE,
    Footing,
    JobSize,
    RunTiers,
    TierScaling,
    parse_footing,
    parse_memory,
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
BIG = ROOT / "workloads" / "llama3.1-405b-tp8-pp16-fsdp-16384.toml"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "CKPTBENCH_PROGRESS": "off"}
# The tiny job on one node of 4: the run's storage measurement stands for it as it is
# (its 4 ranks on one host, its own bytes per rank, 5 samples, caches evicted).
ONE_NODE = ["--gpus", "4", "--gpus-per-node", "4"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=ENV, check=False)


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tiered run: the tiny workload's 4 processes as 2 nodes of 2, memory copies
    in /dev/shm, one replica over TCP, storage every checkpoint; 5 checkpoints with the
    caches evicted, so `cadence --results` takes its storage for the tiny job on a node of
    4 as it is (about 6 s)."""
    tmp = tmp_path_factory.mktemp("tiered")
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    memory = Path(tempfile.mkdtemp(prefix="ckptbench-test-", dir=shm))
    try:
        proc = run("run", str(TINY), "--target", str(tmp / "t"), "--results",
                   str(tmp / "r.jsonl"), "--memory-dir", str(memory), "--tiers",
                   "memory,peer,storage", "--ranks-per-node", "2", "--iterations", "5",
                   "--storage-every", "1", "--cache", "auto")
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        shutil.rmtree(memory, ignore_errors=True)
    return tmp / "r.jsonl"


def levels_json(tiered: Path, *args: str) -> dict[str, Any]:
    out = run("levels", "--tiers-results", str(tiered), "--failure-classes", "llama3", *args,
              "--json")
    assert out.returncode == 0, out.stderr
    scaling: dict[str, Any] = json.loads(out.stdout)["scaling"]
    return scaling


# 1 GB per node at the run, 4 GB at the job. The run copied a node's bytes in 0.25 s
# (4 GB/s) and its plain transfer moved them in 1.6 s (0.625 GB/s).
HAND_RUN = RunTiers(nodes=2, node_bytes=1e9, replicas=1, levels={
    "memory": (0.5, 0.25, "process"), "peer": (2.0, 3.0, "node"),
    "storage": (10.0, 20.0, "job")}, transfer_s=1.6, transport="tcp", copy_s=0.25,
    memory_where="/dev/shm (tmpfs, 4 KiB pages)")


def hand_job(footing: Footing, storage: tuple[float, float] = (7.0, 9.0)) -> JobSize:
    return JobSize(name="job", gpus=16, gpus_per_node=8, nodes=2, node_bytes=4e9,
                   footing=footing, storage=storage)


def test_the_stated_footing_by_hand() -> None:
    """Host memory 800 GB/s (a copy at 400 GB/s), a network of 400 Gb/s (50 GB/s):
    t_job = (t_run / T_run) * B_job / R for memory and peer alike."""
    footing = parse_footing("stated", "800GB/s", "400Gb/s")
    assert (footing.memory_Bps, footing.copy_Bps, footing.network_Bps) == (800e9, 400e9, 50e9)
    memory, peer, storage = scale(HAND_RUN, hand_job(footing))
    # memory: (0.5 s / 0.25 s) x 4 GB / 400 GB/s = 2 x 0.01 s = 0.02 s; 0.25 s -> 0.01 s
    assert (memory.save_s, memory.restore_s) == pytest.approx((0.02, 0.01), rel=1e-12)
    # peer: (2 s / 1.6 s) x 4 GB / 50 GB/s = 1.25 x 0.08 s = 0.1 s; 3 s -> 0.15 s
    assert (peer.save_s, peer.restore_s) == pytest.approx((0.1, 0.15), rel=1e-12)
    assert (storage.save_s, storage.restore_s) == (7.0, 9.0)  # the job model's, as given
    assert [(lv.measured_save_s, lv.measured_restore_s) for lv in (memory, peer, storage)] \
        == [(0.5, 0.25), (2.0, 3.0), (10.0, 20.0)]
    assert [(lv.footing, lv.source) for lv in (memory, peer)] == [
        ("stated", "--node-memory-bandwidth 800GB/s (host memory per node; a copy at half "
                   "that)"), ("stated", "--node-network 400Gb/s")]
    assert storage.footing == "measured" and storage.source.startswith(STORAGE_SOURCE)
    level, scope = parse_level(peer.text())  # as `levels --level` takes it
    assert (level.save_s, level.restore_s, scope) == pytest.approx((0.1, 0.15, "node"))
    # the default: 614.4 GB/s (2 x 8 channels of DDR5-4800 at 38.4 GB/s), a copy at half
    assert NODE_MEMORY_BPS == pytest.approx(2 * 8 * 38.4e9) == 614.4e9
    assert scale(HAND_RUN, hand_job(STATED_FOOTING))[0].save_s == pytest.approx(
        2 * 4e9 / 307.2e9, rel=1e-12)
    assert TierScaling("r", HAND_RUN, hand_job(footing), (memory, peer, storage),
                       None).cautions() == []


def test_the_measured_footing_by_hand() -> None:
    """The run's own nodes: t_job = t_run * B_job / B_run, memory and peer alike."""
    memory, peer, storage = scale(HAND_RUN, hand_job(MEASURED_FOOTING))
    assert (memory.save_s, memory.restore_s) == pytest.approx((2.0, 1.0), rel=1e-12)
    assert (peer.save_s, peer.restore_s) == pytest.approx((8.0, 12.0), rel=1e-12)
    assert (storage.save_s, storage.restore_s) == (7.0, 9.0)
    assert (memory.footing, peer.footing) == ("measured", "measured")
    assert memory.source == ("the run's node memory, measured: its copy at 2 GB/s per node "
                             "into /dev/shm (tmpfs, 4 KiB pages)")  # 1 GB / 0.5 s
    assert peer.source == ("the run's own tcp, measured: 0.625 GB/s per node (its plain "
                           "transfer)")


def test_orderings_no_hardware_produces_by_hand() -> None:
    """A network of 3.2 Tb/s (400 GB/s): the replication (1.25 x 4 GB / 400 GB/s =
    0.0125 s) done before the memory copy it sends (0.02 s); storage restoring in 5 ms,
    before the memory restore (0.01 s)."""
    fast = parse_footing(None, "800GB/s", "3.2Tb/s")
    job = hand_job(fast, (7.0, 0.005))
    levels = scale(HAND_RUN, job)
    assert levels[1].save_s == pytest.approx(0.0125, rel=1e-12)
    assert TierScaling("r", HAND_RUN, job, levels, None).cautions() == [
        "the peer save 0.0125 s is below the memory save 0.02 s it starts from (the "
        "replication sends the node's memory copy)",
        "the memory restore 0.01 s is slower than the storage restore 0.005 s"]


@pytest.mark.parametrize(("text", "bytes_per_s"), [
    ("400Gb/s", 50e9), ("400Gbit/s", 50e9), ("400Gbps", 50e9), ("400", 50e9),
    ("3.2Tb/s", 400e9), ("50GB/s", 50e9), ("100MB/s", 100e6), ("measured", None)])
def test_network_bandwidths_in_bits_or_bytes(text: str, bytes_per_s: float | None) -> None:
    assert parse_network(text) == (pytest.approx(bytes_per_s) if bytes_per_s else None)
    assert NODE_NETWORK_BPS == 50e9


@pytest.mark.parametrize(("text", "bytes_per_s"), [
    ("614.4GB/s", 614.4e9), ("614.4", 614.4e9), ("1.2TB/s", 1.2e12), ("800Gb/s", 100e9)])
def test_memory_bandwidths_in_bytes_or_bits(text: str, bytes_per_s: float) -> None:
    assert parse_memory(text) == pytest.approx(bytes_per_s)


def test_the_footing_options_make_one_footing() -> None:
    """Stated by default, each figure with its source; measured alone; a mix refused."""
    assert parse_footing(None) == parse_footing("stated") == STATED_FOOTING
    assert STATED_FOOTING.memory_source == NODE_MEMORY_SOURCE
    assert STATED_FOOTING.network_source == NODE_NETWORK_SOURCE
    assert parse_footing("measured") == parse_footing("Measured", None, "measured") \
        == MEASURED_FOOTING
    for args, names in (((None, None, "measured"), ("--node-network measured", "--footing")),
                        (("stated", None, "measured"), ("--node-network measured",
                                                        "--footing stated")),
                        (("measured", None, "400Gb/s"), ("--footing measured",
                                                         "--node-network 400Gb/s")),
                        (("measured", "1TB/s", None), ("--footing measured",
                                                       "--node-memory-bandwidth 1TB/s")),
                        (("both", None, None), ("--footing 'both'", "stated", "measured"))):
        with pytest.raises(SpecError) as info:
            parse_footing(*args)
        assert all(n in str(info.value) for n in names), (args, info.value)


def test_the_job_equal_to_the_run_gives_the_measured_levels(tiered: Path) -> None:
    """4 GPUs of 2 per node, as the run's emulated nodes, on the measured footing: memory
    and peer exactly as measured; storage is the job model's estimate (forced: the run's
    storage ran 4 ranks on its one host, not 2)."""
    scaling = levels_json(tiered, "--gpus", "4", "--gpus-per-node", "2", "--footing",
                          "measured", "--force")
    assert scaling["footing"] == "measured"
    assert scaling["run"]["nodes"] == scaling["job"]["nodes"] == 2
    assert scaling["run"]["node_bytes"] == scaling["job"]["node_bytes"]
    levels = {lv["level"]: lv for lv in scaling["levels"]}
    for name in ("memory", "peer"):
        assert levels[name]["save_s"] == levels[name]["measured_save_s"] > 0
        assert levels[name]["restore_s"] == levels[name]["measured_restore_s"] > 0
        assert levels[name]["footing"] == "measured"
    job = run_job(read_results(tiered), 4, 2)
    assert job.restore is not None
    assert levels["storage"]["save_s"] == pytest.approx(job.save.total_s)
    assert levels["storage"]["restore_s"] == pytest.approx(job.restore.total_s)
    assert "ranks per node" in " ".join(scaling["storage_warnings"])


def test_the_stated_footing_of_a_real_run_is_its_formula(tiered: Path) -> None:
    """The default footing, from the run's own figures: memory (t / T_copy) x B_job /
    (614.4 GB/s / 2), peer (t / T_transfer) x B_job / 50 GB/s; accepted as it is (no
    --force: the storage measurement stands for this job, the order is one hardware
    gives)."""
    scaling = levels_json(tiered, *ONE_NODE)
    assert scaling["footing"] == "stated" and scaling["forced"] == ""
    run_, job = scaling["run"], scaling["job"]
    assert (job["memory_bytes_per_s"], job["copy_bytes_per_s"], job["network_bytes_per_s"]) \
        == (614.4e9, 307.2e9, 50e9)
    memory, peer, _ = scaling["levels"]
    for lv, base, rate in ((memory, run_["copy_s"], 307.2e9),
                           (peer, run_["transfer_s"], 50e9)):
        for key in ("save_s", "restore_s"):
            assert lv[key] == pytest.approx(lv[f"measured_{key}"] / base * job["node_bytes"]
                                            / rate, rel=1e-12)
    assert scaling["cautions"] == [] and scaling["storage_warnings"] == []


def test_each_figure_prints_its_source(tiered: Path) -> None:
    """Text: each level's line ends with its source; --json: each level's footing and
    source. A figure given is named by its option."""
    out = run("levels", "--tiers-results", str(tiered), "--failure-classes", "llama3",
              *ONE_NODE)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any("footing stated" in line for line in lines)
    for name, source in (("memory", NODE_MEMORY_SHORT), ("peer", NODE_NETWORK_SHORT),
                         ("storage", STORAGE_SOURCE)):
        (line,) = [x for x in lines if x.startswith(f"  {name:<8} save ")]
        assert line.endswith(source) or f"source (measured): {source}" in line, line
    given = tier_scaling(str(tiered), 4, 4, parse_footing(None, "1TB/s"), force=True)
    stated = {lv["level"]: lv for lv in given.to_dict()["levels"]}  # as --json prints it
    assert (stated["memory"]["footing"], stated["memory"]["source"]) == (
        "stated", "--node-memory-bandwidth 1TB/s (host memory per node; a copy at half that)")
    assert (stated["peer"]["footing"], stated["peer"]["source"]) == ("stated",
                                                                     NODE_NETWORK_SOURCE)
    own = tier_scaling(str(tiered), 4, 4, MEASURED_FOOTING, force=True)
    measured = {lv["level"]: lv for lv in own.to_dict()["levels"]}
    assert measured["memory"]["source"].startswith("the run's node memory, measured: its copy")
    assert measured["peer"]["source"].startswith("the run's own tcp")
    for lv in (*stated.values(), *measured.values()):
        if lv["level"] == "storage":
            assert (lv["footing"], lv["source"][:len(STORAGE_SOURCE)]) == ("measured",
                                                                           STORAGE_SOURCE)


def test_twice_the_bytes_per_node_twice_the_time(tiered: Path) -> None:
    """Twice the job's bytes per node: memory and peer take twice as long (either
    footing), the storage's data part too at fixed nodes. The same 4 GPUs on one node of 4
    instead of two of 2: each level in proportion to the node's bytes (about 2x; the
    plan's nodes differ by a few bytes)."""
    for footing in (STATED_FOOTING, MEASURED_FOOTING):
        base = tier_scaling(str(tiered), 4, 2, footing, force=True)
        doubled = scale(base.run, replace(base.job, node_bytes=2 * base.job.node_bytes))
        for a, b in zip(base.levels[:2], doubled[:2], strict=True):
            assert (b.save_s, b.restore_s) == pytest.approx((2 * a.save_s, 2 * a.restore_s),
                                                            rel=1e-12)
        one = tier_scaling(str(tiered), 4, 4, footing, force=True)
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
    """--workload: the 405B job's plan gives the bytes per node (2,048 nodes of 8); forced
    (the tiny run's storage cannot stand for it)."""
    scaling = levels_json(tiered, "--gpus", "16384", "--workload", str(BIG), "--footing",
                          "measured", "--force")
    target = job_target(load_workload(BIG), 16384, 8)
    assert scaling["job"]["node_bytes"] == target.heaviest_node_bytes
    assert scaling["job"]["workload"] == target.name != "tiny"
    memory = scaling["levels"][0]
    ratio = target.heaviest_node_bytes / scaling["run"]["node_bytes"]
    assert memory["save_s"] == pytest.approx(memory["measured_save_s"] * ratio, rel=1e-12)


def test_a_storage_measurement_cadence_refuses_is_refused(capsys: pytest.CaptureFixture[str],
                                                          tiered: Path) -> None:
    """The tiny run's storage for the 405B job (bytes per rank, ranks per node, samples):
    `cadence --results` refuses it; `levels --tiers-results` (either footing) and
    `simulate` refuse it with the same reasons, and --force uses it with them printed."""
    job = ["--workload", str(BIG), "--gpus", "16384"]
    cadence = one_line_error(capsys, "cadence", "--results", str(tiered), *job,
                             "--failure-preset", "llama3")
    reasons = cadence.split("cannot stand for the target job: ", 1)[1]
    assert "bytes per rank" in reasons and "--force" in reasons
    for command, footing in (("levels", "stated"), ("levels", "measured"),
                             ("simulate", "stated")):
        err = one_line_error(capsys, command, "--tiers-results", str(tiered), *job,
                             "--failure-classes", "llama3", "--footing", footing)
        assert err.startswith(f"ckptbench: error: --tiers-results {tiered} cannot stand")
        assert err.endswith(reasons), (err, reasons)
    out = run("levels", "--tiers-results", str(tiered), *job, "--failure-classes", "llama3",
              "--force")
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if "storage by the job model, warnings" in x]
    assert line.startswith("  storage by the job model, warnings (used anyway: --force): "
                           "ranks per node: the run had 4, the target has 8"), line


def test_an_order_no_hardware_produces_is_refused(capsys: pytest.CaptureFixture[str],
                                                  tiered: Path) -> None:
    """A network of 100 Tb/s (12.5 TB/s, 40x the stated memory's copy) puts the peer save
    below the memory save it starts from; a host memory of 1 MB/s puts the memory restore
    after the storage restore: one line naming the figures, exit 2; --force prints them as
    cautions and goes on. `report` refuses nothing: it shows them, saying so."""
    for extra, footing in ((["--node-network", "100Tb/s"], parse_footing(None, None,
                                                                         "100Tb/s")),
                           (["--node-memory-bandwidth", "1MB/s"], parse_footing(None, "1MB/s"))):
        forced = tier_scaling(str(tiered), 4, 4, footing, force=True)
        wrong = forced.cautions()
        assert wrong, forced.lines()
        for command in ("levels", "simulate"):
            err = one_line_error(capsys, command, "--tiers-results", str(tiered),
                                 "--failure-classes", "llama3", *ONE_NODE, *extra)
            assert "gives an order no hardware produces: " + "; ".join(wrong) in err
            assert "--force" in err
        out = run("levels", "--tiers-results", str(tiered), "--failure-classes", "llama3",
                  *ONE_NODE, *extra, "--force")
        assert out.returncode == 0, out.stderr
        for caution in wrong:
            assert f"  caution (used anyway: --force): {caution}" in out.stdout.splitlines()
        (cadence,) = tier_cadences([load(str(tiered))], "llama3", 4, footing)
        assert f"  caution (used anyway: {REPORT_FORCED}): {wrong[0]}" in cadence.grid.notes
    by = {lv.name: lv for lv in forced.levels}  # 1 MB/s: both orders
    assert wrong == [
        f"the peer save {format_duration(by['peer'].save_s)} is below the memory save "
        f"{format_duration(by['memory'].save_s)} it starts from (the replication sends the "
        "node's memory copy)",
        f"the memory restore {format_duration(by['memory'].restore_s)} is slower than the "
        f"storage restore {format_duration(by['storage'].restore_s)}"]


def test_levels_prints_the_scaled_beside_the_measured(tiered: Path) -> None:
    out = run("levels", "--tiers-results", str(tiered), "--failure-classes", "llama3",
              "--gpus", "16384", "--node-network", "3.2Tb/s", "--force")
    assert out.returncode == 0, out.stderr
    s = tier_scaling(str(tiered), 16384, 8, parse_footing(None, None, "3.2Tb/s"), force=True)
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


def test_levels_and_simulate_say_how_much_is_modelled(tiered: Path) -> None:
    """Every job answer prints the measured and the modelled share of each level's save
    and restore: a stated footing's memory and peer levels are modelled (the run's time
    rescaled to stated figures), a measured footing's measured; the storage level's by the
    job model's parts (DCP's coordinator modelled at the 405B job's chunks, past its fit)."""
    job = ["--workload", str(BIG), "--gpus", "16384", "--failure-classes", "llama3", "--force"]
    for command in ("levels", "simulate"):
        extra = ["--replicas", "2", "--days", "1"] if command == "simulate" else []
        out = run(command, "--tiers-results", str(tiered), *job, *extra)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        start = lines.index("  measured vs modelled, per level (restarts: the mechanisms above):")
        memory, peer, save, restore = lines[start + 1:start + 5]
        assert memory.startswith("    memory save ") and "modelled 100 %" in memory
        assert peer.startswith("    peer save ") and "modelled 100 %" in peer
        assert save.startswith("    storage C ") and "coordinator" in save and "x past it" in save
        assert restore.startswith("    storage R ") and "restart" not in restore
    scaling = levels_json(tiered, *job[:4], "--force", "--footing", "measured")
    kinds = {(s["level"], s["phase"]): s["kind"] for s in scaling["shares"]
             if s["name"] == "data"}
    assert kinds[("memory", "save")] == kinds[("peer", "restore")] == "measured"
    by_level = {lv["level"]: lv for lv in scaling["levels"]}
    for level, phase in (("storage", "save"), ("storage", "restore")):
        seconds = sum(s["seconds"] for s in scaling["shares"]
                      if (s["level"], s["phase"]) == (level, phase))
        assert seconds == pytest.approx(by_level[level][f"{phase}_s"], rel=1e-9)
    assert any(s["kind"] == "modelled" and s["level"] == "storage" for s in scaling["shares"])


def test_report_shows_each_level_at_the_run_and_scaled_to_the_job(tiered: Path) -> None:
    """One node of 4 GPUs (report's 8 per node): twice the run's node bytes, on the stated
    footing by default (--footing measured: the run's own)."""
    (cadence,) = tier_cadences([load(str(tiered))], "llama3", 4)
    names = [c.name for c in cadence.grid.columns]
    assert names[:4] == ["level", "save", "save", "restore"]
    assert [c.stat for c in cadence.grid.columns[1:5]] == ["at run", "job", "at run", "job"]
    s = tier_scaling(str(tiered), 4, 8, force=True)
    rows = {row[0]: row for row in cadence.grid.rows}
    memory = s.levels[0]
    ratio = s.job.node_bytes / s.run.node_bytes
    assert ratio == pytest.approx(2, rel=1e-4)
    assert s.run.copy_Bps is not None
    assert memory.save_s == pytest.approx(ratio * memory.measured_save_s * s.run.copy_Bps
                                          / (NODE_MEMORY_BPS / 2), rel=1e-12)
    assert rows["memory"][1:3] == (format_duration(memory.measured_save_s),
                                   format_duration(memory.save_s))
    assert any(n.startswith("scaled to the job (docs/cadence.md), footing stated")
               for n in cadence.grid.notes)
    (own,) = tier_cadences([load(str(tiered))], "llama3", 4, MEASURED_FOOTING)
    assert {row[0]: row for row in own.grid.rows}["memory"][2] == format_duration(
        ratio * memory.measured_save_s)
    text = run("report", str(tiered), "--failure-preset", "llama3", "--gpus", "4", "--wide",
               "--footing", "measured")
    assert text.returncode == 0, text.stderr
    assert "footing measured" in text.stdout and "at run" in text.stdout


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


@pytest.mark.parametrize("value", ["0", "-614.4GB/s", "fast", "614furlongs", "1e400GB/s",
                                   "inf", ""])
def test_a_bad_memory_bandwidth_is_one_line(capsys: pytest.CaptureFixture[str], tiered: Path,
                                            value: str) -> None:
    for command in (["levels", "--tiers-results", str(tiered), "--failure-classes", "llama3",
                     "--gpus", "64"],
                    ["simulate", "--tiers-results", str(tiered), "--failure-classes", "llama3",
                     "--gpus", "64"],
                    ["report", str(tiered), "--failure-preset", "llama3"]):
        err = one_line_error(capsys, *command, "--node-memory-bandwidth", value)
        assert "--node-memory-bandwidth" in err and "allowed: a node's host memory" in err


@pytest.mark.parametrize(("args", "named"), [
    (["--footing", "measured", "--node-network", "400Gb/s"],
     ["--footing measured and --node-network 400Gb/s"]),
    (["--footing", "measured", "--node-memory-bandwidth", "614.4GB/s"],
     ["--footing measured and --node-memory-bandwidth 614.4GB/s"]),
    (["--node-network", "measured"], ["--node-network measured and --footing stated (the "
                                      "default)", "allowed: --footing measured"]),
    (["--footing", "stated", "--node-network", "measured"],
     ["--node-network measured and --footing stated"]),
    (["--footing", "run"], ["--footing 'run'", "allowed: stated", "measured"]),
])
def test_a_mix_of_footings_is_one_line(capsys: pytest.CaptureFixture[str], tiered: Path,
                                       args: list[str], named: list[str]) -> None:
    """Stated figures go with the stated footing, the run's own transport with the
    measured one: a mix is refused naming both options (levels, simulate, report)."""
    for command in (["levels", "--tiers-results", str(tiered), "--failure-classes", "llama3",
                     "--gpus", "64"],
                    ["simulate", "--tiers-results", str(tiered), "--failure-classes", "llama3",
                     "--gpus", "64"],
                    ["report", str(tiered), "--failure-preset", "llama3"]):
        err = one_line_error(capsys, *command, *args)
        assert all(n in err for n in named), err


@pytest.mark.parametrize(("args", "named"), [
    (["--level", "storage:1s:2s:job", "--node-network", "400Gb/s"], "--node-network"),
    (["--level", "storage:1s:2s:job", "--footing", "measured"], "--footing"),
    (["--level", "storage:1s:2s:job", "--node-memory-bandwidth", "1TB/s"],
     "--node-memory-bandwidth"),
    (["--tiers-results", "TIERED", "--at-run-size", "--footing", "stated"], "--footing"),
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


@pytest.mark.parametrize("option", [["--node-network", "400Gb/s"], ["--footing", "measured"],
                                    ["--node-memory-bandwidth", "1TB/s"]])
def test_report_refuses_a_footing_without_a_preset(capsys: pytest.CaptureFixture[str],
                                                   tiered: Path, option: list[str]) -> None:
    err = one_line_error(capsys, "report", str(tiered), *option)
    assert "--failure-preset" in err and option[0] in err


def test_a_run_with_no_workload_recorded_is_one_line(tiered: Path, tmp_path: Path) -> None:
    records: list[dict[str, Any]] = [json.loads(line) for line in tiered.read_text().splitlines()]
    for r in records:
        if r.get("type") == "run":
            r.pop("workload", None)
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(SpecError, match="no full-size workload"):
        tier_scaling(str(old), 64, 8)


def test_what_the_storage_assumptions_suggest_exists(tiered: Path) -> None:
    """The job model's assumptions tell the user to give --aggregate-bandwidth when no
    storage ceiling is known: `levels` and `simulate` take it, and it caps the storage
    level they scale."""
    free = json.loads(run("levels", "--tiers-results", str(tiered), "--failure-classes",
                          "llama3", *ONE_NODE, "--json").stdout)
    hint = [a for a in free["scaling"]["storage_assumptions"] if "--aggregate-bandwidth" in a]
    assert hint
    for command in ("levels", "simulate"):
        extra = ["--days", "1", "--replicas", "5"] if command == "simulate" else []
        out = run(command, "--tiers-results", str(tiered), "--failure-classes", "llama3",
                  *ONE_NODE, "--aggregate-bandwidth", "1MB/s", "--json", *extra)
        assert out.returncode == 0, out.stderr
        capped = json.loads(out.stdout)["scaling"]
        assert any("capped at the aggregate ceiling 0.001 GB/s" in a
                   for a in capped["storage_assumptions"])
        free_storage, capped_storage = (next(lv for lv in s["levels"] if lv["level"] == "storage")
                                        for s in (free["scaling"], capped))
        assert capped_storage["save_s"] > free_storage["save_s"]
