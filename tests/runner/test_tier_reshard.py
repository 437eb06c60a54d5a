"""Tier restarts onto another layout (issue 32, 4b): with ``--restore-layout``, the process
and node restarts read what DCP's load planner gives each restore rank from the memory
copies and peer replicas (nearest surviving copy first), over TCP and under mpirun, every
chunk checked against the save's digest. A chunk no tier holds is one line naming its file;
a byte changed in a peer's copy is found and named."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_mpi import TINY, local, mpirun, needs_mpi, records

from ckptbench.payload import digest
from ckptbench.plan import build_plan
from ckptbench.plan.restore import build_restore_plan
from ckptbench.plan.tier_reads import CopyRead
from ckptbench.plan.tiers import plan_tiers
from ckptbench.runner.tier_peer import PeerServer
from ckptbench.runner.tier_reshard import Mover, first_bad_chunk, plan_restart
from ckptbench.runner.tier_store import copy_name, write_copy
from ckptbench.spec import load_workload, with_restore_layout
from ckptbench.tierspec import TiersSpec

SHM = Path("/dev/shm")
HSDP = "world_size=8,dp_replicate=2"  # 8 restore ranks, two per process
FSDP = "world_size=2,tp=1"  # 2 restore ranks: processes 2 and 3 read nothing


@pytest.fixture
def memory_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ckptbench-test-", dir=SHM if SHM.is_dir() else None))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def rank_bytes(layout: str) -> np.ndarray:
    plan = build_plan(with_restore_layout(load_workload(TINY), None, layout))
    return build_restore_plan(plan).rank_bytes()


def resharded(tmp_path: Path, memory_dir: Path, layout: str, mpi: int = 0,
              per_node: int = 2) -> list[dict]:
    results = tmp_path / "r.jsonl"
    args = (str(TINY), "--target", str(tmp_path / "t"), "--results", str(results),
            "--memory-dir", str(memory_dir), "--tiers", "memory,peer,storage",
            "--ranks-per-node", str(per_node), "--iterations", "2", "--storage-every", "2",
            "--restore-layout", layout)
    proc, _ = mpirun(mpi, *args) if mpi else local(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return records(results)


def check_restarts(recs: list[dict], layout: str, nodes: int = 2) -> None:
    """Every restore rank read once per scenario, its plan's bytes, verified; the replaced
    (last) node's processes fetch all of theirs from other nodes. On 2 nodes the process
    restart reads nothing over the network (each node holds a copy of every shard: its
    own, and the other node's replicas)."""
    want = rank_bytes(layout)
    restores = [r for r in recs if r["type"] == "tier_restore"]
    for scenario in ("process", "node", "group"):
        mine = [r for r in restores if r["scenario"] == scenario]
        assert sorted(x for r in mine for x in r["restore_ranks"]) == list(range(len(want)))
        for r in mine:
            assert r["reads"] == "dcp plan" and r["verified"] and r["iteration"] == 2
            assert r["bytes"] == sum(want[x] for x in r["restore_ranks"])
            assert r["local_bytes"] + r["remote_bytes"] + r["storage_bytes"] == r["bytes"]
            assert len(r["rounds_s"]) == (1 if scenario == "group" else 4)
            assert r["seconds"] > 0 and (r["baseline_s"] > 0) == (r["storage_bytes"] == 0)
            assert (r["tier"] == "storage") == (r["storage_bytes"] > 0)
        if scenario != "group":
            assert not any(r["storage_bytes"] for r in mine)
    if nodes == 2:
        assert all(r["remote_bytes"] == 0 for r in restores if r["scenario"] == "process")
    replaced = [r for r in restores if r["scenario"] == "node" and r["node"] == nodes - 1]
    assert replaced or len(want) < 4  # FSDP: the replaced node's processes have no rank
    for r in replaced:
        assert r["local_bytes"] == 0 and r["remote_bytes"] == r["bytes"] > 0
        assert r["tier"] == "peer" and r["baseline"] == "plain transfer"
        assert not {recs_node(recs, p) for p in r["from_processes"]} & {nodes - 1}
    group = [r for r in restores if r["scenario"] == "group"]
    assert any(r["storage_bytes"] for r in group)
    if nodes == 2:  # the group is every node: storage serves every chunk
        assert all(r["storage_bytes"] == r["bytes"] for r in group)
    (summary,) = [r for r in recs if r["type"] == "tier_restore_summary"
                  and r["scenario"] == "node"]
    assert summary["verified"] and summary["bytes"] == int(want.sum())


def recs_node(recs: list[dict], process: int) -> int:
    return next(r["node"] for r in recs if r["type"] == "tier" and r["process"] == process)


@pytest.mark.parametrize(("layout", "per_node"), [(HSDP, 2), (FSDP, 2), (HSDP, 1)])
def test_restarts_read_the_restore_layouts_load_plan_from_the_tiers(
        tmp_path: Path, memory_dir: Path, layout: str, per_node: int) -> None:
    """2 nodes of 2 processes, and 4 of 1 (where the group restart, nodes 3 and 0 lost,
    mixes the tiers and storage: each process reads the chunks saved by processes 0 and 3
    from storage by the load plan, the others from nodes 1 and 2)."""
    recs = resharded(tmp_path, memory_dir, layout, per_node=per_node)
    check_restarts(recs, layout, nodes=4 // per_node)
    if per_node == 1:
        group = {r["process"]: r for r in recs if r["type"] == "tier_restore"
                 and r["scenario"] == "group"}
        assert all(set(r["from_processes"]) <= {1, 2} and r["local_bytes"] + r["remote_bytes"]
                   for r in group.values())
        assert group[2]["local_bytes"] > 0 and group[0]["local_bytes"] == 0  # 0: replaced
    if layout == FSDP:  # 2 restore ranks: processes 2 and 3 have none, no record
        assert {r["process"] for r in recs if r["type"] == "tier_restore"
                and r["scenario"] != "group"} == {0, 1}
    assert not list(memory_dir.iterdir())


@needs_mpi
@pytest.mark.parametrize("per_node", [2, 1])
def test_under_mpirun_restarts_onto_another_layout_fetch_by_mpi(
        tmp_path: Path, memory_dir: Path, per_node: int) -> None:
    """4 nodes of 1: the group restart's fetches go by MPI before the storage read."""
    recs = resharded(tmp_path, memory_dir, HSDP, mpi=4, per_node=per_node)
    assert recs[0]["launcher"] == "mpi"
    check_restarts(recs, HSDP, nodes=4 // per_node)
    assert not list(memory_dir.iterdir())


MISSING = ("restart (node): checkpoint 1: the shard of process 0 (plan ranks 0): file "
           "__0_0.distcp (saved by process 0): no tier holds it after losing node(s) [1]")


@pytest.mark.parametrize("mpi", [0, pytest.param(4, marks=pytest.mark.mpi)])
def test_a_chunk_no_tier_holds_is_one_line_naming_its_file(tmp_path: Path, memory_dir: Path,
                                                           mpi: int) -> None:
    """Peer replicas alone on 2 nodes: after node 1 is replaced, node 0's shards are in no
    tier; the resharded restart is refused (not partial, not a hang under MPI)."""
    if mpi and not shutil.which("mpirun"):
        pytest.skip("no mpirun")
    args = (str(TINY), "--target", str(tmp_path / "t"), "--results",
            str(tmp_path / "r.jsonl"), "--memory-dir", str(memory_dir), "--tiers", "peer",
            "--ranks-per-node", "2", "--iterations", "1", "--restore-layout", HSDP)
    proc, _ = mpirun(mpi, *args) if mpi else local(*args)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ckptbench: error")]
    assert errors == [f"ckptbench: error: {MISSING}"]
    if not mpi:
        recs = records(tmp_path / "r.jsonl")
        assert [r["message"] for r in recs if r["type"] == "error"] == [MISSING]
        assert {r["scenario"] for r in recs if r["type"] == "tier_restore"} == {"process"}
    assert not list(memory_dir.iterdir())


def test_a_subset_run_with_another_restore_layout_is_refused(tmp_path: Path,
                                                             memory_dir: Path) -> None:
    proc, _ = local(str(TINY), "--target", str(tmp_path / "t"), "--memory-dir",
                    str(memory_dir), "--tiers", "memory,peer", "--ranks-per-node", "1",
                    "--ranks", "0-1", "--restore-layout", FSDP)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ckptbench: error: --tiers with --restore-layout world_size=2: the restarts read "
        "chunks of every saved rank from the tiers, and this run saves 2 of 4; allowed: "
        "every rank, or the save's layout"]
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").iterdir())


def test_a_byte_changed_in_a_peers_copy_is_found_and_named(tmp_path: Path) -> None:
    """Process 0 (node 0) reads two chunks of process 1's memory copy (node 1) as ranges
    over TCP from process 1's server; a byte flipped in that copy fails the second chunk's
    digest, and the chunk and copy are named."""
    tp = plan_tiers(TiersSpec(use=("memory",), ranks_per_node=1), ["h", "h"])
    assert tp is not None
    node1 = tmp_path / "node1"
    node1.mkdir()
    held = np.random.default_rng(5).integers(0, 256, 3 << 20, dtype=np.uint8)
    write_copy(node1 / copy_name(1, 4), held)
    servers = [PeerServer(tmp_path), PeerServer(node1)]
    try:
        reads = [CopyRead(1, 4096, 1 << 20, 7, 0, 0),
                 CopyRead(1, (2 << 20) + 8, 512 << 10, 7, 1 << 20, 1 << 20)]
        expected = {(7, 0): digest(held[4096:4096 + (1 << 20)]),
                    (7, 1 << 20): digest(held[(2 << 20) + 8:(2 << 20) + 8 + (512 << 10)])}
        r = plan_restart("process", 4, set(), reads, tp, 0, tmp_path, lambda f, o: "none")
        assert [(s.holder, s.replica, s.local) for s in r.sources.values()] == [(1, False,
                                                                                False)]
        plain = np.ones(3 << 20, dtype=np.uint8)
        mover = Mover(0, tmp_path, plain, [("127.0.0.1", s.port) for s in servers], None)
        assert mover.move(r, False, None) == []
        assert first_bad_chunk(r, expected) is None
        with open(node1 / copy_name(1, 4), "r+b") as f:
            f.seek((2 << 20) + 100)
            b = f.read(1)
            f.seek((2 << 20) + 100)
            f.write(bytes([b[0] ^ 0x10]))
        assert mover.move(r, False, None) == []
        bad = first_bad_chunk(r, expected)
        assert bad is not None and (bad.file, bad.offset) == (7, 1 << 20)
        assert r.sources[bad.owner].describe(tp) == "the memory copy of process 1 on node 1"
        (node1 / copy_name(1, 4)).unlink()  # the copy gone: an answer, not a hang
        assert mover.move(r, False, None) == ["process 1 has no copy of process 1's shard"]
    finally:
        for s in servers:
            s.close()


def test_ranges_of_a_copy_map_only_their_span_and_land_where_asked(tmp_path: Path) -> None:
    from ckptbench.runner.tier_store import read_ranges

    held = np.random.default_rng(9).integers(0, 256, 7 << 20, dtype=np.uint8)
    path = tmp_path / copy_name(2, 1)
    write_copy(path, held)
    ranges = [((5 << 20) + 17, 1000, 0), ((3 << 20) + 4095, 70000, 1000),
              ((7 << 20) - 5, 5, 71000), (0, 0, 71005)]
    out = np.zeros(71005, dtype=np.uint8)
    read_ranges(path, ranges, out)
    for at, n, dest in ranges:
        assert np.array_equal(out[dest:dest + n], held[at:at + n])
    with pytest.raises(OSError, match=str(path)):
        read_ranges(path, [((7 << 20) - 5, 6, 0)], out)


@needs_mpi
def test_under_mpi_a_missing_copy_and_an_earlier_error_never_leave_a_send_waiting(
        tmp_path: Path) -> None:
    from test_mpi import MPIRUN, run

    assert MPIRUN is not None
    script = Path(__file__).resolve().parent / "mpi_fetch_ranges_run.py"
    proc, _ = run([MPIRUN, "-np", "2", "--oversubscribe", sys.executable, str(script),
                   str(tmp_path)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(proc.stdout.split("\n")[:2]) == ["ok 0", "ok 1"]
