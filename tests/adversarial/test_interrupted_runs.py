"""Never leave a run behind (issue 16, item 4).

Ranks die with the `ckptbench` process that started them; SIGTERM (and SIGHUP) is handled
like SIGINT: the run stops, what it wrote is removed by name, one line says so, and the
exit status is 128 + the signal. A signal to the whole process group (`timeout`, systemd,
Slurm) leaves nothing behind. What a SIGKILL leaves (a run's debris, which carries its
intent record) is found by the next run on the target, reported in one line and removed,
by name, only with --clean-debris. On S3 the same, unfinished multipart uploads included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ckptbench.backends.base import TARGET_MARKER
from harness import MinioServer

from .lifecycle import (
    BIG,
    BIG_ARGS,
    TINY,
    children_of,
    env,
    gone_within,
    messages,
    processes_mentioning,
    records,
    run,
    saving,
    start,
    tree,
    wait_for,
)

INTENT = ".ckptbench-run"


def _start_big(tmp_path: Path, target: str, *extra: str, **kw: Any) -> subprocess.Popen[str]:
    return start("run", str(BIG), *BIG_ARGS, "--no-restore", "--target", target,
                 "--results", str(tmp_path / "r.jsonl"), *extra, cwd=tmp_path, **kw)


def _ranks(proc: subprocess.Popen[str]) -> list[int]:
    return wait_for("two rank processes", lambda: (c := children_of(proc.pid)) and
                    len(c) == 2 and c, proc=proc)


def test_sigkill_of_the_parent_mid_save_leaves_no_rank(tmp_path: Path) -> None:
    target = tmp_path / "tgt"
    proc = _start_big(tmp_path, str(target))
    wait_for("the save under way", saving(target), proc=proc)
    ranks = _ranks(proc)
    proc.kill()
    proc.communicate(timeout=30)
    assert gone_within(ranks, 5) == []
    assert processes_mentioning(str(target)) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_parent_stops_the_run_and_removes_it(tmp_path: Path,
                                                             sig: signal.Signals) -> None:
    target = tmp_path / "tgt"
    proc = _start_big(tmp_path, str(target))
    wait_for("the save under way", saving(target), proc=proc)
    ranks = _ranks(proc)
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 128 + sig, err
    lines = messages(err)
    assert len(lines) == 1 and sig.name in lines[0] and "Traceback" not in err, err
    assert gone_within(ranks, 5) == []
    assert not target.exists()  # ckptbench made it: removed with everything in it
    recs = records(tmp_path / "r.jsonl")
    (error,) = [r for r in recs if r["type"] == "error"]
    assert error["kind"] == "interrupted" and sig.name in error["message"]
    assert any(r["type"] == "cleanup" and r["left"] == [] for r in recs)


def test_nohup_still_ignores_sighup(tmp_path: Path) -> None:
    """Under nohup (SIGHUP ignored when ckptbench starts) a closed terminal does not stop
    the run: only signals that would have killed it are turned into a stop."""
    target = tmp_path / "tgt"
    proc = start("run", str(TINY), "--target", str(target), "--iterations", "8", "--results",
                 str(tmp_path / "r.jsonl"), cwd=tmp_path, prefix=("nohup",))
    wait_for("the first checkpoint", lambda: next(iter(target.glob("run-*/checkpoint-*")), None),
             proc=proc, every=0.005)
    assert proc.poll() is None  # the signal reaches a run under way
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert sum(r["type"] == "phase" for r in records(tmp_path / "r.jsonl")) == 16


def test_sigterm_to_the_process_group_leaves_nothing(tmp_path: Path) -> None:
    """What `timeout`, systemd and Slurm do: SIGTERM to every process of the group, the
    ranks included, in the middle of the save."""
    target = tmp_path / "tgt"
    target.mkdir()  # a target the user made: it stays, with ckptbench's mark only
    proc = _start_big(tmp_path, str(target), new_session=True)
    wait_for("the save under way", saving(target), proc=proc)
    ranks = _ranks(proc)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert gone_within(ranks, 5) == [] and processes_mentioning(str(target)) == []
    assert tree(target) == [TARGET_MARKER]
    assert len(messages(err)) == 1 and "Traceback" not in err, err


def test_timeout_command_leaves_nothing(tmp_path: Path) -> None:
    """`timeout` sends its SIGTERM to its whole process group (here: forwarded at once)."""
    target = tmp_path / "tgt"
    proc = _start_big(tmp_path, str(target), prefix=("timeout", "600"))
    wait_for("the save under way", saving(target), proc=proc)
    proc.send_signal(signal.SIGTERM)  # timeout passes it on to the group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert not target.exists()
    assert processes_mentioning(str(target)) == []


def _killed_run(tmp_path: Path, target: Path) -> Path:
    """A run SIGKILLed in the middle of its save: its run directory (debris)."""
    proc = _start_big(tmp_path, str(target))
    ckpt = wait_for("the save under way", saving(target), proc=proc)
    ranks = _ranks(proc)
    proc.kill()
    proc.communicate(timeout=30)
    assert gone_within(ranks, 5) == []
    return ckpt.parent


def test_debris_of_a_killed_run_is_reported_and_removed_only_with_the_flag(tmp_path: Path) -> None:
    target = tmp_path / "tgt"
    debris = _killed_run(tmp_path, target)
    intent = json.loads((debris / INTENT).read_text())
    assert intent["run_id"] == debris.name and intent["state"] == "running"
    (debris / "NOTES.txt").write_text("a user's file in the debris")
    left = tree(target)
    assert f"{debris.name}/checkpoint-1/" in left

    r = run("run", str(TINY), "--target", str(target), "--results", str(tmp_path / "a.jsonl"),
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = messages(r.stderr)
    assert len(lines) == 1 and debris.name in lines[0] and "--clean-debris" in lines[0], r.stderr
    assert tree(target) == left  # reported, not touched
    assert records(tmp_path / "a.jsonl")[0]["debris"]["runs"] == [debris.name]

    r = run("run", str(TINY), "--target", str(target), "--clean-debris",
            "--results", str(tmp_path / "b.jsonl"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = messages(r.stderr)
    assert len(lines) == 1 and debris.name in lines[0] and "NOTES.txt" in lines[0], r.stderr
    assert set(tree(target)) == {TARGET_MARKER, f"{debris.name}/", f"{debris.name}/NOTES.txt"}
    assert (debris / "NOTES.txt").read_text() == "a user's file in the debris"


def test_a_live_run_is_not_debris(tmp_path: Path) -> None:
    """--clean-debris on a target another run is using right now leaves that run alone."""
    target = tmp_path / "tgt"
    proc = _start_big(tmp_path, str(target))
    wait_for("the save under way", saving(target), proc=proc)
    r = run("run", str(TINY), "--target", str(target), "--clean-debris",
            "--results", str(tmp_path / "b.jsonl"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert messages(r.stderr) == []
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert tree(target) == [] or not target.exists()


def test_kept_checkpoints_are_not_debris(tmp_path: Path) -> None:
    target = tmp_path / "tgt"
    r = run("run", str(TINY), "--target", str(target), "--keep",
            "--results", str(tmp_path / "a.jsonl"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    kept = tree(target)
    r = run("run", str(TINY), "--target", str(target), "--clean-debris",
            "--results", str(tmp_path / "b.jsonl"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert messages(r.stderr) == []
    assert tree(target) == kept


# --- S3 (a real MinIO) ---
def _uploads(server: MinioServer, prefix: str) -> list[str]:
    """Unfinished multipart uploads under `prefix` (MinIO lists them by exact key only, so
    the whole bucket's are listed and filtered)."""
    assert server.bucket
    ups = server.client().list_multipart_uploads(Bucket=server.bucket).get("Uploads", [])
    return [u["Key"] for u in ups if u["Key"].startswith(prefix + "/")]


def _start_s3(server: MinioServer, tmp_path: Path, prefix: str) -> subprocess.Popen[str]:
    return _start_big(tmp_path, f"s3://{server.bucket}/{prefix}", "--endpoint-url",
                      server.endpoint, "--part-size", "5MiB", environ=env(server.env()))


def test_s3_sigterm_aborts_the_uploads_and_leaves_nothing(minio_server: MinioServer,
                                                          tmp_path: Path) -> None:
    prefix = f"adv-term/{uuid.uuid4().hex[:10]}"
    proc = _start_s3(minio_server, tmp_path, prefix)
    wait_for("multipart uploads under way", lambda: _uploads(minio_server, prefix), proc=proc,
             every=0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert _uploads(minio_server, prefix) == []
    assert minio_server.list_keys(minio_server.bucket or "", prefix + "/") == []
    assert len(messages(err)) == 1 and minio_server.secret_key not in err, err


def test_s3_debris_with_pending_uploads_is_removed_with_the_flag(minio_server: MinioServer,
                                                                 tmp_path: Path) -> None:
    bucket = minio_server.bucket or ""
    prefix = f"adv-debris/{uuid.uuid4().hex[:10]}"
    target = f"s3://{bucket}/{prefix}"
    proc = _start_s3(minio_server, tmp_path, prefix)
    wait_for("multipart uploads under way", lambda: _uploads(minio_server, prefix), proc=proc,
             every=0.05)
    ranks = _ranks(proc)
    proc.kill()
    proc.communicate(timeout=30)
    assert gone_within(ranks, 5) == []
    keys = minio_server.list_keys(bucket, prefix + "/")
    (intent,) = [k for k in keys if k.endswith("/" + INTENT)]
    run_id = intent.split("/")[-2]
    pending = _uploads(minio_server, prefix)
    assert pending
    foreign = f"{prefix}/{run_id}/NOTES.txt"
    minio_server.client().put_object(Bucket=bucket, Key=foreign, Body=b"a user's object")
    s3 = ("--endpoint-url", minio_server.endpoint)
    e = env(minio_server.env())

    r = run("run", str(TINY), "--target", target, *s3, "--results", str(tmp_path / "a.jsonl"),
            cwd=tmp_path, environ=e)
    assert r.returncode == 0, r.stderr
    lines = messages(r.stderr)
    assert len(lines) == 1 and run_id in lines[0] and "--clean-debris" in lines[0], r.stderr
    assert "pending" in lines[0] or "upload" in lines[0], lines[0]
    assert sorted(_uploads(minio_server, prefix)) == sorted(pending)  # reported, not touched

    r = run("run", str(TINY), "--target", target, *s3, "--clean-debris",
            "--results", str(tmp_path / "b.jsonl"), cwd=tmp_path, environ=e)
    assert r.returncode == 0, r.stderr
    assert _uploads(minio_server, prefix) == []
    assert sorted(minio_server.list_keys(bucket, prefix + "/")) == sorted(
        [f"{prefix}/{TARGET_MARKER}", foreign])
    lines = messages(r.stderr)
    assert len(lines) == 1 and run_id in lines[0] and "NOTES.txt" in lines[0], r.stderr
