"""`ckptbench clean TARGET`: what ckptbench left (kept checkpoints, debris of killed runs,
empty run directories) is listed, and removed with --yes by the names each run recorded;
anything else (a neighbour's file, directory or link, a run in progress) is never touched.

One real --keep run makes a kept run directory; the other cases are copies of it whose
intent is rewritten as a killed run, a live run of this host and a run of another host
would have left it (the identities of the copied directories recorded, as a run records
the directories it creates)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from .lifecycle import TINY, env, run, tree
from .runs import one_line

INTENT = ".ckptbench-run"
LEASE = ".ckptbench-lease"


@pytest.fixture(scope="module")
def kept_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A target holding one real --keep run (2 checkpoints), made once for the module."""
    base = tmp_path_factory.mktemp("kept")
    r = run("run", str(TINY), "--target", "t", "--iterations", "2", "--keep",
            "--results", str(base / "r.jsonl"), cwd=base)
    assert r.returncode == 0, r.stderr
    return base / "t"


def _target(kept_target: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A fresh copy of the kept target, and its kept run directory."""
    target = tmp_path / "t"
    shutil.copytree(kept_target, target, symlinks=True)
    (kept,) = [p for p in target.iterdir() if p.name.startswith("run-")]
    _rewrite(kept)
    return target, kept


def _rewrite(run_dir: Path, **fields: object) -> dict[str, object]:
    """The run directory's intent with `fields` changed, its run id and the identities of
    its directories made the copy's own."""
    intent = json.loads((run_dir / INTENT).read_text())
    ids = {k: [os.stat(run_dir / k).st_dev, os.stat(run_dir / k).st_ino] for k in intent["ids"]}
    intent.update(run_id=run_dir.name, ids=ids, **fields)
    (run_dir / INTENT).write_text(json.dumps(intent))
    return intent


def _copy_run(kept: Path, name: str, **fields: object) -> Path:
    target = kept.parent
    shutil.copytree(kept, target / name, symlinks=True)
    _rewrite(target / name, **fields)
    return target / name


def _dead_pid() -> int:
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True, check=True)
    return int(p.stdout)


