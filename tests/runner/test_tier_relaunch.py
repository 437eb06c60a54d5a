"""A node killed during replication, then the job relaunched from the tiers (issue 32):
a real run with the local launcher, 4 processes on 2 nodes, memory and peer tiers, its
copies kept (--keep-tiers); both processes of node 1 SIGKILLed while checkpoint 3's
replicas are in flight (held there by tests/runner/tier_hold_run.py, the test waits for
that state); `ckptbench relaunch` then restores checkpoint 2, verified, node 1's processes
served by peers, and removes the copies by name. Adversarial: copies gone, a changed byte,
the results of another run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_mpi import MPI_ENV, MPIRUN, TINY, local, needs_mpi, records

from ckptbench.errors import SpecError
from ckptbench.tierspec import parse_tiers

HOLD_RUN = Path(__file__).with_name("tier_hold_run.py")
SHM = Path("/dev/shm")
TIERED = ("--tiers", "memory,peer", "--ranks-per-node", "2")


@pytest.fixture
def shm() -> Iterator[Path]:
    """A directory of this test's own in /dev/shm."""
    path = Path(tempfile.mkdtemp(prefix="ckptbench-test-", dir=SHM if SHM.is_dir() else None))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def relaunch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", "relaunch", *args],
                          capture_output=True, text=True, timeout=120)


def copies(shm: Path) -> list[str]:
    return sorted(str(p.relative_to(shm)) for p in shm.rglob("*") if p.is_file())


