"""The memory tier's directory is as safe as the target's (issue 43, items 1 and 3).

Real runs (4 processes, 2 nodes, memory, peer and storage tiers) with a hostile neighbour
in --memory-dir acting at a known point of the run (memory_hook_run.py, no sleeps): a
directory or link planted at the name the run's directory had before (predictable: the run
id), or at the very name the run picks as it makes it; a node's directory swapped for a
link to someone else's directory, or for that directory itself, mid-run (the run then ends
normally, or by SIGTERM); a file another user owns in a node's directory. The victim's
files stay as they were, the run never writes nor deletes through a link or in a directory
it did not make, and it fails in one line naming the path where it refuses.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .lifecycle import TINY, env, records
from .runs import one_line

HOOK = Path(__file__).resolve().parent / "memory_hook_run.py"
SHM = Path("/dev/shm")
TIERED = ("--tiers", "memory,peer,storage", "--ranks-per-node", "2", "--iterations", "3")
COPY = re.compile(r"(?:replica-)?p\d+-ckpt\d+\.bin(?:\.part)?")
NOBODY = 65534
# files with the names the run's copies have, in a directory the run has no business in
VICTIM_FILES = (*(f"{kind}p{p}-ckpt{i}.bin" for kind in ("", "replica-")
                   for p in range(4) for i in range(1, 4)), "notes.txt")


@pytest.fixture
def shm() -> Iterator[Path]:
    """A directory of the test's own on the memory tier's file system: `mem` in it is the
    --memory-dir, `victim` someone else's files (the same file system, so the neighbour
    can move it into the run's directory)."""
    base = Path(tempfile.mkdtemp(prefix="ckb-memdir-test-", dir=SHM if SHM.is_dir() else None))
    (base / "mem").mkdir()
    victim = base / "victim"
    victim.mkdir()
    for name in VICTIM_FILES:
        (victim / name).write_text(f"the user's {name}")
    yield base
    shutil.rmtree(base, ignore_errors=True)