def _clean(target: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run("clean", str(target), *args, cwd=target.parent)


def _plant(target: Path, kept: Path) -> dict[Path, str]:
    """A neighbour's things: a file, a directory, a link at the top of the target and in
    the kept run (a link to a file outside, which must survive too)."""
    outside = target.parent / "outside.txt"
    outside.write_text("the user's own")
    (target / "notes.txt").write_text("notes")
    (target / "data").mkdir()
    (target / "data" / "x.bin").write_text("x")
    (target.parent / "elsewhere").mkdir()
    (target.parent / "elsewhere" / "keep.txt").write_text("theirs")
    (target / "run-20260101-000000-9").symlink_to(target.parent / "elsewhere")
    (kept / "mine.txt").write_text("mine")
    (kept / "checkpoint-1" / "extra.bin").write_text("extra")
    (kept / "link").symlink_to(outside)
    return {p: p.read_text() for p in (outside, target / "notes.txt", target / "data" / "x.bin",
                                         target.parent / "elsewhere" / "keep.txt",
                                         kept / "mine.txt",
                                         kept / "checkpoint-1" / "extra.bin")}


def test_clean_lists_then_removes_kept_debris_and_empty_by_name(kept_target: Path,
                                                               tmp_path: Path) -> None:
    """Dry run by default (nothing changes); --yes removes the kept run, a killed run's
    debris and an empty run directory; a neighbour's file, directory and links (at the top
    and inside the runs) stay, as does a live run of this host."""
    target, kept = _target(kept_target, tmp_path)
    _copy_run(kept, "run-20260101-000000-2", state="running", pid=_dead_pid(),
              keep=False)  # killed without --keep: all of it is debris
    _copy_run(kept, "run-20260101-000000-3", state="running", pid=os.getpid(),
              pid_start=None)  # this very process: alive
    (target / "run-20260101-000000-4").mkdir()  # what an interrupted restore could leave
    planted = _plant(target, kept)
    before = tree(target)

    dry = _clean(target)
    assert dry.returncode == 0, dry.stderr
    assert tree(target) == before
    lines = dry.stdout.splitlines()
    assert any(kept.name in line and line.startswith("remove") and "kept checkpoints" in line
               for line in lines), dry.stdout
    assert any("-2:" in line and line.startswith("remove") and "debris" in line
               for line in lines), dry.stdout
    assert any("-3:" in line and line.startswith("keep") and "in progress" in line
               for line in lines), dry.stdout
    assert any("-4:" in line and "empty run directory" in line for line in lines), dry.stdout
    assert any(line.startswith("keep") and "data:" in line for line in lines), dry.stdout
    assert "--yes" in lines[-1]

    done = _clean(target, "--yes")
    assert done.returncode == 0, done.stderr
    for path, text in planted.items():
        assert path.read_text() == text
    assert (target / "run-20260101-000000-9").is_symlink()
    assert (kept / "link").is_symlink()
    assert [x for x in tree(target) if "-000000-3" in x] == [x for x in before if "-000000-3" in x]
    assert not (target / "run-20260101-000000-2").exists()
    assert not (target / "run-20260101-000000-4").exists()
    left = sorted(str(p.relative_to(kept)) for p in kept.rglob("*"))
    assert left == ["checkpoint-1", "checkpoint-1/extra.bin", "link", "mine.txt"]
    assert "left in place" in done.stdout and "mine.txt" in done.stdout


def test_a_run_of_another_host_is_cleaned_only_once_its_lease_expired(
        kept_target: Path, tmp_path: Path) -> None:
    """A run whose intent names another host: left alone while its lease is fresh, debris
    (and removed) once the lease is older than its timeout."""
    target, kept = _target(kept_target, tmp_path)
    elsewhere = {"state": "running", "host": "another-node.example", "pid": 1, "keep": False}
    fresh = _copy_run(kept, "run-20260101-000000-2", **elsewhere,
                      started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (fresh / LEASE).write_text(json.dumps({"renewed": time.time(), "timeout_s": 300,
                                           "host": "another-node.example"}))
    stale = _copy_run(kept, "run-20260101-000000-3", **elsewhere,
                      started="2026-01-01T00:00:00Z")
    (stale / LEASE).write_text(json.dumps({"renewed": time.time() - 3600, "timeout_s": 300,
                                           "host": "another-node.example"}))
    before = tree(fresh)
    done = _clean(target, "--yes")
    assert done.returncode == 0, done.stderr
    assert tree(fresh) == before
    assert not stale.exists()
    assert "started on another-node.example" in done.stdout


def test_restore_leaves_nothing_behind(kept_target: Path, tmp_path: Path) -> None:
    """`restore` of a kept checkpoint (whole, and onto a smaller restore world: fill-ins)
    adds nothing to the target: no run directory, empty or not."""
    target, kept = _target(kept_target, tmp_path)
    before = tree(target)
    for extra in ((), ("--restore-world-size", "2")):
        r = run("restore", str(kept / "checkpoint-2"), *extra,
                "--results", str(tmp_path / f"r{len(extra)}.jsonl"), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert tree(target) == before


def test_clean_removes_the_target_it_made_once_empty(tmp_path: Path) -> None:
    """A target ckptbench made, holding only a kept run: --yes leaves no trace of it."""
    r = run("run", str(TINY), "--target", "t", "--iterations", "1", "--keep", "--no-restore",
            "--results", str(tmp_path / "r.jsonl"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    done = _clean(tmp_path / "t", "--yes")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("case", ["missing", "unmarked", "file"])
def test_clean_refuses_what_is_not_a_ckptbench_target_in_one_line(tmp_path: Path,
                                                                  case: str) -> None:
    target = tmp_path / "t"
    if case == "unmarked":
        target.mkdir()
        (target / "run-20260101-000000-1").mkdir()
    elif case == "file":
        target.write_text("x")
    r = _clean(target, "--yes")
    one_line(r, 2, str(target), ".ckptbench-target")
    assert case != "unmarked" or (target / "run-20260101-000000-1").is_dir()


@pytest.mark.s3
def test_clean_on_s3_removes_the_kept_run_and_nothing_else(minio_server, tmp_path: Path) -> None:
    """On a bucket prefix: the kept run's objects go, a neighbour's object under the run's
    prefix and beside it stays."""
    prefix = f"clean/{uuid.uuid4().hex[:8]}"
    url = f"s3://{minio_server.bucket}/{prefix}"
    environ = minio_server.env({**os.environ, "PYTHONPATH": str(Path(TINY).parents[1])})
    s3 = ("--endpoint-url", minio_server.endpoint)
    r = run("run", str(TINY), "--target", url, *s3, "--iterations", "1", "--keep",
            "--no-restore", "--results", str(tmp_path / "r.jsonl"), cwd=tmp_path, environ=environ)
    assert r.returncode == 0, r.stderr
    client = minio_server.client()
    (run_id,) = {k.split("/")[2] for k in minio_server.list_keys(minio_server.bucket, prefix + "/")
                 if k.split("/")[2].startswith("run-")}
    for key in (f"{prefix}/notes.txt", f"{prefix}/{run_id}/mine.txt"):
        client.put_object(Bucket=minio_server.bucket, Key=key, Body=b"the user's")
    dry = run("clean", url, *s3, cwd=tmp_path, environ=environ)
    assert dry.returncode == 0 and run_id in dry.stdout and "kept" in dry.stdout, dry.stderr
    done = run("clean", url, *s3, "--yes", cwd=tmp_path, environ=environ)
    assert done.returncode == 0, done.stderr
    keys = minio_server.list_keys(minio_server.bucket, prefix + "/")
    assert sorted(keys) == sorted([f"{prefix}/.ckptbench-target", f"{prefix}/notes.txt",
                                   f"{prefix}/{run_id}/mine.txt"])


# --- issue 43 item 7: a killed --keep run's committed checkpoint; another user's files ---
HOOK = Path(__file__).resolve().parent / "hooked_run.py"
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def _killed_keep_run(tmp_path: Path) -> Path:
    """A --keep run of 3 iterations SIGKILLed after the commit of checkpoint 1 (hooked_run
    kill:1), as it was about to restore it; its run directory. Checkpoint 2 is then made
    as a save cut off by the kill leaves it: its directory created and recorded in the
    intent, one file written, no manifest. Checkpoint 3 never existed."""
    tmp_path.mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, str(HOOK), "kill:1", "--", str(TINY), "--target",
                        str(tmp_path / "t"), "--iterations", "3", "--keep",
                        "--results", str(tmp_path / "r.jsonl")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env())
    assert r.returncode == -9, r.stderr[-3000:]
    (run_dir,) = [p for p in (tmp_path / "t").iterdir() if p.name.startswith("run-")]
    intent = json.loads((run_dir / INTENT).read_text())
    assert intent["state"] == "running" and intent["keep"] is True
    assert intent["checkpoints"] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert (run_dir / "checkpoint-1" / intent["manifest"]).is_file()
    (run_dir / "checkpoint-2").mkdir()
    (run_dir / "checkpoint-2" / intent["files"][0]).write_bytes(b"cut off")
    st = os.stat(run_dir / "checkpoint-2")
    intent["ids"]["checkpoint-2"] = [st.st_dev, st.st_ino]
    (run_dir / INTENT).write_text(json.dumps(intent))
    return run_dir


def test_a_killed_keep_runs_committed_checkpoint_is_kept_not_debris(tmp_path: Path) -> None:
    """The committed checkpoint 1 is listed as kept, never as debris; the debris listed is
    only what the run made (checkpoint 2, not checkpoint 3); --yes removes that, keeps
    checkpoint 1 (which restores) and records it as kept."""
    run_dir = _killed_keep_run(tmp_path)
    target = run_dir.parent
    ckpt1 = tree(run_dir / "checkpoint-1")

    dry = _clean(target)
    assert dry.returncode == 0, dry.stderr
    assert "checkpoint-3" not in dry.stdout, dry.stdout
    (line,) = [x for x in dry.stdout.splitlines() if run_dir.name in x]
    debris, _, rest = line.partition(";")
    assert "debris" in debris and "checkpoint-2" in debris, line
    assert "checkpoint-1" not in debris and "checkpoint-1" in rest and "kept" in rest, line
    as_json = json.loads(_clean(target, "--json").stdout)
    (entry,) = [f for f in as_json["found"] if f["name"] == run_dir.name]
    assert entry["kind"] == "debris" and entry["checkpoints"] == ["checkpoint-2"], entry
    assert entry["committed"] == ["checkpoint-1"], entry

    done = _clean(target, "--yes")
    assert done.returncode == 0, done.stderr
    assert "checkpoint-3" not in done.stdout, done.stdout
    assert tree(run_dir / "checkpoint-1") == ckpt1
    assert not (run_dir / "checkpoint-2").exists() and not (run_dir / LEASE).exists()
    record = json.loads((run_dir / INTENT).read_text())
    assert record["state"] == "kept" and record["checkpoints"] == ["checkpoint-1"]
    r = run("restore", str(run_dir / "checkpoint-1"), "--results", str(tmp_path / "x.jsonl"),
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    again = _clean(target)
    assert any(line.startswith("remove") and run_dir.name in line and "kept checkpoints" in line
               and "(checkpoint-1)" in line for line in again.stdout.splitlines()), again.stdout


@needs_root
def test_clean_leaves_a_file_another_user_owns(kept_target: Path, tmp_path: Path) -> None:
    """A file with a name the run recorded, owned by another uid (nobody), in a kept run and
    in a killed run's debris: --yes deletes the run's own files around it, leaves that one
    and says why (its owner)."""
    target, kept = _target(kept_target, tmp_path)
    theirs = sorted((kept / "checkpoint-2").glob("*.distcp"))[0]
    os.chown(theirs, NOBODY, NOBODY)
    data = theirs.read_bytes()
    done = _clean(target, "--yes")
    assert done.returncode == 0, done.stderr
    assert theirs.read_bytes() == data and theirs.stat().st_uid == NOBODY
    assert not (kept / "checkpoint-1").exists()  # the run's own files went
    assert [p.name for p in (kept / "checkpoint-2").iterdir()] == [theirs.name]
    (line,) = [x for x in done.stdout.splitlines() if theirs.name in x]
    assert f"uid {NOBODY}" in line and "owned" in line, done.stdout

    run_dir = _killed_keep_run(tmp_path / "killed")
    cut = run_dir / "checkpoint-2" / json.loads((run_dir / INTENT).read_text())["files"][0]
    os.chown(cut, NOBODY, NOBODY)
    done = _clean(run_dir.parent, "--yes")
    assert done.returncode == 0, done.stderr
    assert cut.read_bytes() == b"cut off" and f"uid {NOBODY}" in done.stdout, done.stdout


@needs_root
def test_a_run_whose_intent_another_user_owns_is_left_alone(kept_target: Path,
                                                          tmp_path: Path) -> None:
    target, kept = _target(kept_target, tmp_path)
    os.chown(kept / INTENT, NOBODY, NOBODY)
    before = tree(target)
    done = _clean(target, "--yes")
    assert done.returncode == 0, done.stderr
    assert tree(target) == before
    (line,) = [x for x in done.stdout.splitlines() if kept.name in x]
    assert line.startswith("keep") and f"uid {NOBODY}" in line, line
