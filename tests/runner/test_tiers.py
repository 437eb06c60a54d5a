"""Recovery tiers end to end (issue 32): real processes, node-local copies in /dev/shm,
replicas over TCP between the processes, storage every N-th checkpoint; the process and
node restarts read them back and verify every byte; under mpirun too. The copies outlive
the process that wrote them, a replica cut off in flight is never held, and a byte changed
in a replica is found and named."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_mpi import TINY, local, mpirun, needs_mpi, records

from ckptbench.payload import digest
from ckptbench.runner.tier_peer import HEADER, PUT, PeerServer, fetch, send
from ckptbench.runner.tier_restart import first_mismatch, restart_rounds
from ckptbench.runner.tier_store import copy_name, memory_pages, read_copy

SHM = Path("/dev/shm")


@pytest.fixture
def memory_dir() -> Iterator[Path]:
    """A directory of its own in /dev/shm: what a run leaves there is the test's to see."""
    path = Path(tempfile.mkdtemp(prefix="ckptbench-test-", dir=SHM if SHM.is_dir() else None))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def tiered(tmp_path: Path, memory_dir: Path, *args: str, mpi: int = 0
           ) -> list[dict]:
    results = tmp_path / "r.jsonl"
    common = (str(TINY), "--target", str(tmp_path / "t"), "--results", str(results),
              "--memory-dir", str(memory_dir), *args)
    proc, _ = mpirun(mpi, *common) if mpi else local(*common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return records(results)


def test_every_tier_written_and_every_restart_verified(tmp_path: Path, memory_dir: Path
                                                       ) -> None:
    recs = tiered(tmp_path, memory_dir, "--tiers", "memory,peer,storage", "--ranks-per-node",
                  "2", "--iterations", "4", "--storage-every", "2")
    tiers = [r for r in recs if r["type"] == "tier"]
    assert {r["iteration"] for r in tiers if r["tier"] == "memory"} == {1, 2, 3, 4}
    assert {r["iteration"] for r in tiers if r["tier"] == "peer"} == {1, 2, 3, 4}
    assert all(r["bytes"] > 0 and r["blocking_s"] > 0 and r["baseline_s"] > 0 for r in tiers)
    peer = [r for r in tiers if r["tier"] == "peer"]
    assert all(r["transport"] == "tcp-loopback" for r in peer)
    # ring over 2 nodes of 2: process p's replica is on the other node, same place
    assert {r["process"]: r["holders"] for r in peer} == {0: [2], 1: [3], 2: [0], 3: [1]}
    saves = sorted(r["iteration"] for r in recs if r["type"] == "phase" and r["phase"] == "save")
    assert saves == [2, 4]  # storage every 2nd checkpoint
    restores = [r for r in recs if r["type"] == "tier_restore"]
    served = {(r["scenario"], r["process"]): (r["tier"], r["from_node"]) for r in restores}
    assert served == {("process", 0): ("memory", 0), ("process", 1): ("memory", 0),
                      ("process", 2): ("memory", 1), ("process", 3): ("memory", 1),
                      ("node", 0): ("memory", 0), ("node", 1): ("memory", 0),
                      ("node", 2): ("peer", 0), ("node", 3): ("peer", 0),
                      # 2 nodes, 1 replica: the last node's group is every node
                      **{("group", p): ("storage", None) for p in range(4)}}
    assert all(r["verified"] and r["iteration"] == 4 for r in restores)
    summary = {(r["type"], r.get("tier") or r.get("scenario")): r for r in recs
               if r["type"] in ("tier_summary", "tier_restore_summary")}
    assert set(summary) == {("tier_summary", "memory"), ("tier_summary", "peer"),
                            ("tier_restore_summary", "process"),
                            ("tier_restore_summary", "node"),
                            ("tier_restore_summary", "group"),
                            ("tier_restore_summary", "storage")}
    assert summary["tier_restore_summary", "node"]["served"] == {"memory": 2, "peer": 2}
    assert not list(memory_dir.iterdir())  # every copy removed by name, directories too
    # the levels as measured feed the multi-level cadence
    (levels,) = [r["levels"] for r in recs if r["type"] == "tier_levels"]
    assert [lv.split(":")[0] for lv in levels] == ["memory", "peer", "storage"]
    assert [lv.split(":")[3] for lv in levels] == ["process", "node", "job"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-m", "ckptbench", "levels", "--tiers-results",
                          str(tmp_path / "r.jsonl"), "--failure-classes", "llama3", "--gpus",
                          "1024", "--force"], env=env, capture_output=True, text=True,
                         timeout=120, check=False)  # forced: a tiny run's storage for 1,024 GPUs
    assert out.returncode == 0, out.stderr
    assert [line.split()[0] for line in out.stdout.splitlines()[:3]] == levels_names(levels)