def snapshot(root: Path) -> dict[str, str]:
    """Everything under `root`, never following a link: files with their text, links with
    their target, directories."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"-> {os.readlink(p)}"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = p.read_text(errors="replace")
    return out


VICTIM_SNAPSHOT = {name: f"the user's {name}" for name in VICTIM_FILES}


def hooked(action: str, tmp_path: Path, shm: Path, *extra: str
           ) -> subprocess.CompletedProcess[str]:
    """The tiered tiny run with `action` (memory_hook_run.py), in a session of its own (a
    SIGTERM to its group reaches nothing else)."""
    return subprocess.run(
        [sys.executable, str(HOOK), action, "--", str(TINY), "--target", str(tmp_path / "t"),
         "--results", str(tmp_path / "r.jsonl"), "--memory-dir", str(shm / "mem"), *TIERED,
         *extra], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env=env({**os.environ, "CKPTBENCH_PROGRESS": "off"}), start_new_session=True)


def ckptbench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path,
                          env=env({**os.environ, "CKPTBENCH_PROGRESS": "off"}))


def run_dirs(mem: Path, run_id: str) -> list[Path]:
    """The run directories the run made: its id and a random part."""
    return [p for p in mem.iterdir()
            if re.fullmatch(rf"ckptbench-{re.escape(run_id)}-[0-9a-f]{{16}}", p.name)]


def copies_left(mem: Path, skip: Path | None = None) -> list[str]:
    """The files named as copies under `mem` (not under `skip`), links never followed."""
    return sorted(str(p.relative_to(mem)) for p in mem.rglob("*")
                  if COPY.fullmatch(p.name) and not (skip and p.is_relative_to(skip)))


def owned_only_by_the_run(path: Path) -> None:
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid(), path
    assert stat.S_IMODE(st.st_mode) == 0o700, (path, oct(st.st_mode))


@pytest.mark.parametrize("planted", ["predicted", "predicted-link"])
def test_the_run_directory_cannot_be_predicted_and_a_planted_one_is_not_used(
        tmp_path: Path, shm: Path, planted: str) -> None:
    """The issue's reproduction: a directory another user made at ckptbench-<run id>
    (mode 0777, its node0 a link to the victim), or a link there. The run's directory has a
    random part in its name: the planted one is never used, never touched. The run keeps
    its copies (--keep-tiers): a relaunch finds them by what the results record, restores
    and removes them."""
    mem, victim = shm / "mem", shm / "victim"
    r = hooked(f"{planted}:{victim}", tmp_path, shm, "--keep-tiers", "--no-restore")
    assert r.returncode == 0, r.stderr[-3000:]
    assert snapshot(victim) == VICTIM_SNAPSHOT
    run_id = records(tmp_path / "r.jsonl")[0]["run_id"]
    plant = mem / f"ckptbench-{run_id}"
    assert plant.is_symlink() if planted == "predicted-link" else (
        sorted(p.name for p in plant.iterdir()) == ["node0", "node1"]
        and (plant / "node0").is_symlink())
    (made,) = run_dirs(mem, run_id)
    owned_only_by_the_run(made)
    for node in ("node0", "node1"):
        owned_only_by_the_run(made / node)
    assert copies_left(made)  # kept: the relaunch reads them
    done = ckptbench(tmp_path, "relaunch", str(tmp_path / "r.jsonl"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert not made.exists()  # restored, verified and removed
    assert snapshot(victim) == VICTIM_SNAPSHOT
    assert plant.is_symlink() or (plant / "node0").is_symlink()
    assert sorted(p.name for p in mem.iterdir()) == [plant.name]


@pytest.mark.parametrize("planted", ["first", "first-link"])
def test_a_directory_or_link_planted_at_the_name_the_run_makes_is_refused(
        tmp_path: Path, shm: Path, planted: str) -> None:
    """Whatever name the run picks, something already there (a directory another user made
    first, a link) is never used nor followed: the run stops in one line naming it, exit 2,
    before any copy is written; what was planted stays."""
    mem, victim = shm / "mem", shm / "victim"
    r = hooked(f"{planted}:{victim}", tmp_path, shm)
    line = one_line(r, 2, f"{mem}/ckptbench-", "already exists")
    assert snapshot(victim) == VICTIM_SNAPSHOT
    (plant,) = mem.iterdir()  # nothing else was made
    assert plant.name in line
    assert plant.is_symlink() if planted == "first-link" else (plant / "node0").is_symlink()


@pytest.mark.parametrize("action", ["swap-link", "swap-dir", "swap-link-term",
                                    "swap-dir-term"])
def test_a_node_directory_swapped_mid_run_is_neither_written_nor_deleted_through(
        tmp_path: Path, shm: Path, action: str) -> None:
    """Once process 0's copy of checkpoint 1 is held, its node's directory is moved aside
    and a link to the victim's directory (or that directory itself) put in its place. The
    run writes nothing there and deletes nothing there, whether it goes on (it fails in one
    line naming the directory) or is stopped by SIGTERM (the launcher removes what its
    processes left); its own copies, in the directory it made wherever it was moved to, are
    removed."""
    mem, victim = shm / "mem", shm / "victim"
    r = hooked(f"{action}:{victim}", tmp_path, shm)
    (made,) = mem.iterdir()
    if action.endswith("-term"):
        assert r.returncode != 0, r.stderr[-3000:]
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
    else:
        one_line(r, 2, f"{made / 'node0'}", "not the directory this run made")
    where = victim if action.startswith("swap-link") else made / "node0"
    assert snapshot(where) == VICTIM_SNAPSHOT
    if action.startswith("swap-link"):
        assert (made / "node0").is_symlink()
    assert copies_left(mem, skip=made / "node0") == []
    assert sorted(p.name for p in made.iterdir()) == ["node0"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a file owned by another user needs root "
                    "(chown to 65534)")
def test_a_file_another_user_owns_is_never_deleted(tmp_path: Path, shm: Path) -> None:
    """A file with a copy's name, owned by another user, in a node's directory mid-run: the
    run ends as usual and removes its own copies only. A kept copy given to another user
    stays through `relaunch --discard`, the run's other copies go."""
    mem = shm / "mem"
    r = hooked("foreign:-", tmp_path, shm)
    assert r.returncode == 0, r.stderr[-3000:]
    (made,) = mem.iterdir()
    foreign = made / "node0" / "p0-ckpt99.bin"
    assert copies_left(mem) == [str(foreign.relative_to(mem))]
    assert foreign.read_text() == "another user's" and foreign.stat().st_uid == NOBODY
    shutil.rmtree(made)

    kept = ckptbench(tmp_path, "run", str(TINY), "--target", str(tmp_path / "k"),
                     "--results", str(tmp_path / "k.jsonl"), "--memory-dir", str(mem),
                     *TIERED, "--keep-tiers", "--no-restore")
    assert kept.returncode == 0, kept.stderr[-3000:]
    (made,) = run_dirs(mem, records(tmp_path / "k.jsonl")[0]["run_id"])
    given = made / "node1" / "p2-ckpt3.bin"
    os.chown(given, NOBODY, NOBODY)
    done = ckptbench(tmp_path, "relaunch", str(tmp_path / "k.jsonl"), "--discard")
    assert done.returncode == 0, done.stderr[-3000:]
    assert copies_left(mem) == [str(given.relative_to(mem))]


