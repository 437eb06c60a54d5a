"""Never hang (issue 29, families 6 and 8).

A rank killed while it holds a lock of the run's shared machinery, a rank stopped with
SIGSTOP (alive, moving nothing: its own stall watch is stopped with it) and a signal in
the middle of `ckptbench restore` all end the command in bounded time, with one line and
an error record in the results. Every run here is started in a session of its own and
killed whole if it outlives its bound (a hang fails the test; it never outlives it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .lifecycle import gone_within, messages, processes_mentioning, records, wait_for
from .runs import ROOT, SABOTAGE, TINY, env

BOUND_S = 180  # generous: a loaded 2-core machine; a hang is forever
STALL = ("--stall-timeout", "8s", "--block-size", "1MiB")


def _start(action: str, *args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SABOTAGE), action, "--", *args], cwd=cwd,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _ended(proc: subprocess.Popen[str], what: str) -> str:
    """stderr of `proc` once it ended; a run still going after BOUND_S is killed (its
    whole session) and fails the test."""
    try:
        _out, err = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"hung: still running {BOUND_S} s after {what}")
    return err


def _one_error(err: str, rc: int, proc: subprocess.Popen[str], *needles: str) -> str:
    lines = [line for line in messages(err) if not line.startswith("ckptbench: note:")]
    assert proc.returncode == rc, err[-3000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _error_record(results: Path) -> dict[str, Any]:
    errors = [r for r in records(results) if r["type"] == "error"]
    assert errors, records(results)
    return errors[-1]


def test_a_rank_killed_holding_the_runs_locks_does_not_hang_it(tmp_path: Path) -> None:
    """The rank that evicts the checkpoint first takes every multiprocessing lock it can
    reach (a barrier's, the queues' write locks) and is SIGKILLed: the parent stops the
    others, cleans up, and says which rank died; the record says so too."""
    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    proc = _start("die-holding-locks", str(TINY), "--target", str(target), "--results",
                  str(results), cwd=tmp_path)
    err = _ended(proc, "a rank died")
    line = _one_error(err, 1, proc, "died (signal 9)")
    error = _error_record(results)
    assert error["message"] in line and error["kind"] == "internal"
    assert not target.exists() and processes_mentioning(str(target)) == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stopped_rank_fails_the_save_within_the_stall_timeout(tmp_path: Path,
                                                                mode: str) -> None:
    """Rank 1 stops itself (SIGSTOP) after the first block of its file: alive, moving
    nothing, its own watchdog stopped with it. The parent sees it and fails the run."""
    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    loop = ("--mode", "async", "--step-seconds", "0.02", "--steps-per-checkpoint", "2") \
        if mode == "async" else ()
    proc = _start("stop:__1_", str(TINY), "--target", str(target), *STALL, *loop,
                  "--results", str(results), cwd=tmp_path)
    err = _ended(proc, "rank 1 stopped")
    _one_error(err, 1, proc, "rank 1 stalled", "--stall-timeout 8s")
    assert _error_record(results)["kind"] == "stall"
    assert not target.exists() and processes_mentioning(str(target)) == []


@pytest.mark.parametrize("action", ["hang:__1_", "gil-hang:__1_"])
def test_a_stalled_rank_is_reported_with_the_frame_it_was_waiting_in(tmp_path: Path,
                                                                     action: str) -> None:
    """Rank 1's write blocks inside the backend's call: in Python (its own watch sees it and
    dumps its threads) or in a C call holding the GIL (no thread of it runs: the parent
    sees it and asks for the dump, answered from C). Either way the one line names the
    backend call it was in, and the error record holds every thread's stack."""
    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    proc = _start(action, str(TINY), "--target", str(target), *STALL, "--results",
                  str(results), cwd=tmp_path)
    err = _ended(proc, "rank 1 blocked in a write")
    line = _one_error(err, 1, proc, "rank 1 stalled", "its threads: ",
                      "in _block (tests/adversarial/sabotage_run.py:")
    error = _error_record(results)
    assert error["kind"] == "stall" and error["message"] in line
    assert 'sabotage_run.py", line' in error["threads"], error["threads"]
    assert " in _block\n" in error["threads"] and " in write\n" in error["threads"]
    assert not target.exists() and processes_mentioning(str(target)) == []


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint saved and kept, for `ckptbench restore`."""
    base = tmp_path_factory.mktemp("kept")
    r = subprocess.run([sys.executable, "-m", "ckptbench", "run", str(TINY), "--target",
                        str(base / "data"), "--keep", "--no-restore", "--results",
                        str(base / "r.jsonl")], cwd=base, env=env(), capture_output=True,
                       text=True, timeout=BOUND_S)
    assert r.returncode == 0, r.stderr
    (ckpt,) = (base / "data").glob("run-*/checkpoint-1")
    return ckpt


@pytest.mark.parametrize("action", ["stop-read:__1_", "hang-read:__1_"])
def test_a_rank_that_moves_nothing_fails_the_restore_command(kept: Path, tmp_path: Path,
                                                             action: str) -> None:
    """`restore` has a stall watch too (--stall-timeout), stopped ranks included."""
    results = tmp_path / "r.jsonl"
    proc = _start(action, "restore", str(kept), *STALL, "--results", str(results),
                  cwd=tmp_path)
    err = _ended(proc, "a rank stopped moving bytes")
    _one_error(err, 1, proc, "stalled", "--stall-timeout 8s")
    assert _error_record(results)["kind"] == "stall"
    assert processes_mentioning(str(kept)) == []
    assert (kept / ".metadata").exists()  # the kept checkpoint stays


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
@pytest.mark.parametrize("group", [True, False])
def test_a_signal_mid_restore_ends_it_with_a_line_and_a_record(
        kept: Path, tmp_path: Path, sig: signal.Signals, group: bool) -> None:
    """A restore held in a read (so the signal surely comes mid-restore), then the signal
    to the whole process group (timeout, systemd, Slurm) or to the command alone: exit
    128 + signal in bounded time, one line naming it, an `interrupted` error record, no
    rank left; `report` does not show it as a success."""
    results = tmp_path / "r.jsonl"
    proc = _start("hang-read:__1_", "restore", str(kept), "--results", str(results),
                  cwd=tmp_path)
    flag = Path(str(results) + ".blocked")
    wait_for("a rank in the middle of its restore", flag.exists, timeout=BOUND_S, proc=proc)
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    err = _ended(proc, f"{sig.name}")
    _one_error(err, 128 + sig, proc, f"stopped by {sig.name}", str(kept))
    error = _error_record(results)
    assert error["kind"] == "interrupted" and sig.name in error["message"]
    assert gone_within(processes_mentioning(str(kept)), 10) == []
    assert (kept / ".metadata").exists()
    shown = subprocess.run([sys.executable, "-m", "ckptbench", "report", str(results)],
                           cwd=ROOT, env=env(), capture_output=True, text=True,
                           timeout=BOUND_S)
    assert "interrupted" in shown.stdout + shown.stderr or "stopped" in shown.stdout + shown.stderr


def test_unverified_restores_are_flagged_everywhere(tmp_path: Path) -> None:
    """--no-verify results: the terminal table and the HTML report say UNVERIFIED, and
    cadence refuses a restore time from them (one line naming the file)."""
    results = tmp_path / "r.jsonl"
    cli = [sys.executable, "-m", "ckptbench"]
    r = subprocess.run([*cli, "run", str(TINY), "--target", str(tmp_path / "t"), "--no-verify",
                        "--results", str(results)], cwd=tmp_path, env=env(),
                       capture_output=True, text=True, timeout=BOUND_S)
    assert r.returncode == 0, r.stderr
    assert "restore UNVERIFIED" in r.stdout and "--no-verify" in r.stdout, r.stdout
    page = tmp_path / "page.html"
    r = subprocess.run([*cli, "report", str(results), "--html", str(page)], cwd=tmp_path,
                       env=env(), capture_output=True, text=True, timeout=BOUND_S)
    assert r.returncode == 0, r.stderr
    assert "UNVERIFIED" in r.stdout and "UNVERIFIED" in page.read_text()
    r = subprocess.run([*cli, "cadence", "--results", str(results), "--checkpoint-size", "2TB",
                        "--gpus", "2048", "--mtbf", "4h"], cwd=tmp_path, env=env(),
                       capture_output=True, text=True, timeout=BOUND_S)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"--results {results}: its restores were not verified (--no-verify" in r.stderr
