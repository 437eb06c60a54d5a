"""--mode async --tiers peer (issue 32, item 3): each checkpoint's snapshot replicated to
peer nodes in the background while the training loop runs, its interference with the
steps in the records, and the replaced node's shards fetched back from the replicas and
verified; locally and under mpirun."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_mpi import TINY, local, mpirun, needs_mpi, records

SHM = Path("/dev/shm")
ASYNC = ("--mode", "async", "--step-seconds", "0.05", "--steps-per-checkpoint", "4",
         "--iterations", "3", "--tiers", "peer,storage", "--ranks-per-node", "2")


@pytest.fixture
def memory_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ckptbench-test-", dir=SHM if SHM.is_dir() else None))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def async_peer_run(tmp_path: Path, memory_dir: Path, mpi: int = 0, *extra: str
                   ) -> list[dict]:
    results = tmp_path / "r.jsonl"
    args = (str(TINY), "--target", str(tmp_path / "t"), "--results", str(results),
            "--memory-dir", str(memory_dir), *ASYNC, *extra)
    proc, _ = mpirun(mpi, *args, timeout=300) if mpi else local(*args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return records(results)


def check_background_replication(recs: list[dict], memory_dir: Path, transport: str,
                                 progress: str) -> None:
    peer = [r for r in recs if r["type"] == "tier"]
    # the launcher's transport: MPI's shared memory under mpirun (its requests driven at
    # the loop's step boundaries: MPI runs funneled), TCP between local processes
    assert {(r["transport"], r["progress"]) for r in peer} == {(transport, progress)}
    assert {(r["iteration"], r["process"]) for r in peer} == {
        (i, p) for i in (1, 2, 3) for p in range(4)}
    assert all(r["tier"] == "peer" and r["background"] and r["blocking_s"] == 0.0
               and r["replication_s"] > 0 and r["baseline_s"] > 0 for r in peer)
    assert {r["process"]: r["holders"] for r in peer} == {0: [2], 1: [3], 2: [0], 3: [1]}
    # in the background: each replication starts once its checkpoint's loop resumed
    resumed = {(r["iteration"], r["process"]): r["resume_ns"] for r in recs
               if r["type"] == "checkpoint"}
    assert all(r["start_ns"] >= resumed[r["iteration"], r["process"]] for r in peer)
    assert all(r["ok"] for r in recs if r["type"] == "checkpoint")  # persisted too
    # the last node replaced: its processes' shards fetched from node 0, every byte checked
    restores = [r for r in recs if r["type"] == "tier_restore"]
    assert {r["process"]: (r["scenario"], r["tier"], r["from_node"]) for r in restores} == {
        2: ("node", "peer", 0), 3: ("node", "peer", 0)}
    assert all(r["verified"] and r["iteration"] == 3 and r["bytes"] > 0 for r in restores)
    (summary,) = [r for r in recs if r["type"] == "tier_summary"]
    assert summary["background"] and summary["checkpoints"] == 3
    assert "interference" in summary  # the steps beside the replications over the baseline
    assert any(r["type"] == "async_summary" for r in recs)
    assert not list(memory_dir.iterdir())  # every replica removed by name


def test_replication_in_the_background_of_async_mode(tmp_path: Path, memory_dir: Path
                                                     ) -> None:
    check_background_replication(async_peer_run(tmp_path, memory_dir), memory_dir,
                                 "tcp-loopback", "thread")


@needs_mpi
def test_replication_in_the_background_under_mpirun(tmp_path: Path, memory_dir: Path) -> None:
    check_background_replication(async_peer_run(tmp_path, memory_dir, mpi=4), memory_dir,
                                 "mpi-shm", "step boundaries")


@needs_mpi
def test_under_mpirun_peer_transport_tcp_replicates_from_a_thread(tmp_path: Path,
                                                                  memory_dir: Path) -> None:
    """--peer-transport tcp under mpirun: the sockets and a replication thread, as
    between local processes."""
    recs = async_peer_run(tmp_path, memory_dir, 4, "--peer-transport", "tcp")
    check_background_replication(recs, memory_dir, "tcp-loopback", "thread")
