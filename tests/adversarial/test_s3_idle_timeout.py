"""MinIO's own per-connection idle timeout (issue 29): a part body that stops moving.

MinIO renews a read/write deadline on every read (hidden `--idle-timeout`,
MINIO_IDLE_TIMEOUT, 30 s by default; benchmarks/results/2026-12-03-minio-idle-timeout.md):
a body that stops moving for that long is answered 503 RequestTimeout. Here a MinIO of
its own runs with a 2 s timeout, behind the proxy's "stall" fault, which sends the first
upload's second part up to its first MiB and then nothing until MinIO gives up on it
(event-driven: no race with the client, whose whole body the proxy has read). A save
then either succeeds by sending that part again (counted in the records where the
transport counts retries) or fails with one line naming the options to change; never a
hang, never an upload left unrecorded.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import FaultProxy, MinioServer

from .runs import env, one_line, records
from .test_s3_faults import pending_uploads

pytestmark = pytest.mark.s3

IDLE = "2s"
MIB = 1 << 20
# 2 ranks of about 34 MiB each: 7 parts of 5 MiB per rank file
WORKLOAD = """
[workload]
name = "s3-idle"

[model]
name = "custom"
layers = 2
dim = 256
heads = 8
kv_heads = 4
ffn_dim = 688
vocab_size = 8000

[parallel]
world_size = 2
layout = "fsdp2"
"""
ASYNC = ["--mode", "async", "--step-seconds", "0.01", "--steps-per-checkpoint", "2"]
# case: (the package it needs, its options)
CASES = {"botocore": (None, []), "crt": ("awscrt", ["--s3-transport", "crt"]),
         "obstore": ("obstore", ["--s3-transport", "obstore"]), "botocore-async": (None, ASYNC)}


@pytest.fixture(scope="module")
def idle_server(minio_server: MinioServer) -> Iterator[MinioServer]:
    """A MinIO of its own whose idle timeout is IDLE (the session's keeps its 30 s)."""
    with MinioServer(minio_server.binary, idle_timeout=IDLE) as own:
        own.bucket = own.make_bucket()
        yield own


class FirstUploadPart:
    """Matches part `number` of the first upload seen, and its retries (same key)."""

    def __init__(self, number: int) -> None:
        self.needle = f"partNumber={number}&"
        self.key: str | None = None

    def __call__(self, method: str, path: str) -> bool:
        if method != "PUT" or self.needle not in path + "&":
            return False
        key = path.split("?", 1)[0]
        self.key = self.key or key
        return key == self.key


def save(server: MinioServer, proxy: FaultProxy, tmp_path: Path, case: str,
         *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    package, options = CASES[case]
    if package and not importlib.util.find_spec(package):
        pytest.skip(f"{package} is not installed")
    workload = tmp_path / "idle.toml"
    workload.write_text(WORKLOAD)
    results = tmp_path / "r.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "ckptbench", "run", str(workload), "--target",
         f"s3://{server.bucket}/idle-{uuid.uuid4().hex[:8]}", "--endpoint-url", proxy.endpoint,
         "--part-size", "5MiB", "--iterations", "1", "--results", str(results),
         *options, *args],
        capture_output=True, text=True, cwd=tmp_path, env=env(server.env()), timeout=240)
    return r, results


def assert_nothing_left(server: MinioServer, results: Path) -> None:
    """No upload pending on the server, and the run's cleanup record leaves nothing."""
    (cleanup,) = [r for r in records(results) if r["type"] == "cleanup"]
    pending = [k.split("/", 1)[1] for k in pending_uploads(server, str(server.bucket))]
    assert cleanup["left"] == [] and pending == [], (pending, cleanup["left"])


def test_stall_fault_sees_minio_give_up_or_resumes(idle_server: MinioServer,
                                                   minio_server: MinioServer) -> None:
    """The harness itself: MinIO with a 2 s idle timeout answers the stalled body 503
    RequestTimeout; one with its default 30 s gets the rest once `stall_s` passes."""
    from botocore.exceptions import ClientError

    body = os.urandom(3 * MIB)
    with FaultProxy(idle_server.endpoint, ["stall"]) as proxy:
        with pytest.raises(ClientError) as err:
            _put(proxy, idle_server, body)
        assert err.value.response["Error"]["Code"] == "RequestTimeout"
        assert proxy.stalls == ["answered 503"]
    with FaultProxy(minio_server.endpoint, ["stall"], stall_s=0.5) as proxy:
        _put(proxy, minio_server, body)
        assert proxy.stalls == ["resumed"]


def _put(proxy: FaultProxy, server: MinioServer, body: bytes) -> None:
    """One PUT through the proxy, one attempt."""
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client(
        "s3", endpoint_url=proxy.endpoint, aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}))
    client.put_object(Bucket=server.bucket, Key=f"stall/{uuid.uuid4().hex}", Body=body)


@pytest.mark.parametrize("case", CASES)
def test_a_part_cut_by_the_idle_timeout_is_sent_again(idle_server: MinioServer,
                                                      tmp_path: Path, case: str) -> None:
    with FaultProxy(idle_server.endpoint, ["stall"], FirstUploadPart(2)) as proxy:
        r, results = save(idle_server, proxy, tmp_path, case)
        assert r.returncode == 0, r.stderr[-3000:]
        assert proxy.stalls == ["answered 503"]
    recs = records(results)
    assert all(p["ok"] for p in recs if p["type"] == "phase")
    if case.startswith("botocore"):  # crt and obstore retry inside: retries_counted: false
        saves = [x["backend"] for x in recs if x["type"] == "rank" and x["phase"] == "save"]
        assert sum(s["retries_server"] for s in saves) == 1, saves
    assert_nothing_left(idle_server, results)


@pytest.mark.parametrize("case", CASES)
def test_a_part_cut_on_every_attempt_fails_in_one_line_naming_the_options(
        idle_server: MinioServer, tmp_path: Path, case: str) -> None:
    """Before, botocore's line said "server error 503 RequestTimeout on every attempt" and
    named nothing to change."""
    attempts = 2 if case.startswith("botocore") else 1  # crt/obstore count their own
    with FaultProxy(idle_server.endpoint, ["stall"] * attempts, FirstUploadPart(2)) as proxy:
        r, results = save(idle_server, proxy, tmp_path, case,
                          "--s3-max-attempts", str(attempts))
        assert proxy.stalls == ["answered 503"] * attempts
    line = one_line(r, 2, "--s3-concurrency", f"--s3-max-attempts (now {attempts})")
    (error,) = [x for x in records(results) if x["type"] == "error"]
    assert error["message"] in line and error["phase"] == "save"
    assert_nothing_left(idle_server, results)
