"""`ckptbench relaunch` of a `--keep-tiers` run that is still running (issue 43 item 2).

A real run (memory and storage tiers, copies kept) is held at a known point: after the
commit of its first storage checkpoint it waits (hooked_run.py pause:DIR) with its memory
copies on disk and its intent recorded on the target. `relaunch` and `relaunch --discard`
refuse it in one line (exit 2) naming the run, why it is taken for live (its process and
host) and what is allowed, and its copies stay. Once the run is killed (SIGKILL to its
process group; its process gone, or a zombie not yet reaped), the relaunch restores as
usual. A run of another host is judged by its lease, as `ckptbench clean` judges it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .lifecycle import TINY, env, gone_within, processes_mentioning, records, run, tree, wait_for
from .runs import one_line

HOOK = Path(__file__).resolve().parent / "hooked_run.py"
INTENT = ".ckptbench-run"
LEASE = ".ckptbench-lease"


def _copies(memory_dir: Path) -> list[str]:
    """The memory tier's files under `memory_dir` (whatever the run directory is named)."""
    return [x for x in tree(memory_dir) if x.endswith(".bin")]


def _held(results: Path) -> list[int] | None:
    """The iterations a results file records as held in the tiers (None: none yet)."""
    try:
        lines = results.read_text().splitlines()
    except FileNotFoundError:
        return None
    held = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if rec.get("type") == "tier_held":
            held.append(rec["iteration"])
    return held or None


@pytest.fixture
def paused_run(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    """A --keep-tiers run held after its first storage commit (its copies of checkpoint 1
    held, recorded in its results); the process, its results and its memory directory. Its
    process group is SIGKILLed on the way out if the test did not end it."""
    memory, target, results = tmp_path / "shm", tmp_path / "t", tmp_path / "r.jsonl"
    memory.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(HOOK), f"pause:{tmp_path}", "--", str(TINY), "--target",
         str(target), "--results", str(results), "--tiers", "memory,storage", "--keep-tiers",
         "--memory-dir", str(memory), "--iterations", "3"],
        cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        wait_for("the run paused after its first commit", (tmp_path / "paused").exists,
                 proc=proc)
        wait_for("checkpoint 1 held in the tiers", lambda: _held(results), proc=proc)
        yield proc, results, memory
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=120)
        assert gone_within(processes_mentioning(str(target)), 60) == []


def _kill(proc: subprocess.Popen[str], target: Path, reap: bool = True) -> None:
    """The run killed outright, as a node failure kills it: its process group SIGKILLed,
    its ranks gone, and the process reaped (`reap=False`: left a zombie, as a rank whose
    mpirun ended is until the init process reaps it)."""
    os.killpg(proc.pid, signal.SIGKILL)
    if reap:
        proc.communicate(timeout=120)
    else:
        wait_for("the run's process to be a zombie", lambda: _state(proc.pid) == "Z")
    assert gone_within(processes_mentioning(str(target)), 60) == []


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _relaunch(results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run("relaunch", str(results), *args, cwd=results.parent)


def test_a_live_run_is_refused_and_relaunched_once_killed(
        paused_run: tuple[subprocess.Popen[str], Path, Path]) -> None:
    proc, results, memory = paused_run
    run_id = records(results)[0]["run_id"]
    before = tree(memory)
    assert any("ckpt1" in c for c in _copies(memory)), before
    for args in ((), ("--discard",)):
        r = _relaunch(results, *args)
        line = one_line(r, 2, run_id, str(proc.pid), socket.gethostname(), "wait", "kill")
        assert "running" in line or "in progress" in line, line
        assert tree(memory) == before, args  # the live run's copies are all there
        assert not (results.parent / "r-relaunch.jsonl").exists()
    assert proc.poll() is None  # the run was not touched

    _kill(proc, results.parent / "t", reap=False)  # exited: a zombie is not a live run
    assert tree(memory) == before  # --keep-tiers: the killed run's copies stay
    r = _relaunch(results)
    assert r.returncode == 0, r.stderr
    proc.communicate(timeout=120)
    out = records(results.parent / "r-relaunch.jsonl")
    assert out and all(x["verified"] and x["iteration"] == 1 for x in out), out
    assert _copies(memory) == []


def test_a_run_of_another_host_is_refused_while_its_lease_is_fresh(
        paused_run: tuple[subprocess.Popen[str], Path, Path]) -> None:
    """After the kill, the run's intent is made another host's (as a node of the cluster
    would have written it): its fresh lease keeps it live; once stale, it is relaunched."""
    proc, results, memory = paused_run
    target = results.parent / "t"
    _kill(proc, target)
    (run_dir,) = [p for p in target.iterdir() if p.name.startswith("run-")]
    intent = json.loads((run_dir / INTENT).read_text())
    assert intent["state"] == "running"  # killed: its intent stayed
    intent.update(host="another-node.example",
                  started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (run_dir / INTENT).write_text(json.dumps(intent))
    (run_dir / LEASE).write_text(json.dumps({"renewed": time.time(), "timeout_s": 300,
                                             "host": "another-node.example"}))
    before = tree(memory)
    r = _relaunch(results, "--discard")
    one_line(r, 2, run_dir.name, "another-node.example", "lease", "wait", "kill")
    assert tree(memory) == before

    intent["started"] = "2026-01-01T00:00:00Z"
    (run_dir / INTENT).write_text(json.dumps(intent))
    (run_dir / LEASE).write_text(json.dumps({"renewed": time.time() - 3600, "timeout_s": 300,
                                             "host": "another-node.example"}))
    r = _relaunch(results, "--discard")
    assert r.returncode == 0, r.stderr
    assert _copies(memory) == []
