"""Never delete outside what the run created, and debris only when provably dead (issue 29,
families 1 and 3).

A neighbour with write access to the target acts at a known point of a real run
(hooked_run.py): a checkpoint directory planted as a link to someone else's files before
the run makes it, or swapped for a link or a planted directory after the commit, or a
killed run's checkpoint swapped before --clean-debris. The victim's files stay. A run on
another host whose lease is fresh is not debris; a killed --keep run's committed
checkpoint is not debris; files that vanish before the commit are never committed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .lifecycle import TINY, env, messages, records, run, tree, wait_for
from .runs import one_line

HOOK = Path(__file__).resolve().parent / "hooked_run.py"
INTENT = ".ckptbench-run"
LEASE = ".ckptbench-lease"
VICTIM_FILES = ("__0_0.distcp", "__1_0.distcp", ".metadata")


def _victim(tmp_path: Path) -> Path:
    """Someone else's directory holding files with the names a checkpoint has."""
    v = tmp_path / "v"
    v.mkdir()
    for name in VICTIM_FILES:
        (v / name).write_text(f"the user's {name}")
    return v


def _intact(v: Path) -> None:
    assert sorted(p.name for p in v.iterdir()) == sorted(VICTIM_FILES)
    for name in VICTIM_FILES:
        assert (v / name).read_text() == f"the user's {name}"


def _hooked(action: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HOOK), action, "--", str(TINY), *args,
                           "--results", str(tmp_path / "r.jsonl")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env())


def _run_dir(target: Path) -> Path:
    (found,) = [p for p in target.iterdir() if p.name.startswith("run-")]
    return found


# --- family 1: deletion outside the target ---
def test_a_link_planted_before_the_run_makes_its_checkpoint_fails_it_and_deletes_nothing(
        tmp_path: Path) -> None:
    """The issue's reproduction: `ln -s $PWD/v t/run-*/checkpoint-2` before the run makes
    it. The run stops in one line (it never writes through the link) and its cleanup
    deletes nothing in v."""
    v = _victim(tmp_path)
    r = _hooked(f"plant:{v}", tmp_path, "--target", str(tmp_path / "t"), "--iterations", "3")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    note, error = messages(r.stderr)  # the link, left in place (not ours), and why it stopped
    assert "left in place" in note and "checkpoint-2" in note, note
    assert error.startswith("ckptbench: error: ") and "checkpoint-2: already exists" in error
    _intact(v)
    assert (_run_dir(tmp_path / "t") / "checkpoint-2").is_symlink()


SCHEMES = ["", "local://"]  # the local backend; fsspec's local file system


@pytest.mark.parametrize("scheme", SCHEMES, ids=["local", "fsspec-local"])
@pytest.mark.parametrize("action", ["swap", "plain"])
def test_a_checkpoint_swapped_after_its_commit_loses_nothing_of_the_other(
        tmp_path: Path, action: str, scheme: str) -> None:
    """After the commit, the run's checkpoint directory is moved aside and a link to v (or
    a planted directory with files of the same names) put in its place: the cleanup
    deletes only in the directory the run created (through either backend)."""
    v = _victim(tmp_path)
    target = tmp_path / "t"
    r = _hooked(f"{action}:{v}", tmp_path, "--target", f"{scheme}{target}", "--iterations", "1")
    assert "Traceback" not in r.stderr, r.stderr
    _intact(v)
    ckpt = _run_dir(target) / "checkpoint-1"
    if action == "plain":
        planted = sorted(p.name for p in ckpt.iterdir())
        assert planted and all((ckpt / n).read_bytes() == b"planted: not the run's"
                               for n in planted)
    else:
        assert ckpt.is_symlink()


@pytest.mark.parametrize("scheme", SCHEMES, ids=["local", "fsspec-local"])
@pytest.mark.parametrize("action", ["swap", "plain"])
def test_clean_debris_deletes_nothing_in_a_swapped_checkpoint(tmp_path: Path, action: str,
                                                              scheme: str) -> None:
    """A killed run's checkpoint-1 replaced by a link to v (or a planted directory):
    --clean-debris removes the run's own files and leaves those."""
    v = _victim(tmp_path)
    target = tmp_path / "t"
    r = _hooked("kill:1", tmp_path, "--target", f"{scheme}{target}", "--iterations", "2")
    assert r.returncode == -9, r.stderr
    debris = _run_dir(target)
    ckpt = debris / "checkpoint-1"
    ckpt.rename(debris / "aside")
    if action == "swap":
        ckpt.symlink_to(v, target_is_directory=True)
    else:
        ckpt.mkdir()
        for name in VICTIM_FILES:
            (ckpt / name).write_text(f"the user's {name}")
    c = run("run", str(TINY), "--target", f"{scheme}{target}", "--clean-debris",
            "--results", str(tmp_path / "c.jsonl"), cwd=tmp_path)
    assert c.returncode == 0, c.stderr
    _intact(v if action == "swap" else ckpt)
    assert not (debris / INTENT).exists()  # the run's own files went


