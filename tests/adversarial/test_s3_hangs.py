"""S3 on a real MinIO (issue 29, families 7, 8 and 11): every transport's aborted uploads
are aborted or reported in the cleanup record, `ckptbench restore` works through every
transport (obstore's runtime does not survive a fork: the parent must not start it), and
a run whose endpoint keeps dropping connections names the options that size its load."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ckptbench.testing import MinioServer
from ckptbench.testing.minio import uploads_in_flight

from .runs import TINY, env, records
from .test_s3_faults import WORKLOAD, assert_stall_reported, pending_uploads, server  # noqa: F401

pytestmark = pytest.mark.s3

TRANSPORTS = [t for t in ("botocore", "crt", "obstore")
              if t == "botocore" or importlib.util.find_spec({"crt": "awscrt"}.get(t, t))]


def _cli(*args: str, minio: MinioServer, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args, "--endpoint-url",
                           minio.endpoint], capture_output=True, text=True, cwd=cwd,
                          env=env(minio.env()), timeout=600)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_restore_command_through_every_transport(minio_server: MinioServer, tmp_path: Path,
                                                 transport: str) -> None:
    prefix = f"restore-{transport}/{uuid.uuid4().hex[:8]}"
    target = f"s3://{minio_server.bucket}/{prefix}"
    r = _cli("run", str(TINY), "--target", target, "--keep", "--no-restore", "--results",
             str(tmp_path / "save.jsonl"), minio=minio_server, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_id = records(tmp_path / "save.jsonl")[0]["run_id"]
    results = tmp_path / "again.jsonl"
    r = _cli("restore", f"{target}/{run_id}/checkpoint-1", "--s3-transport", transport,
             "--results", str(results), minio=minio_server, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (phase,) = [x for x in records(results) if x["type"] == "phase"]
    assert phase["phase"] == "restore" and phase["verified"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_frozen_server_every_upload_aborted_or_reported(server: MinioServer,  # noqa: F811
                                                        tmp_path: Path, transport: str) -> None:
    """MinIO frozen (SIGSTOP) mid-save through each transport: the run stalls and cleans
    up while the server cannot answer; once it thaws, every upload still pending is one
    the cleanup record's `left` names (never `left: []` over a leftover)."""
    workload = tmp_path / "freeze.toml"
    workload.write_text(WORKLOAD)
    results = tmp_path / "r.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptbench", "run", str(workload), "--target",
         f"s3://{server.bucket}/frozen", "--endpoint-url", server.endpoint, "--part-size",
         "5MiB", "--s3-concurrency", "2", "--stall-timeout", "5s", "--s3-transport",
         transport, "--results", str(results)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=env(server.env()))
    deadline = time.monotonic() + 300
    while not uploads_in_flight(server.data_dir):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no upload in flight: {proc.communicate()[1][-3000:]}")
        time.sleep(0.01)
    assert server.proc is not None
    os.killpg(server.proc.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        assert_stall_reported(proc, frozen_at)
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)
    pending = [k.split("/", 1)[1] for k in pending_uploads(server, server.bucket)]
    (cleanup,) = [r for r in records(results) if r["type"] == "cleanup"]
    for key in pending:  # named one by one, or counted (the run's intent kept for them)
        assert any("unfinished upload" in left and (key in left or "intent" in left)
                   for left in cleanup["left"]), (key, cleanup["left"])


def test_connections_lost_on_every_attempt_name_the_options() -> None:
    """The final failure under load names what to change, with the values in use."""
    from botocore.exceptions import ConnectionClosedError

    from ckptbench.backends.s3 import S3Backend, S3Options

    b = S3Backend("s3://bucket/x", S3Options(endpoint_url="http://127.0.0.1:9",
                                             concurrency=4))
    message = str(b.error(ConnectionClosedError(endpoint_url="http://127.0.0.1:9"),
                          "upload part 5 of k"))
    assert "lost (ConnectionClosedError) on every attempt" in message
    assert "--s3-concurrency (now 4)" in message and "--s3-max-attempts (now 6)" in message
    assert S3Options().max_attempts > 3  # the default backs off longer than botocore's 3