def kept_run(tmp_path: Path, shm: Path, name: str, *extra: str) -> Path:
    results = tmp_path / f"{name}.jsonl"
    proc, _ = local(str(TINY), "--target", str(tmp_path / name), "--results", str(results),
                    "--memory-dir", str(shm), *TIERED, "--iterations", "2", "--no-restore",
                    *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return results


def kill_when_held(proc: subprocess.Popen[str], flags: list[Path]) -> str:
    """Once every flag is there (those processes' replication is in flight), SIGKILL the
    processes they name; the run's stderr once it ended (its whole group killed if the
    test fails first)."""
    ok = False
    deadline = time.monotonic() + 180
    try:
        while not all(f.exists() for f in flags):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.01)
        for f in flags:
            os.kill(int(f.read_text()), signal.SIGKILL)
        err = proc.communicate(timeout=120)[1]
        ok = True
        return err
    finally:
        if not ok and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def killed_and_relaunched(tmp_path: Path, shm: Path, launch: list[str],
                          env: dict[str, str]) -> None:
    """`launch` (a command before tier_hold_run.py) runs 4 processes on 2 nodes, memory and
    peer tiers kept; node 1's processes are SIGKILLed while their replicas of checkpoint 3
    are in flight; the relaunch restores checkpoint 2, node 1's shards from node 0's
    replicas, verified, and removes every copy."""
    results, flag = tmp_path / "r.jsonl", tmp_path / "held"
    proc = subprocess.Popen(
        [*launch, sys.executable, str(HOLD_RUN), "--at", "3", "--procs", "2,3", "--flag",
         str(flag), "--", str(TINY), "--target", str(tmp_path / "t"), "--results",
         str(results), "--memory-dir", str(shm), *TIERED, "--iterations", "5", "--keep-tiers"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, **env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    err = kill_when_held(proc, [Path(f"{flag}.p2"), Path(f"{flag}.p3")])
    assert proc.returncode != 0, err[-2000:]
    recs = records(results)
    assert [r["iteration"] for r in recs if r["type"] == "tier_held"] == [1, 2]
    assert any("ckpt3" in c for c in copies(shm)), copies(shm)  # 3 was partly written
    run_id = recs[0]["run_id"]
    done = relaunch(str(results), "--replaced-node", "1")
    assert done.returncode == 0, done.stderr
    out = records(tmp_path / "r-relaunch.jsonl")
    assert sorted(r["process"] for r in out) == [0, 1, 2, 3]
    assert {r["iteration"] for r in out} == {2}  # 3 not held: 2 restores
    assert all(r["verified"] and r["not_held"] == [3] for r in out)
    served = {r["process"]: (r["tier"], r["from_node"]) for r in out}
    assert served == {0: ("memory", 0), 1: ("memory", 0), 2: ("peer", 0), 3: ("peer", 0)}
    assert all(r["bytes"] == sum(s for _n, s in h["files"][r["process"]])
               for r in out for h in recs if h["type"] == "tier_held" and h["iteration"] == 2)
    assert "not held (cut off in flight), not restored: checkpoint(s) 3" in done.stdout
    assert copies(shm) == [] and not list(shm.glob(f"ckptbench-{run_id}-*"))


def test_a_node_killed_during_replication_relaunches_from_the_previous_checkpoint(
        tmp_path: Path, shm: Path) -> None:
    killed_and_relaunched(tmp_path, shm, [], {})


@needs_mpi
def test_under_mpirun_a_node_killed_during_replication_relaunches(tmp_path: Path,
                                                                   shm: Path) -> None:
    """mpirun takes the whole job down when a rank is SIGKILLed; the copies stay."""
    assert MPIRUN is not None
    killed_and_relaunched(tmp_path, shm, [MPIRUN, "-np", "4", "--oversubscribe"], MPI_ENV)


def test_a_relaunch_at_a_changed_byte_gone_copies_or_another_run_fails_naming_it(
        tmp_path: Path, shm: Path) -> None:
    kept = kept_run(tmp_path, shm, "kept", "--keep-tiers")
    run_id = records(kept)[0]["run_id"]
    (made,) = shm.glob(f"ckptbench-{run_id}-*")  # its name has a random part
    node0 = made / "node0"
    before = copies(shm)
    assert f"{made.name}/node0/p0-ckpt2.bin" in before

    other = kept_run(tmp_path, shm, "other")  # its copies went with it
    done = relaunch(str(other))
    assert done.returncode == 2 and "--keep-tiers" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert copies(shm) == before  # the kept run's copies are not the other run's to touch
    done = relaunch(str(tmp_path / "none.jsonl"))
    assert done.returncode == 2 and "none.jsonl" in done.stderr
    forged = tmp_path / "forged.jsonl"  # a run id that would name another directory
    forged.write_text(kept.read_text().replace(run_id, "../" + run_id))
    done = relaunch(str(forged), "--discard")
    assert done.returncode == 2 and "run id '../" in done.stderr

    changed = node0 / "p1-ckpt2.bin"
    data = bytearray(changed.read_bytes())
    data[len(data) // 2] ^= 0xFF
    changed.write_bytes(bytes(data))
    existing = tmp_path / "existing.jsonl"
    existing.write_text("mine\n")
    done = relaunch(str(kept), "--out", str(existing))  # refused before any copy is read
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert f"{existing}: results file exists" in done.stderr
    assert existing.read_text() == "mine\n"
    done = relaunch(str(kept), "--out", str(tmp_path / "bad.jsonl"))
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "bad.jsonl").exists()  # the relaunch's own, empty: removed
    assert "checkpoint 2: process 1's shard: file " in done.stderr
    assert str(changed) in done.stderr and "differs from the save's digest" in done.stderr
    assert copies(shm) == before  # a failed relaunch leaves them for another

    for p in shm.rglob("*p0-ckpt*.bin"):  # every copy of process 0's shard gone
        p.unlink()
    done = relaunch(str(kept), "--out", str(tmp_path / "gone.jsonl"))
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert "checkpoint 2: no copy of process 0's shard is left" in done.stderr

    foreign = node0 / "notes.txt"
    foreign.write_text("not ckptbench's")
    done = relaunch(str(kept), "--discard")
    assert done.returncode == 0, done.stderr
    assert copies(shm) == [f"{made.name}/node0/notes.txt"]


def test_an_altered_results_file_is_one_line_and_the_copies_stay(
        tmp_path: Path, shm: Path) -> None:
    """Bad input, not a traceback: a line that is no record, tier_held fields missing or
    of the wrong shape, a shard size no copy has (never allocated)."""
    kept = kept_run(tmp_path, shm, "kept", "--keep-tiers")
    recs = records(kept)
    before = copies(shm)
    last = max(i for i, r in enumerate(recs) if r["type"] == "tier_held")

    def altered(name: str, **fields: object) -> Path:
        rec = {k: v for k, v in recs[last].items() if not (k in fields and fields[k] is None)}
        rec.update({k: v for k, v in fields.items() if v is not None})
        out = tmp_path / f"{name}.jsonl"
        out.write_text("".join(json.dumps(r) + "\n" for r in [*recs[:last], rec]))
        return out

    cases = {"node_of": altered("no-nodes", node_of=None),
             "files": altered("files", files=[[["a", -5]]] * 4),
             "holders": altered("holders", holders=[[9]] * 4),
             "iteration": altered("iteration", iteration="x"),
             "digests": altered("digests", digests=[[1, 2]] * 4)}
    for field, path in cases.items():
        done = relaunch(str(path), "--out", str(tmp_path / "out.jsonl"))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
        assert f"{path}: tier_held record {field} = " in lines[0]
    (tmp_path / "number.jsonl").write_text(kept.read_text() + "5\n")
    done = relaunch(str(tmp_path / "number.jsonl"), "--out", str(tmp_path / "out.jsonl"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "not a record" in done.stderr
    huge = altered("huge", files=[[[f[0][0], 1 << 50]] for f in recs[last]["files"]])
    done = relaunch(str(huge), "--out", str(tmp_path / "out.jsonl"))
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert f"the shard has {1 << 50}" in done.stderr
    assert copies(shm) == before
    (made,) = shm.glob(f"ckptbench-{recs[0]['run_id']}-*")
    stray = made / "node9"  # a file, not a node's directory
    stray.write_text("not ckptbench's")
    done = relaunch(str(kept), "--out", str(tmp_path / "out.jsonl"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert copies(shm) == [stray.relative_to(shm).as_posix()]


def test_a_lost_memory_copy_is_served_by_its_peer(
        tmp_path: Path, shm: Path) -> None:
    kept = kept_run(tmp_path, shm, "kept", "--keep-tiers")
    (run,) = shm.glob(f"ckptbench-{records(kept)[0]['run_id']}-*")
    (run / "node0" / "p0-ckpt2.bin").unlink()
    done = relaunch(str(kept), "--out", str(tmp_path / "a.jsonl"), "--replaced-node", "7")
    assert done.returncode == 2 and "--replaced-node 7: allowed: a node of the run, 0-1" \
        in done.stderr
    done = relaunch(str(kept), "--out", str(tmp_path / "a.jsonl"))
    assert done.returncode == 0, done.stderr
    out = {r["process"]: r for r in records(tmp_path / "a.jsonl")}
    assert {r["iteration"] for r in out.values()} == {2}
    assert (out[0]["tier"], out[0]["from_node"]) == ("peer", 1)
    assert (out[2]["tier"], out[2]["from_node"]) == ("memory", 1)
    assert copies(shm) == []


def test_keep_in_a_tiers_table_is_a_boolean() -> None:
    assert parse_tiers({"use": ["memory"], "keep": True}).keep
    with pytest.raises(SpecError, match=r"\[tiers\] keep = .*allowed: true or false"):
        parse_tiers({"use": ["memory"], "keep": "yes"})
    assert json.dumps(parse_tiers({}).keep) == "false"


@pytest.mark.parametrize(("args", "says"), [
    (("--mode", "async", "--tiers", "memory,peer"), "--keep-tiers ([tiers] keep) needs --mode sync"),
    ((), "--keep-tiers needs tiers"),
])
def test_keep_tiers_without_what_it_keeps_is_one_line(tmp_path: Path, args: tuple[str, ...],
                                                      says: str) -> None:
    proc, _ = local(str(TINY), "--target", str(tmp_path / "t"), "--keep-tiers", *args)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        next(line for line in proc.stderr.splitlines() if says in line)]
    assert not (tmp_path / "t").exists()