def levels_names(levels: list[str]) -> list[str]:
    return [lv.split(":")[0] for lv in levels]


def test_cliques_and_two_replicas_on_four_nodes(tmp_path: Path, memory_dir: Path) -> None:
    recs = tiered(tmp_path, memory_dir, "--tiers", "memory,peer", "--ranks-per-node", "1",
                  "--peer-replicas", "1", "--peer-placement", "clique", "--iterations", "3")
    peer = {r["process"]: r["holders"] for r in recs if r["type"] == "tier"
            and r["tier"] == "peer"}
    assert peer == {0: [1], 1: [0], 2: [3], 3: [2]}
    assert not any(r["type"] == "phase" for r in recs)  # no storage tier: no save
    node = {r["process"]: r["from_process"] for r in recs
            if r["type"] == "tier_restore" and r["scenario"] == "node"}
    assert node == {0: 0, 1: 1, 2: 2, 3: 2}  # node 3 replaced: its clique partner serves
    recs = tiered(tmp_path / "b", memory_dir, "--tiers", "peer", "--ranks-per-node", "1",
                  "--peer-replicas", "2", "--iterations", "1")
    restores = [r for r in recs if r["type"] == "tier_restore"]
    assert {r["tier"] for r in restores} == {"peer"}  # no memory tier: peers serve all
    assert not list(memory_dir.iterdir())


def test_tier_options_in_a_run_table_are_recorded_and_replayed(tmp_path: Path,
                                                               memory_dir: Path) -> None:
    """The tier options are run options: a [run] table sets them over the workload's
    [tiers], the results file records them, and --replay runs the same tiers again."""
    workload = tmp_path / "w.toml"
    workload.write_text(TINY.read_text() + "\n[tiers]\nuse = ['memory', 'peer', 'storage']\n"
                        f"ranks_per_node = 2\n[run]\nstorage_every = 2\niterations = 2\n"
                        f"memory_dir = '{memory_dir}'\ntarget = '{tmp_path / 't'}'\n")
    first, again = tmp_path / "first.jsonl", tmp_path / "again.jsonl"
    for args, path in (((str(workload),), first), (("--replay", str(first)), again)):
        proc, _ = local(*args, "--results", str(path))
        assert proc.returncode == 0, proc.stderr[-3000:]
        recs = records(path)
        assert recs[0]["run_options"]["storage_every"] == 2
        assert recs[0]["run_options"]["tiers"] is None  # the workload's [tiers] use
        assert [r["iteration"] for r in recs if r["type"] == "phase"
                and r["phase"] == "save"] == [2]
        assert {r["tier"] for r in recs if r["type"] == "tier"} == {"memory", "peer"}
    assert records(first)[0]["run_options"] == records(again)[0]["run_options"]
    assert not list(memory_dir.iterdir())


def test_a_shard_no_tier_holds_is_one_line_naming_it(tmp_path: Path, memory_dir: Path
                                                     ) -> None:
    """Peer replicas alone on 2 nodes: the node replaced held the only copy of node 0's
    shards (no memory tier keeps them); the restart is refused, never partial."""
    results = tmp_path / "r.jsonl"
    proc, _ = local(str(TINY), "--target", str(tmp_path / "t"), "--results", str(results),
                    "--memory-dir", str(memory_dir), "--tiers", "peer", "--ranks-per-node",
                    "2", "--iterations", "1")
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ckptbench: error")]
    assert errors == ["ckptbench: error: restart (node): checkpoint 1: the shard of process 0 "
                      "(plan ranks 0): no tier holds it after losing node(s) [1]"]
    recs = records(results)
    assert [r["message"] for r in recs if r["type"] == "error"] == [errors[0].removeprefix("ckptbench: error: ")]
    assert {r["scenario"] for r in recs if r["type"] == "tier_restore"} == {"process"}
    assert not list(memory_dir.iterdir())