# --- family 3: debris only when provably dead ---
def test_a_live_run_on_another_host_is_not_debris(tmp_path: Path) -> None:
    """A run in progress whose intent names another host (on a shared file system, every
    run on another node) renews its lease: --clean-debris leaves it alone, and it ends
    well."""
    target = tmp_path / "t"
    proc = subprocess.Popen(
        [sys.executable, str(HOOK), f"pause:{tmp_path}", "--", str(TINY), "--target",
         str(target), "--iterations", "2", "--results", str(tmp_path / "r.jsonl")],
        cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("the run paused after its first commit",
                 (tmp_path / "paused").exists, proc=proc)
        intent_path = _run_dir(target) / INTENT
        intent = json.loads(intent_path.read_text())
        intent["host"] = "another-node.example"  # as a node of the cluster would see it
        intent_path.write_text(json.dumps(intent))
        before = tree(target)
        c = run("run", str(TINY), "--target", str(target), "--clean-debris",
                "--results", str(tmp_path / "c.jsonl"), cwd=tmp_path)
        assert c.returncode == 0, c.stderr
        assert messages(c.stderr) == [], c.stderr
        assert tree(target) == before
    finally:
        (tmp_path / "go").touch()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert all(r["ok"] for r in records(tmp_path / "r.jsonl") if r["type"] == "phase")


def test_a_killed_run_on_another_host_is_debris_once_its_lease_expired(tmp_path: Path) -> None:
    """The other side of the lease: a run elsewhere that stopped renewing it is removed (its
    directories checked by inode: a network file system's device numbers differ per host)."""
    assert socket.gethostname() != "another-node.example"
    target = tmp_path / "t"
    r = _hooked("kill:1", tmp_path, "--target", str(target), "--iterations", "2")
    assert r.returncode == -9, r.stderr
    debris = _run_dir(target)
    intent = json.loads((debris / INTENT).read_text())
    intent["host"] = "another-node.example"
    (debris / INTENT).write_text(json.dumps(intent))
    c = run("run", str(TINY), "--target", str(target), "--clean-debris",
            "--results", str(tmp_path / "c.jsonl"), cwd=tmp_path)
    assert c.returncode == 0 and messages(c.stderr) == [], c.stderr  # fresh: not debris
    assert (debris / INTENT).exists()
    lease = json.loads((debris / LEASE).read_text())
    lease["renewed"] = time.time() - lease["timeout_s"] - 60
    (debris / LEASE).write_text(json.dumps(lease))
    intent["started"] = "2026-01-01T00:00:00Z"
    (debris / INTENT).write_text(json.dumps(intent))
    c = run("run", str(TINY), "--target", str(target), "--clean-debris",
            "--results", str(tmp_path / "d.jsonl"), cwd=tmp_path)
    assert c.returncode == 0, c.stderr
    (line,) = messages(c.stderr)
    assert debris.name in line and "removed" in line, line
    assert not debris.exists()


def test_a_killed_keep_runs_committed_checkpoint_is_not_debris(tmp_path: Path) -> None:
    """A --keep run killed after committing (and verifying) checkpoint 1 and committing
    checkpoint 2: --clean-debris keeps its committed checkpoints, and its intent becomes
    the record of them (state "kept", no longer debris)."""
    target = tmp_path / "t"
    r = _hooked("kill:2", tmp_path, "--target", str(target), "--iterations", "3", "--keep")
    assert r.returncode == -9, r.stderr
    debris = _run_dir(target)
    kept = sorted(p.name for p in (debris / "checkpoint-1").iterdir())
    assert ".metadata" in kept
    c = run("run", str(TINY), "--target", str(target), "--clean-debris",
            "--results", str(tmp_path / "c.jsonl"), cwd=tmp_path)
    assert c.returncode == 0, c.stderr
    assert sorted(p.name for p in (debris / "checkpoint-1").iterdir()) == kept
    assert (debris / "checkpoint-2" / ".metadata").exists()
    record = json.loads((debris / INTENT).read_text())
    assert record["state"] == "kept"
    assert record["checkpoints"] == ["checkpoint-1", "checkpoint-2"]
    r = run("restore", str(debris / "checkpoint-1"), "--results", str(tmp_path / "x.jsonl"),
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_files_that_vanish_before_the_commit_are_never_committed(tmp_path: Path) -> None:
    """A data file removed between the save and the commit (another process's cleanup):
    the manifest is not written, the run fails in one line naming the file."""
    target = tmp_path / "t"
    r = _hooked("vanish:__0_0.distcp", tmp_path, "--target", str(target), "--iterations", "1",
                "--no-restore")
    one_line(r, 2, "__0_0.distcp", "no longer there")
    assert not target.exists() or not list(target.glob("run-*/checkpoint-1/.metadata"))


# --- family 10: a nested target ---
def test_a_nested_target_removes_the_parents_it_created(tmp_path: Path) -> None:
    """`--target n/a/b` makes n and n/a; the run leaves none of them behind, and keeps a
    parent that holds someone else's file."""
    r = run("run", str(TINY), "--target", "n/a/b", "--results", str(tmp_path / "r.jsonl"),
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "n").exists()
    proc = subprocess.Popen(
        [sys.executable, str(HOOK), f"pause:{tmp_path}", "--", str(TINY), "--target",
         "n/a/b", "--results", str(tmp_path / "s.jsonl")],
        cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("the run paused after its first commit", (tmp_path / "paused").exists,
                 proc=proc)
        (tmp_path / "n" / "NOTES.txt").write_text("a user's file")
    finally:
        (tmp_path / "go").touch()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert tree(tmp_path / "n") == ["NOTES.txt"]
