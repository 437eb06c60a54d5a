"""S3 faults on a real MinIO (issue 16, item 5): a server that stops answering must not
keep a run going, nor its cleanup.

The server is frozen with SIGSTOP in the middle of a save (a server of its own, on the
session's binary: the session's stays up). Each rank watches itself: no byte moved for
--stall-timeout seconds is a failure, and every cleanup call (deletes, aborts) has short
timeouts, so the run ends in bounded time with one line saying what happened.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import FaultProxy, MinioServer
from harness.minio import uploads_in_flight

from .runs import BANNER, env

pytestmark = pytest.mark.s3

STALL_S = 5
# the stall, the launcher's grace for the other ranks (5 s), the cleanup's budget against
# a server that never answers (10 s, client.CLEANUP_BUDGET_S, plus the call in flight:
# 5 s), start-up; room for a loaded machine (before the fix the run went on for 4+ minutes)
BOUND_S = 75

WORKLOAD = """
[workload]
name = "s3-freeze"

[model]
name = "custom"
layers = 4
dim = 512
heads = 8
kv_heads = 4
ffn_dim = 1376
vocab_size = 8000

[parallel]
world_size = 4
layout = "fsdp2"
"""


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (the forked ranks of a ckptbench run)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


@pytest.fixture
def server(minio_server: MinioServer, tmp_path: Path) -> Iterator[MinioServer]:
    own = MinioServer(minio_server.binary, data_dir=tmp_path / "minio-data").start()
    own.bucket = own.make_bucket()
    try:
        yield own
    finally:
        if own.proc is not None and own.proc.poll() is None:
            os.killpg(own.proc.pid, signal.SIGCONT)  # a stopped server cannot be stopped
        own.stop()


def freeze_mid_save(server: MinioServer, tmp_path: Path, prefix: str
                    ) -> tuple[subprocess.Popen[str], float]:
    """Start a run on `server` and SIGSTOP the server once uploads are in flight."""
    workload = tmp_path / "freeze.toml"
    workload.write_text(WORKLOAD)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptbench", "run", str(workload), "--target",
         f"s3://{server.bucket}/{prefix}", "--endpoint-url", server.endpoint,
         "--part-size", "5MiB", "--s3-concurrency", "2", "--stall-timeout", f"{STALL_S}s",
         "--results", str(tmp_path / "r.jsonl")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=env(server.env()))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if uploads_in_flight(server.data_dir):
            assert server.proc is not None
            os.killpg(server.proc.pid, signal.SIGSTOP)
            return proc, time.monotonic()
        time.sleep(0.01)
    proc.kill()
    pytest.fail("the run ended before the server could be frozen mid-save")


def assert_stall_reported(proc: subprocess.Popen[str], frozen_at: float) -> str:
    try:
        _out, err = proc.communicate(timeout=BOUND_S + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the run was still going {BOUND_S + 60} s after the server froze")
    elapsed = time.monotonic() - frozen_at
    # A cleanup that could not reach the server says its uploads may be left and keeps the
    # run's intent for --clean-debris (issue 29, family 7): that note, then the error.
    lines = [line for line in err.splitlines() if line.strip() and not BANNER.match(line)
             and not ("unfinished upload(s)" in line and "--clean-debris" in line)]
    assert proc.returncode == 1, err[-3000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith("ckptbench: error: rank "), lines[0]
    assert f"stalled: no byte moved for {STALL_S} s during the save of checkpoint-1" in lines[0]
    assert elapsed < BOUND_S, f"the run took {elapsed:.0f} s after the server froze"
    return lines[0]


def pending_uploads(server: MinioServer, bucket: str) -> list[str]:
    """Every unfinished upload's key (MinIO takes a listing prefix as an exact key, so the
    whole bucket is listed and nothing is filtered away by accident)."""
    return [u["Key"] for u in server.client().list_multipart_uploads(Bucket=bucket)
            .get("Uploads", [])]


def test_cleanup_aborts_the_uploads_a_dead_rank_left(minio_server: MinioServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Uploads a killed rank could not abort are aborted by the run's cleanup: every one
    under the run, none of a neighbour's ('run-1' must not take 'run-10' with it)."""
    from ckptbench.backends.s3 import S3Backend, S3Options

    for k, v in minio_server.env().items():
        monkeypatch.setenv(k, v)
    bucket = minio_server.make_bucket()
    b = S3Backend(f"s3://{bucket}/left", S3Options(endpoint_url=minio_server.endpoint))
    b.prepare()
    client = minio_server.client()
    for key in ("left/run-1/checkpoint-1/__0_0.distcp", "left/run-1/checkpoint-1/__1_0.distcp",
                "left/run-10/checkpoint-1/__0_0.distcp"):
        client.create_multipart_upload(Bucket=bucket, Key=key)
    b.remove_tree("run-1")
    assert pending_uploads(minio_server, bucket) == ["left/run-10/checkpoint-1/__0_0.distcp"]