@needs_mpi
def test_under_mpirun_two_nodes_of_two_ranks(tmp_path: Path, memory_dir: Path) -> None:
    """Under mpirun the replicas go by MPI point-to-point (one host: its shared memory),
    and the restarts fetch them back by MPI."""
    recs = tiered(tmp_path, memory_dir, "--tiers", "memory,peer,storage", "--ranks-per-node",
                  "2", "--iterations", "2", "--storage-every", "2", mpi=4)
    assert recs[0]["launcher"] == "mpi"
    peer = [r for r in recs if r["type"] == "tier" and r["tier"] == "peer"]
    assert {r["transport"] for r in peer} == {"mpi-shm"} and len(peer) == 8
    assert {r["process"]: r["holders"] for r in peer} == {0: [2], 1: [3], 2: [0], 3: [1]}
    (summary,) = [r for r in recs if r["type"] == "tier_summary" and r["tier"] == "peer"]
    assert summary["transport"] == "mpi-shm"
    restores = [r for r in recs if r["type"] == "tier_restore"]
    assert {(r["scenario"], r["tier"]) for r in restores} == {
        ("process", "memory"), ("node", "memory"), ("node", "peer"), ("group", "storage")}
    assert {r["process"]: r["from_process"] for r in restores
            if r["scenario"] == "node" and r["tier"] == "peer"} == {2: 0, 3: 1}
    assert all(r["verified"] for r in restores)
    assert not list(memory_dir.iterdir())


@needs_mpi
def test_under_mpirun_peer_transport_tcp_keeps_the_sockets(tmp_path: Path,
                                                          memory_dir: Path) -> None:
    """--peer-transport tcp under mpirun: the replicas go over TCP, as without MPI (the
    two transports compared under one launcher)."""
    recs = tiered(tmp_path, memory_dir, "--tiers", "memory,peer", "--ranks-per-node", "2",
                  "--iterations", "1", "--peer-transport", "tcp", mpi=4)
    assert {r["transport"] for r in recs if r["type"] == "tier"
            and r["tier"] == "peer"} == {"tcp-loopback"}
    assert all(r["verified"] for r in recs if r["type"] == "tier_restore")
    assert not list(memory_dir.iterdir())


@needs_mpi
def test_under_mpirun_a_group_lost_mixes_memory_peer_and_storage(tmp_path: Path,
                                                                 memory_dir: Path) -> None:
    """4 nodes of 1 rank under mpirun: in the group restart, the replica fetched by MPI,
    the memory copies and the storage read by the DCP plan serve the same checkpoint."""
    recs = tiered(tmp_path, memory_dir, "--tiers", "memory,peer,storage", "--ranks-per-node",
                  "1", "--iterations", "2", "--storage-every", "2", mpi=4)
    group = {r["process"]: (r["tier"], r["from_process"]) for r in recs
             if r["type"] == "tier_restore" and r["scenario"] == "group"}
    assert group == {0: ("peer", 1), 1: ("memory", 1), 2: ("memory", 2), 3: ("storage", None)}
    assert all(r["verified"] for r in recs if r["type"] == "tier_restore")
    assert not list(memory_dir.iterdir())


@needs_mpi
def test_under_mpirun_a_shard_no_tier_holds_is_one_line_not_a_hang(tmp_path: Path,
                                                                   memory_dir: Path) -> None:
    proc, _ = mpirun(4, str(TINY), "--target", str(tmp_path / "t"), "--results",
                     str(tmp_path / "r.jsonl"), "--memory-dir", str(memory_dir), "--tiers",
                     "peer", "--ranks-per-node", "2", "--iterations", "1")
    assert proc.returncode == 1
    assert ("restart (node): checkpoint 1: the shard of process 0 (plan ranks 0): no tier "
            "holds it after losing node(s) [1]") in proc.stderr
    assert not list(memory_dir.iterdir())


