"""S3 on a real MinIO (issue 29, families 8 and 11; family 7 is test_frozen_uploads):
`ckptbench restore` works through every transport (obstore's runtime does not survive a
fork: the parent must not start it), and a run whose endpoint keeps dropping connections
names the options that size its load."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness import MinioServer

from .runs import TINY, env, records

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