def test_cleanup_after_a_stall_makes_no_call_once_its_budget_is_spent(
        minio_server: MinioServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a stall the cleanup gets one short try per call and CLEANUP_BUDGET_S in all: a
    frozen endpoint gets the calls begun within the budget (each waits its read timeout),
    not one per leftover, and every upload whose abort was not confirmed is named in
    `left` (what --clean-debris goes by). Before, each call waited out the quick client's
    two tries, one after another: a minute and more of cleanup against a frozen server."""
    from ckptbench.backends.base import UPLOAD_NOT_ABORTED
    from ckptbench.backends.s3 import S3Backend, S3Options
    from ckptbench.backends.s3.client import CLEANUP_BUDGET_S, SHORT_CLIENTS

    for k, v in minio_server.env().items():
        monkeypatch.setenv(k, v)
    keys = [f"run-1/checkpoint-1/__{i}_0.distcp" for i in range(6)]
    with FaultProxy(minio_server.endpoint, ["freeze"]) as proxy:  # from the first request on
        b = S3Backend(f"s3://{minio_server.bucket}/budget", S3Options(endpoint_url=proxy.endpoint))
        b.cleaning_up(unresponsive=True)  # what a run that stalled does before its cleanup
        for key in keys:
            b.delete([key])  # best effort: counted, never raised
        assert b.pending_uploads(keys) is None  # cannot say: not tried
        left = b.left_behind("run-1", 20)
        calls = len(proxy.user_agents)
    assert 1 <= calls <= math.ceil(CLEANUP_BUDGET_S / SHORT_CLIENTS["last"][1]), calls
    for key in keys:
        assert f"{key}{UPLOAD_NOT_ABORTED}" in left, (key, left)


def test_frozen_server_ends_the_run_in_bounded_time(server: MinioServer, tmp_path: Path
                                                    ) -> None:
    """The server never comes back while ckptbench runs: the ranks stall, the run and its
    cleanup (which cannot reach the server) still end in bounded time, and the run's
    intent stays so that --clean-debris finds its uploads once the server is back."""
    proc, frozen_at = freeze_mid_save(server, tmp_path, "frozen")
    assert_stall_reported(proc, frozen_at)
    assert server.proc is not None and server.bucket
    os.killpg(server.proc.pid, signal.SIGCONT)
    r = subprocess.run(
        [sys.executable, "-m", "ckptbench", "run", str(tmp_path / "freeze.toml"), "--target",
         f"s3://{server.bucket}/frozen", "--endpoint-url", server.endpoint, "--scale", "8",
         "--clean-debris", "--results", str(tmp_path / "c.jsonl")],
        capture_output=True, text=True, cwd=tmp_path, env=env(server.env()), timeout=300)
    assert r.returncode == 0 and "removed what 1 interrupted run" in r.stderr, r.stderr
    assert pending_uploads(server, server.bucket) == []
    assert [k for k in server.list_keys(server.bucket, "frozen/") if "/run-" in k] == []


def test_server_back_during_cleanup_leaves_no_upload(server: MinioServer, tmp_path: Path
                                                     ) -> None:
    """The server thaws once the stalled run's ranks are gone (the parent cleaning up):
    the run still fails (the stall was real), and its cleanup, bounded but patient enough,
    leaves no object and no pending multipart upload."""
    proc, frozen_at = freeze_mid_save(server, tmp_path, "thaw")
    time.sleep(STALL_S)
    while children(proc.pid) and time.monotonic() - frozen_at < BOUND_S:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the server came back"
    assert server.proc is not None
    os.killpg(server.proc.pid, signal.SIGCONT)
    assert_stall_reported(proc, frozen_at)
    assert pending_uploads(server, server.bucket) == []
    assert server.list_keys(server.bucket, "thaw/") == []