def test_a_kept_node_directory_replaced_before_the_relaunch_is_refused(
        tmp_path: Path, shm: Path) -> None:
    """After a --keep-tiers run, node1's directory is replaced by the victim's (files with
    the copies' names): the relaunch reads nothing from it and --discard deletes nothing
    in it; each says so in one line naming it."""
    mem, victim = shm / "mem", shm / "victim"
    kept = ckptbench(tmp_path, "run", str(TINY), "--target", str(tmp_path / "k"),
                     "--results", str(tmp_path / "k.jsonl"), "--memory-dir", str(mem),
                     *TIERED, "--keep-tiers", "--no-restore")
    assert kept.returncode == 0, kept.stderr[-3000:]
    (made,) = run_dirs(mem, records(tmp_path / "k.jsonl")[0]["run_id"])
    (made / "node1").rename(made / "node1.moved")
    os.rename(victim, made / "node1")
    for args in (("--out", str(tmp_path / "o.jsonl")), ("--discard",)):
        done = ckptbench(tmp_path, "relaunch", str(tmp_path / "k.jsonl"), *args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
        assert f"{made / 'node1'}" in lines[0] and "not the directory this run made" in lines[0]
        assert snapshot(made / "node1") == VICTIM_SNAPSHOT
    # what is the run's, wherever it was moved to, is removed all the same
    assert copies_left(mem, skip=made / "node1") == []


def test_a_kept_run_killed_before_its_first_held_checkpoint_is_discarded(
        tmp_path: Path, shm: Path) -> None:
    """A --keep-tiers run SIGKILLed (the whole run) while its first checkpoint is copied:
    no checkpoint is held, yet the results say where its directory is and what it is, so
    `relaunch --discard` removes its copies there, and its directories."""
    mem = shm / "mem"
    r = hooked("kill:-", tmp_path, shm, "--keep-tiers")
    assert r.returncode == -9, r.stderr[-3000:]
    recs = records(tmp_path / "r.jsonl")
    assert not [x for x in recs if x["type"] == "tier_held"]
    (made,) = run_dirs(mem, recs[0]["run_id"])
    assert copies_left(made)
    done = ckptbench(tmp_path, "relaunch", str(tmp_path / "r.jsonl"), "--discard")
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(mem.iterdir()) == []
