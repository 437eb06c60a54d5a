"""The MPI runner: `mpirun -np N ckptbench run` against the local runner, failure bounds.

Needs Open MPI's mpirun and mpi4py (the test extra); the launcher logic is tested
without them. Runs as root are allowed through OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptbench.errors import SpecError
from ckptbench.formats.manifest import Manifest
from ckptbench.plan import build_plan
from ckptbench.runner.launch_mpi import choose_launcher, launched_size, split_ranks
from ckptbench.runner.session import auto_restore_shift
from ckptbench.spec import load_workload

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "workloads" / "tiny.toml"
MPIRUN = shutil.which("mpirun")
try:
    import mpi4py  # noqa: F401

    HAVE_MPI4PY = True
except ImportError:  # pragma: no cover - the test extra installs it
    HAVE_MPI4PY = False

_skip_without_mpi = pytest.mark.skipif(MPIRUN is None or not HAVE_MPI4PY,
                                       reason="needs mpirun and mpi4py")


def needs_mpi(test):
    return pytest.mark.mpi(_skip_without_mpi(test))


MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    # Containers often forbid the cross-memory attach the shared-memory transport uses.
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
}
FAULT_RUN = Path(__file__).resolve().parent / "fault_run.py"
# Plan rank 1 (the writer of __1_*.distcp) exits (status 9) after 2 MB of its 5.9 MB
# (1 MiB writes): a wrapper backend the test script passes in (ckptbench/testing/faults.py).
DIE = ("--die-file", "/__1_", "--die-after", "2000000")


def run(cmd: list[str], env: dict[str, str] | None = None,
        timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run in its own process group; on timeout kill the whole group (no stray ranks)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **MPI_ENV, **(env or {})}, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s (a hang)")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), time.monotonic() - t0


def mpirun(np: int, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
           faults: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], float]:
    """`mpirun -np N ckptbench run ARGS`; with `faults`, through tests/runner/fault_run.py."""
    assert MPIRUN is not None
    exported = [x for k in (env or {}) for x in ("-x", k)]
    command = [str(FAULT_RUN), *faults, "--"] if faults else ["-m", "ckptbench", "run"]
    return run([MPIRUN, "-np", str(np), "--oversubscribe", *exported, sys.executable,
                *command, *args], env=env, timeout=timeout)


def local(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
          faults: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], float]:
    command = [str(FAULT_RUN), *faults, "--"] if faults else ["-m", "ckptbench", "run"]
    return run([sys.executable, *command, *args], env=env, timeout=timeout)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def files_of(target: Path) -> dict[str, tuple[int, str]]:
    """Relative path (below the run directory) -> (size, sha256), manifest and the kept
    run's record left out (they name the run, its host and its processes)."""
    (run_dir,) = [p for p in target.iterdir() if p.is_dir()]
    assert json.loads((run_dir / ".ckptbench-run").read_text())["state"] == "kept"
    return {str(p.relative_to(run_dir)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name not in (".metadata", ".ckptbench-run")}


def manifest_entries(target: Path) -> dict[str, dict]:
    (run_dir,) = [p for p in target.iterdir() if p.is_dir()]
    m = Manifest.decode((run_dir / "checkpoint-1" / ".metadata").read_bytes())
    strip = len(run_dir.name) + 1
    return {k[strip:]: {**v, **({"path": v["path"][strip:]} if "path" in v else {})}
            for k, v in m["files"].items()}


def by_rank(recs: list[dict], phase: str) -> dict[int, int]:
    return {r["rank"]: r["bytes"] for r in recs if r["type"] == "rank" and r["phase"] == phase}


# --- launcher selection and rank groups (no MPI needed) ---

def test_launched_size_from_the_environment():
    assert launched_size({}) is None
    assert launched_size({"OMPI_COMM_WORLD_SIZE": "4"}) == ("OMPI_COMM_WORLD_SIZE", 4)
    assert launched_size({"PMI_SIZE": "2"}) == ("PMI_SIZE", 2)
    assert launched_size({"SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "3"}) == (
        "SLURM_STEP_NUM_TASKS", 8)
    assert launched_size({"PMIX_RANK": "0"}) == ("PMIX_RANK", None)
    # An sbatch script (no srun step) is not an MPI launch.
    assert launched_size({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) is None


def test_choose_launcher():
    mpi_env = {"OMPI_COMM_WORLD_SIZE": "4"}
    assert choose_launcher("auto", {}, have_mpi4py=True) == "local"
    assert choose_launcher("auto", mpi_env, have_mpi4py=True) == "mpi"
    assert choose_launcher("auto", {"OMPI_COMM_WORLD_SIZE": "1"}, have_mpi4py=True) == "local"
    assert choose_launcher("local", mpi_env, have_mpi4py=True) == "local"
    assert choose_launcher("mpi", {}, have_mpi4py=True) == "mpi"
    with pytest.raises(SpecError, match=r"OMPI_COMM_WORLD_SIZE=4\) but mpi4py is not installed"):
        choose_launcher("auto", mpi_env, have_mpi4py=False)
    with pytest.raises(SpecError, match="--launcher mpi needs mpi4py"):
        choose_launcher("mpi", {}, have_mpi4py=False)


def test_split_ranks_into_contiguous_groups():
    assert split_ranks([0, 1, 2, 3], 4) == [[0], [1], [2], [3]]
    assert split_ranks([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    assert split_ranks(list(range(10)), 4) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert split_ranks([4, 5, 6], 3) == [[4], [5], [6]]
    with pytest.raises(SpecError, match="started 8 processes but the run has 4 plan ranks"):
        split_ranks([0, 1, 2, 3], 8)


def test_auto_restore_shift_reads_on_another_node():
    assert auto_restore_shift(["a"] * 4) == (0, 4)
    assert auto_restore_shift(["a", "a", "b", "b"]) == (2, 0)
    assert auto_restore_shift(["a"] * 8 + ["b"] * 8 + ["c"] * 8) == (8, 0)
    assert auto_restore_shift(["a", "b", "a", "b"]) == (1, 0)  # round-robin placement
    shift, own = auto_restore_shift(["a", "a", "a", "b"])  # no shift avoids every own read
    assert own == 2 and shift in (1, 2, 3)


# --- under mpirun ---

@needs_mpi
def test_mpi_run_gives_the_same_bytes_files_and_verification_as_the_local_runner(tmp_path):
    # each rank reads back what it wrote (the DCP restore plan under MPI: further down)
    common = ["--keep", "--block-size", "1MiB", "--restore-plan", "files"]
    lr, _ = local(str(TINY), "--target", str(tmp_path / "local"), "--results",
                  str(tmp_path / "local.jsonl"), *common)
    assert lr.returncode == 0, lr.stderr
    mr, _ = mpirun(4, str(TINY), "--target", str(tmp_path / "mpi"), "--results",
                   str(tmp_path / "mpi.jsonl"), *common)
    assert mr.returncode == 0, mr.stderr
    # Only MPI rank 0 prints: one banner (on stderr), one table, one results line.
    assert mr.stdout.count("results: ") == 1 and mr.stderr.count("tiny: 4 of 4 ranks") == 1
    lrec, mrec = records(tmp_path / "local.jsonl"), records(tmp_path / "mpi.jsonl")
    assert lrec[0]["launcher"] == "local" and mrec[0]["launcher"] == "mpi"
    assert mrec[0]["mpi"]["groups"] == [[0], [1], [2], [3]]
    plan = build_plan(load_workload(TINY))
    expected = dict(enumerate(plan.rank_bytes().tolist()))
    for recs in (lrec, mrec):
        assert by_rank(recs, "save") == expected == by_rank(recs, "restore")
        (restore,) = [r for r in recs if r["type"] == "phase" and r["phase"] == "restore"]
        assert restore["verified"] and restore["mismatched_chunks"] == 0
    # Same files, byte for byte (the payload depends on seed, file and iteration only).
    assert files_of(tmp_path / "local") == files_of(tmp_path / "mpi")
    assert manifest_entries(tmp_path / "local") == manifest_entries(tmp_path / "mpi")
    # Timestamps are on one time base: every rank's save starts after the same barrier.
    starts = [r["start_ns"] for r in mrec if r["type"] == "rank" and r["phase"] == "save"]
    assert max(starts) - min(starts) < 5e9
    # What a restart's start costs here: MPI's initialisation, the forks of local ranks.
    (lstart,), (mstart,) = ([r for r in recs if r["type"] == "startup"] for recs in (lrec, mrec))
    assert mstart["ranks_set_up"] == "MPI initialisation, the slowest of 4 ranks"
    assert lstart["ranks_set_up"] == "4 local processes forked until each one runs"
    for start in (lstart, mstart):
        assert start["processes"] == 4 and 0 < start["ranks_set_up_s"] < 120
        assert 0 < start["process_start_and_imports_s"] <= start["to_run_s"] < 600


@needs_mpi
@pytest.mark.parametrize(("layout", "ranks"), [("world_size=2,tp=1", 2),
                                               ("world_size=8,dp_replicate=2", 8)])
def test_mpi_restores_onto_another_layout_read_for_read(tmp_path, layout, ranks):
    """4 MPI processes save tiny, then the restore layout's ranks (2: FSDP2; 8: HSDP, two
    per process) read what DCP's load planner gives them, verified chunk by chunk."""
    from tests.runner.test_restore_run import measured_reads, planned_reads

    results = tmp_path / "r.jsonl"
    r, _ = mpirun(4, str(TINY), "--target", str(tmp_path / "t"), "--results", str(results),
                  "--restore-layout", layout)
    assert r.returncode == 0, r.stderr
    recs = records(results)
    (phase,) = [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]
    assert phase["verified"] and phase["restore_world_size"] == ranks
    overrides = {k: int(v) for k, v in (kv.split("=") for kv in layout.split(","))}
    assert measured_reads(recs) == planned_reads(overrides)
    processes = {x["rank"]: x["process"] for x in recs
                 if x["type"] == "rank" and x["phase"] == "restore"}
    assert sorted(processes) == list(range(ranks)) and set(processes.values()) <= {0, 1, 2, 3}


@needs_mpi
def test_fewer_processes_than_plan_ranks_run_contiguous_groups(tmp_path):
    results = tmp_path / "r.jsonl"
    r, _ = mpirun(2, str(TINY), "--target", str(tmp_path / "t"), "--results", str(results))
    assert r.returncode == 0, r.stderr
    recs = records(results)
    assert recs[0]["mpi"]["groups"] == [[0, 1], [2, 3]]
    assert recs[0]["mpi"]["threads_per_process"] == [2, 2]
    saves = [x for x in recs if x["type"] == "rank" and x["phase"] == "save"]
    assert {x["rank"]: x["process"] for x in saves} == {0: 0, 1: 0, 2: 1, 3: 1}
    assert by_rank(recs, "save") == dict(enumerate(build_plan(load_workload(TINY)).rank_bytes().tolist()))
    assert all(x["verified"] for x in recs if x["type"] == "phase" and x["phase"] == "restore")
    assert not (tmp_path / "t").exists()  # cleaned up by rank 0


@needs_mpi
def test_mpi_mlperf_writes_all_checkpoints_then_reads_them(tmp_path):
    """`mpirun -np 2 ckptbench mlperf`: the v2.0 order under MPI, one report from rank 0."""
    assert MPIRUN is not None
    results = tmp_path / "r.jsonl"
    r, _ = run([MPIRUN, "-np", "2", "--oversubscribe", sys.executable, "-m", "ckptbench",
                "mlperf", str(ROOT / "workloads" / "mlperf-llama3-8b.toml"), "--scale", "32",
                "--ranks", "0-1", "--iterations", "3", "--target", str(tmp_path / "t"),
                "--results", str(results), "--json"], timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # rank 0's report alone
    assert "PASS closed.sequence: all 3 checkpoints written, then read in the order written" \
        in out["rules"]
    recs = records(results)
    assert recs[0]["launcher"] == "mpi" and recs[0]["mpi"]["groups"] == [[0], [1]]
    phases = [(x["phase"], x["iteration"]) for x in recs if x["type"] == "phase"]
    assert phases == [("save", i) for i in (1, 2, 3)] + [("restore", i) for i in (1, 2, 3)]
    ops = [x for x in recs if x["type"] == "op"]
    assert max(x["end_ns"] for x in ops if x["phase"] == "save") <= \
        min(x["start_ns"] for x in ops if x["phase"] == "restore")
    assert all(x["verified"] for x in recs if x["type"] == "phase" and x["phase"] == "restore")
    assert not (tmp_path / "t").exists()


@needs_mpi
def test_several_nodes_shift_restores_to_another_node_and_measure_clocks(tmp_path):
    # Two pretend nodes (host names passed in by the test script): a = MPI ranks 0, 1; b = 2, 3. N-1 shared file, O_DIRECT.
    workload = tmp_path / "shared.toml"
    workload.write_text(TINY.read_text().replace(
        "[parallel]", '[checkpoint]\nfiles = "shared"\nstripe_size = 65536\n\n[parallel]'))
    results = tmp_path / "r.jsonl"
    r, _ = mpirun(4, str(workload), "--target", str(tmp_path / "t"), "--results", str(results),
                  "--io", "direct", faults=("--hosts", "a,a,b,b"))
    assert r.returncode == 0, r.stderr
    recs = records(results)
    run = recs[0]
    assert run["restore_shift"] == {"value": 2, "source": "auto: plan ranks per node",
                                    "own_node_reads": 0}
    nodes = {n["host"]: n for n in run["clock"]["nodes"]}
    assert nodes["a"]["clock_offset_ns"] == 0 and nodes["a"]["plan_ranks"] == [0, 1]
    assert nodes["b"]["plan_ranks"] == [2, 3] and nodes["b"]["clock_rtt_ns"] > 0
    # Same machine, so the true offset is 0: the estimate is within half a round trip.
    assert abs(nodes["b"]["clock_offset_ns"]) <= nodes["b"]["clock_rtt_ns"]
    (end,) = [x for x in recs if x["type"] == "clock"]
    assert {n["host"] for n in end["nodes"]} == {"a", "b"}
    (restore,) = [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]
    assert restore["verified"] and restore["restore_shift"] == 2 and restore["cache"] == "direct"
    hosts = {x["rank"]: x["host"] for x in recs if x["type"] == "rank" and x["phase"] == "save"}
    assert hosts == {0: "a", 1: "a", 2: "b", 3: "b"}


@needs_mpi
def test_explicit_restore_shift_is_recorded_as_given(tmp_path):
    results = tmp_path / "r.jsonl"
    r, _ = mpirun(4, str(TINY), "--target", str(tmp_path / "t"), "--results", str(results),
                  "--restore-shift", "1", "--no-restore")
    assert r.returncode == 0, r.stderr
    assert records(results)[0]["restore_shift"] == {"value": 1, "source": "option",
                                                    "own_node_reads": 4}


@needs_mpi
def test_more_processes_than_plan_ranks_is_one_line_from_rank_0(tmp_path):
    r, _elapsed = mpirun(8, str(TINY), "--target", str(tmp_path / "t"))
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.startswith("ckptbench: error:")]
    assert lines == ["ckptbench: error: the MPI launcher started 8 processes but the run has "
                     "4 plan ranks; allowed: at most 4 processes (one or more plan ranks each)"]
    assert not (tmp_path / "t").exists()


@needs_mpi
def test_a_rank_dying_mid_save_fails_the_mpi_run_quickly_without_a_manifest(tmp_path):
    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    r, elapsed = mpirun(4, str(TINY), "--target", str(target), "--results", str(results),
                        "--keep", "--block-size", "1MiB", faults=DIE, timeout=90)
    assert r.returncode != 0
    assert elapsed < 60
    written = {p.name: p.stat().st_size for p in target.rglob("*") if p.is_file()}
    assert "__1_0.distcp" in written and written["__1_0.distcp"] < 5_893_632  # died mid-file
    assert not list(target.rglob(".metadata"))
    assert "summary" not in {x["type"] for x in records(results)}


@pytest.mark.slow  # the local runner gives a dead rank's peers 30 s before stopping them
def test_a_rank_dying_mid_save_fails_the_local_run_without_hanging(tmp_path):
    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    r, elapsed = local(str(TINY), "--target", str(target), "--results", str(results),
                       "--keep", "--block-size", "1MiB", faults=DIE, timeout=90)
    assert r.returncode != 0 and "ckptbench: error:" in r.stderr
    assert elapsed < 60
    assert not list(target.rglob(".metadata"))
    recs = records(results)
    assert not any(x["type"] == "phase" and x["ok"] for x in recs)