def test_a_memory_copy_outlives_the_process_that_wrote_it(memory_dir: Path) -> None:
    """The writer is killed (SIGKILL: no cleanup runs); a new process reads the copy."""
    path = memory_dir / copy_name(0, 1)
    code = ("import numpy as np, os, signal, sys; from pathlib import Path; "
            "from ckptbench.runner.tier_store import write_copy; "
            "data = np.random.default_rng(7).integers(0, 256, 3 << 20, dtype=np.uint8); "
            f"write_copy(Path({str(path)!r}), data); print('written', flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL and "written" in proc.stdout
    out = np.zeros(3 << 20, dtype=np.uint8)
    read_copy(path, out)
    want = np.random.default_rng(7).integers(0, 256, 3 << 20, dtype=np.uint8)
    assert digest(out) == digest(want)


def test_a_byte_changed_in_a_replica_is_found_and_named(tmp_path: Path) -> None:
    server = PeerServer(tmp_path)
    try:
        data = np.arange(1 << 20, dtype=np.uint64).view(np.uint8)[: 3 << 20].copy()
        files = [("__0_0.distcp", 1 << 20), ("__0_1.distcp", 2 << 20)]
        want = [digest(data[: 1 << 20]), digest(data[1 << 20:])]
        send(("127.0.0.1", server.port), PUT, 5, 2, data)
        replica = tmp_path / copy_name(5, 2, replica=True)
        assert replica.stat().st_size == data.nbytes
        back = np.zeros_like(data)
        assert fetch(("127.0.0.1", server.port), 5, 2, back)
        assert first_mismatch(back, files, want) is None
        with open(replica, "r+b") as f:  # one byte of the second file flipped
            f.seek((1 << 20) + 12345)
            b = f.read(1)
            f.seek((1 << 20) + 12345)
            f.write(bytes([b[0] ^ 0x40]))
        assert fetch(("127.0.0.1", server.port), 5, 2, back)
        assert first_mismatch(back, files, want) == "__0_1.distcp"
    finally:
        server.close()


def test_a_replica_cut_off_in_flight_is_never_held(tmp_path: Path) -> None:
    """The sender dies after half the bytes: the holder keeps no replica (the previous
    checkpoint is what a restart would read) and no part of it."""
    server = PeerServer(tmp_path)
    try:
        send(("127.0.0.1", server.port), PUT, 1, 1, np.ones(1 << 20, dtype=np.uint8))
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(HEADER.pack(PUT, 1, 2, 1 << 20))
            sock.sendall(b"\2" * (1 << 19))
        deadline = time.monotonic() + 60
        while not server.errors and time.monotonic() < deadline:  # the holder saw it end
            time.sleep(0.01)
        assert "closed the connection after 524288 of 1048576 bytes" in server.errors[0]
        out = np.zeros(1 << 20, dtype=np.uint8)
        assert not fetch(("127.0.0.1", server.port), 1, 2, out)  # checkpoint 2: not held
        assert fetch(("127.0.0.1", server.port), 1, 1, out) and out.min() == 1  # 1 is
        assert sorted(p.name for p in tmp_path.iterdir()) == [copy_name(1, 1, replica=True)], server.errors
    finally:
        server.close()


def test_report_shows_the_tiers_and_their_cadence_in_text_and_html(
        tmp_path: Path, memory_dir: Path) -> None:
    """`report --failure-preset CLASSES --gpus N` of a tiered run: the tier tables and the
    multi-level cadence (the optimum as `levels --tiers-results` finds it) in the terminal
    table, and in the HTML page with its figure, opened in Chromium."""
    from tests.report.chromium import find_chromium, visit
    from tests.report.test_html_report import assert_drawn

    tiered(tmp_path, memory_dir, "--tiers", "memory,peer,storage", "--ranks-per-node", "2",
           "--iterations", "2", "--storage-every", "2")
    results, page = tmp_path / "r.jsonl", tmp_path / "page.html"
    job = ["--failure-preset", "llama3", "--gpus", "16384"]
    report = subprocess.run([sys.executable, "-m", "ckptbench", "report", str(results), *job,
                             "--html", str(page)], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert "multi-level cadence" in report.stdout and "optimum (stated rules" in report.stdout
    levels = subprocess.run([sys.executable, "-m", "ckptbench", "levels", "--tiers-results",
                             str(results), "--failure-classes", "llama3", "--gpus", "16384",
                             "--force"],  # as report uses them: forced, cautions printed
                            capture_output=True, text=True, timeout=300)
    assert levels.returncode == 0, levels.stderr
    (optimum,) = [line for line in levels.stdout.splitlines()
                  if line.startswith("optimum (stated rules): ")]
    schedule = optimum.removeprefix("optimum (stated rules): ").split(" -> ")[0]
    # the same answer as `ckptbench levels` (the terminal wraps the table's notes)
    assert schedule in " ".join(report.stdout.split())
    text = page.read_text()
    assert "<h2>Recovery tiers</h2>" in text and "recovery tiers: restarts" in text
    # the pages the memory copies are held in: in the records and beside the directory
    pages = memory_pages(str(memory_dir))
    assert pages.startswith("tmpfs")
    held = [r for r in records(results) if r["type"] == "tier" and r["tier"] == "memory"]
    assert held and {r["pages"] for r in held} == {pages}
    assert f"{memory_dir} ({pages})" in text
    assert schedule in text and 'id="levels-1"' in text
    binary = find_chromium()
    if binary is None:
        pytest.fail("no chromium on PATH: run .ci/setup", pytrace=False)
    seen = visit(page, binary)
    assert seen.errors == []
    assert all(i["complete"] and i["width"] >= 600 for i in seen.images)
    figure = text.split('id="levels-1"', 1)[1].split('base64,', 1)[1].split('"', 1)[0]
    import base64

    assert_drawn(base64.b64decode(figure))
    # classes without scopes (a job preset): the tier tables, no cadence
    plain = subprocess.run([sys.executable, "-m", "ckptbench", "report", str(results),
                            "--failure-preset", "opt175b"], capture_output=True, text=True,
                           timeout=300)
    assert plain.returncode == 0, plain.stderr
    assert "recovery tiers: restarts" in plain.stdout
    assert "multi-level cadence" not in plain.stdout



@needs_mpi
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_restarts_read_in_rounds_between_their_baselines_over_mpi_and_tcp(
        tmp_path: Path, memory_dir: Path, transport: str) -> None:
    """Under mpirun, over MPI point-to-point and over TCP: the process and node restarts
    read 4 times between 4 baselines (A B B A B A A B), the record's seconds the medians; the
    group restart (storage read cold) once each; every shard verified."""
    recs = tiered(tmp_path, memory_dir, "--tiers", "memory,peer,storage", "--ranks-per-node",
                  "1", "--iterations", "2", "--storage-every", "2", "--peer-transport",
                  transport, mpi=4)
    assert {r["transport"] for r in recs if r["type"] == "tier" and r["tier"] == "peer"} == (
        {"mpi-shm"} if transport == "auto" else {"tcp-loopback"})
    restores = [r for r in recs if r["type"] == "tier_restore"]
    assert {r["scenario"] for r in restores} == {"process", "node", "group"}
    for r in restores:
        n = 1 if r["scenario"] == "group" else 4
        assert len(r["rounds_s"]) == n and r["seconds"] == statistics.median(r["rounds_s"])
        assert r["verified"]
        if r["tier"] != "storage":
            assert len(r["baseline_rounds_s"]) == n and all(b > 0 for b in
                                                            r["baseline_rounds_s"])
            assert r["baseline_s"] == statistics.median(r["baseline_rounds_s"])

def test_a_replication_group_lost_restores_the_unheld_shards_from_storage(
        tmp_path: Path, memory_dir: Path) -> None:
    """Scenario (c): 4 nodes of 1 process, ring of 1 replica. The last node's group (node 3
    and node 0, which holds its replica) is lost: process 3's shard is in no tier and comes
    from storage by the DCP load plan; process 0's own copy went with node 0, its replica
    on node 1 serves it; processes 1 and 2 read their memory copies. The newest stored
    checkpoint (2 of 3: the one before the last) is the one restored, every byte checked,
    and it is removed afterwards."""
    recs = tiered(tmp_path, memory_dir, "--tiers", "memory,peer,storage", "--ranks-per-node",
                  "1", "--iterations", "3", "--storage-every", "2")
    group = {r["process"]: r for r in recs if r["type"] == "tier_restore"
             and r["scenario"] == "group"}
    assert {p: (r["tier"], r["from_process"]) for p, r in group.items()} == {
        0: ("peer", 1), 1: ("memory", 1), 2: ("memory", 2), 3: ("storage", None)}
    assert all(r["iteration"] == 2 and r["verified"] and r["lost_nodes"] == [0, 3]
               for r in group.values())
    assert group[3]["reads"] == "dcp plan"
    shard = {r["process"]: r["bytes"] for r in recs
             if r["type"] == "tier" and r["tier"] == "memory"}
    assert group[3]["bytes"] >= shard[3] > 0
    (summary,) = [r for r in recs if r["type"] == "tier_restore_summary"
                  and r["scenario"] == "group"]
    assert summary["served_by"] == {"memory": [1, 2], "peer": [0], "storage": [3]}
    assert summary["verified"]
    assert not [p for p in (tmp_path / "t").rglob("*") if p.is_file()]  # the kept one too
    assert not list(memory_dir.iterdir())
    report = subprocess.run([sys.executable, "-m", "ckptbench", "report",
                             str(tmp_path / "r.jsonl")], capture_output=True, text=True,
                            timeout=300, check=False)
    assert report.returncode == 0, report.stderr
    assert "storage p3" in " ".join(report.stdout.split())


def test_a_group_lost_with_storage_older_than_the_tiers_restores_all_from_storage(
        tmp_path: Path, memory_dir: Path) -> None:
    """The newest stored checkpoint (3 of 5) is older than what the tiers still hold (4
    and 5): the group restart reads every shard from storage, none from a tier."""
    recs = tiered(tmp_path, memory_dir, "--tiers", "memory,storage", "--ranks-per-node", "2",
                  "--iterations", "5", "--storage-every", "3")
    group = [r for r in recs if r["type"] == "tier_restore" and r["scenario"] == "group"]
    assert {(r["process"], r["tier"], r["iteration"]) for r in group} == {
        (p, "storage", 3) for p in range(4)}
    assert all(r["verified"] and r["bytes"] > 0 for r in group)
    assert not list(memory_dir.iterdir())


@pytest.mark.parametrize("how", ["group SIGTERM", "rank SIGKILL"])
def test_a_run_stopped_mid_checkpoint_leaves_no_copy_in_memory(tmp_path: Path,
                                                              memory_dir: Path, how: str) -> None:
    """A copy in tmpfs is host memory: once the run ends, however it ends (a signal to the
    whole process group, as Slurm and systemd send; a rank killed outright), none of its
    copies is left, and what else is in the memory directory stays."""
    foreign = memory_dir / "not-ckptbench.bin"
    foreign.write_bytes(b"x")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptbench", "run", str(TINY), "--target", str(tmp_path / "t"),
         "--results", str(tmp_path / "r.jsonl"), "--memory-dir", str(memory_dir),
         "--tiers", "memory,peer,storage", "--ranks-per-node", "2", "--iterations", "200"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(memory_dir.glob("ckptbench-*/node*/p*-ckpt*.bin")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.01)
        if how == "group SIGTERM":
            os.killpg(proc.pid, signal.SIGTERM)
        else:  # one rank, the parent's first child
            rank = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
            os.kill(rank, signal.SIGKILL)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0, err[-2000:]
    assert sorted(p.name for p in memory_dir.iterdir()) == [foreign.name], err[-2000:]


def test_removing_a_runs_copies_takes_its_names_only_and_follows_no_link(tmp_path: Path
                                                                        ) -> None:
    """A run's copies are removed by their names, in the node directories it made only:
    a link at a copy's name or a node's name is not followed, other files stay."""
    from ckptbench.runner.tier_store import RunDir, _make, remove_copies, run_dir_name

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "p0-ckpt1.bin").write_bytes(b"theirs")
    name = run_dir_name("run-1", "0123456789abcdef")
    ident, nodes = _make(str(tmp_path), name, [0])
    node0 = tmp_path / name / "node0"
    for copy in ("p0-ckpt1.bin", "replica-p3-ckpt2.bin.part", "notes.txt"):
        (node0 / copy).write_bytes(b"x")
    (node0 / "p1-ckpt1.bin").symlink_to(outside / "p0-ckpt1.bin")
    (node0.parent / "node1").symlink_to(outside)
    run = RunDir(str(tmp_path), name, ident, nodes, ((ident, nodes),))
    assert remove_copies(run) == []
    assert sorted(p.name for p in node0.iterdir()) == ["notes.txt"]
    assert (outside / "p0-ckpt1.bin").read_bytes() == b"theirs"
    assert (node0.parent / "node1").is_symlink()


def test_a_node_restarts_fetches_and_their_plain_transfers_run_beside_alike_neighbours(
        ) -> None:
    """In a node restart the surviving processes read their memory copies (2-5x the time
    of a memcpy on one host) or make their plain copies while the replaced node's
    processes fetch from peers or make their plain transfers. Each fetch round and each
    plain-transfer round runs beside as many of the survivors' reads as of their copies,
    and each survivor's read and copy beside as many fetches as plain transfers: neither
    ratio is a comparison of different neighbours. Every scenario still alternates its
    reads and baselines, equally many of each, and ends with a read."""
    for scenario in ("process", "node", "group"):
        rounds = restart_rounds(scenario)
        for side in (0, 1):
            steps = [r[side] for r in rounds]
            assert steps.count("read") == steps.count("baseline") >= 1
            assert steps[-1] == "read"  # the bytes verified are a read's, not a baseline's
    node = restart_rounds("node")
    for mine in ("read", "baseline"):
        for side in (0, 1):
            beside = [r[1 - side] for r in node if r[side] == mine]
            assert beside.count("read") == beside.count("baseline"), (side, mine, beside)


def test_the_pages_of_a_memory_dir_are_named(tmp_path: Path) -> None:
    """A tmpfs mounted with huge=always holds copies in 2 MiB pages, /dev/shm here in 4 KiB
    ones (the restart's cost: docs/tiers.md), a disk directory in its page cache."""
    mount = tmp_path / "huge"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "huge=always,size=64m", "tmpfs",
                           str(mount)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.strip()}")
    try:
        assert memory_pages(str(mount)) == "tmpfs huge=always, 2 MiB pages"
        (mount / "d").mkdir()
        assert memory_pages(str(mount / "d")) == "tmpfs huge=always, 2 MiB pages"
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    assert memory_pages(str(tmp_path)).endswith(", page cache") or "tmpfs" in memory_pages(
        str(tmp_path))
    assert memory_pages("/dev/shm") in ("tmpfs, 4 KiB pages", "tmpfs huge=force, 2 MiB pages",
                                        "tmpfs huge=always, 2 MiB pages",
                                        "tmpfs huge=within_size, 2 MiB pages")


def test_a_full_memory_dir_is_one_error_not_a_sigbus(tmp_path: Path) -> None:
    """A copy that does not fit (the tmpfs filled after the run's memory check) fails when
    its file is made, naming --memory-dir; the part is removed. Without the pages taken up
    front the first write into the mapping raises SIGBUS, which kills the process."""
    from ckptbench.errors import CkptbenchError
    from ckptbench.runner.tier_store import node_dir, open_copy

    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.strip()}")
    try:
        where = node_dir(str(mount), "run-x", 0)
        where.mkdir(parents=True)
        with pytest.raises(CkptbenchError) as err:
            open_copy(where / copy_name(0, 1), 8 << 20)
        assert str(err.value).startswith(f"--memory-dir {mount}: no room for a copy of 8")
        assert list(where.iterdir()) == []
        fd, mapped = open_copy(where / copy_name(0, 2), 1 << 20)  # one that fits
        assert mapped is not None and len(mapped) == 1 << 20
        mapped.close()
        os.close(fd)
    finally:
        subprocess.run(["umount", str(mount)], check=True)
