"""`ckptbench run` on S3 end to end, as a real subprocess against a real MinIO.

Credentials reach ckptbench only through the environment (boto3's standard chain); every
test checks that they appear nowhere in stdout, stderr or the results file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness import FaultProxy, MinioServer, free_port
from harness.minio import uploads_in_flight

pytestmark = pytest.mark.s3

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "workloads" / "tiny.toml"


def ckptbench(*args: str, env: dict[str, str], cwd: Path,
              timeout: int = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_no_secrets(server: MinioServer, *texts: str) -> None:
    for text in texts:
        assert server.access_key not in text
        assert server.secret_key not in text


def assert_one_line_error(r: subprocess.CompletedProcess[str], server: MinioServer,
                          *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ckptbench: error: ") and "Traceback" not in r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert_no_secrets(server, r.stdout, r.stderr)
    return lines[0]


def test_run_tiny_on_minio(minio_server: MinioServer, tmp_path: Path) -> None:
    prefix = f"e2e/{uuid.uuid4().hex[:8]}"
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(TINY), "--target", f"s3://{minio_server.bucket}/{prefix}",
                  "--endpoint-url", minio_server.endpoint, "--iterations", "2",
                  "--results", str(results), env=minio_server.env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert_no_secrets(minio_server, r.stdout, r.stderr, results.read_text())
    recs = load(results)
    summary = {s["phase"]: s for s in recs if s["type"] == "summary"}
    assert set(summary) == {"save", "restore"}
    assert all(s["iterations"] == 2 and s["throughput_bytes_per_s"] > 0 for s in summary.values())
    phases = [p for p in recs if p["type"] == "phase"]
    assert [(p["iteration"], p["phase"], p["ok"]) for p in phases] == [
        (1, "save", True), (1, "restore", True), (2, "save", True), (2, "restore", True)]
    assert all(p["verified"] and p["cache"] == "none (object store)"
               for p in phases if p["phase"] == "restore")
    target = recs[0]["environment"]["target"]
    assert target["backend"] == "s3" and target["endpoint"] == minio_server.endpoint
    assert target["part_size"] == "auto" and target["checksum"]["request"] == "when_required"
    assert target["concurrency_chosen"] is True and target["transfer"]["transport"] == "botocore"
    assert target["auth"] == "env"
    ranks = [r for r in recs if r["type"] == "rank"]
    assert all(r["backend"]["retries"] == 0 and r["backend"]["requests"] >= 1 for r in ranks)
    # deleted after the run, marker included: the prefix is as ckptbench found it
    assert minio_server.list_keys(minio_server.bucket, prefix + "/") == []


def test_retried_requests_show_up_in_the_records(minio_server: MinioServer,
                                                  tmp_path: Path) -> None:
    faults = ["503", "500", "reset"]

    def data(method: str, path: str) -> bool:
        return method == "PUT" and ".distcp" in path

    with FaultProxy(minio_server.endpoint, faults, data) as proxy:
        results = tmp_path / "r.jsonl"
        r = ckptbench("run", str(TINY), "--target",
                      f"s3://{minio_server.bucket}/retry/{uuid.uuid4().hex[:8]}",
                      "--endpoint-url", proxy.endpoint, "--results", str(results),
                      env=minio_server.env(), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert [f for f, _, _ in proxy.injected] == faults
    recs = load(results)
    stats = [r["backend"] for r in recs if r["type"] == "rank" and r["phase"] == "save"]
    total = {k: sum(s[k] for s in stats) for k in stats[0]}
    assert total["retries"] == 3, total
    assert total["retries_throttle"] == total["retries_server"] == total["retries_connection"] == 1
    assert all(p["ok"] for p in recs if p["type"] == "phase")
    assert_no_secrets(minio_server, r.stdout, r.stderr, results.read_text())


@pytest.mark.parametrize("which", ["secret", "access"])
def test_wrong_credentials(minio_server: MinioServer, tmp_path: Path, which: str) -> None:
    env = minio_server.env()
    if which == "secret":
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret-" + uuid.uuid4().hex
        code = "SignatureDoesNotMatch"
    else:
        env["AWS_ACCESS_KEY_ID"] = "nobody" + uuid.uuid4().hex[:10]
        code = "InvalidAccessKeyId"
    r = ckptbench("run", str(TINY), "--target", f"s3://{minio_server.bucket}/creds",
                  "--endpoint-url", minio_server.endpoint, "--results", str(tmp_path / "r.jsonl"),
                  env=env, cwd=tmp_path)
    line = assert_one_line_error(r, minio_server, "wrong credentials", code, "allowed")
    assert env["AWS_SECRET_ACCESS_KEY"] not in line and env["AWS_ACCESS_KEY_ID"] not in line
    assert not (tmp_path / "r.jsonl").exists()


def test_missing_bucket(minio_server: MinioServer, tmp_path: Path) -> None:
    r = ckptbench("run", str(TINY), "--target", "s3://no-such-bucket-here/x",
                  "--endpoint-url", minio_server.endpoint, env=minio_server.env(), cwd=tmp_path)
    assert_one_line_error(r, minio_server, "bucket 'no-such-bucket-here' does not exist",
                          "--create-bucket", "aws s3 mb s3://no-such-bucket-here")
    client = minio_server.client()
    assert "no-such-bucket-here" not in [b["Name"] for b in client.list_buckets()["Buckets"]]


def test_create_bucket_makes_a_missing_bucket_and_keeps_it(minio_server: MinioServer,
                                                          tmp_path: Path) -> None:
    """The README's S3 quick start: a fresh MinIO and one run with --create-bucket."""
    bucket = f"made-{uuid.uuid4().hex[:8]}"
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(TINY), "--target", f"s3://{bucket}/first",
                  "--endpoint-url", minio_server.endpoint, "--create-bucket",
                  "--results", str(results), env=minio_server.env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert_no_secrets(minio_server, r.stdout, r.stderr, results.read_text())
    run = load(results)[0]
    assert run["environment"]["target"]["options"]["create_bucket"] is True
    assert minio_server.list_keys(bucket) == []  # the run's objects are gone ...
    # ... and the bucket stays: a second run (no flag) and a second --create-bucket run use it.
    for extra in ([], ["--create-bucket"]):
        r = ckptbench("run", str(TINY), "--target", f"s3://{bucket}/again",
                      "--endpoint-url", minio_server.endpoint, *extra,
                      env=minio_server.env(), cwd=tmp_path)
        assert r.returncode == 0, r.stderr


def test_unreachable_endpoint(minio_server: MinioServer, tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = ckptbench("run", str(TINY), "--target", f"s3://{minio_server.bucket}/x",
                  "--endpoint-url", f"http://127.0.0.1:{free_port()}", env=minio_server.env(),
                  cwd=tmp_path)
    assert_one_line_error(r, minio_server, "cannot reach the endpoint")
    assert time.monotonic() - t0 < 20


def test_foreign_prefix_is_refused_and_kept(minio_server: MinioServer, tmp_path: Path) -> None:
    prefix = f"foreign/{uuid.uuid4().hex[:8]}"
    minio_server.client().put_object(Bucket=minio_server.bucket, Key=f"{prefix}/data.bin", Body=b"x")
    r = ckptbench("run", str(TINY), "--target", f"s3://{minio_server.bucket}/{prefix}",
                  "--endpoint-url", minio_server.endpoint, env=minio_server.env(), cwd=tmp_path)
    assert_one_line_error(r, minio_server, "not made by ckptbench", "allowed")
    assert minio_server.list_keys(minio_server.bucket, prefix + "/") == [f"{prefix}/data.bin"]


KILL_WORKLOAD = """
[workload]
name = "s3-kill"
description = "4 ranks of about 57 MiB: long enough to stop the server in the middle of a save"

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


def _restored(results: Path, iteration: int) -> bool:
    """Whether the results file (being written) records that iteration's restore."""
    try:
        lines = results.read_text().splitlines()
    except FileNotFoundError:
        return False
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if r["type"] == "phase" and r["iteration"] == iteration and r["phase"] == "restore":
            return True
    return False


def test_minio_killed_mid_save(minio_server: MinioServer, tmp_path: Path) -> None:
    """The server dies while iteration 2 uploads: that iteration fails clearly, no manifest
    is ever written for it, and iteration 1's records stay in the results file. (A server
    of its own, on the same binary as the session's: that one stays up.)"""
    workload = tmp_path / "kill.toml"
    workload.write_text(KILL_WORKLOAD)
    server = MinioServer(minio_server.binary, data_dir=tmp_path / "minio-data").start()
    try:
        bucket = server.make_bucket()
        results = tmp_path / "r.jsonl"
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckptbench", "run", str(workload), "--target",
             f"s3://{bucket}/kill", "--endpoint-url", server.endpoint, "--iterations", "3",
             "--part-size", "5MiB", "--s3-concurrency", "2", "--results", str(results)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
            env=server.env())
        deadline = time.monotonic() + 120
        iteration_1_done = killed = False
        while time.monotonic() < deadline and proc.poll() is None:
            if not iteration_1_done:
                iteration_1_done = _restored(results, iteration=1)
            if iteration_1_done and uploads_in_flight(server.data_dir):
                server.kill()  # SIGKILL: a crash in the middle of iteration 2's save
                killed = True
                break
            time.sleep(0.01)
        assert killed, "the run ended before the server could be stopped mid-save"
        out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("ckptbench: error: ") and "Traceback" not in err
        assert_no_secrets(server, out, err, results.read_text())

        recs = load(results)
        phases = [(p["iteration"], p["phase"], p["ok"]) for p in recs if p["type"] == "phase"]
        assert phases[:2] == [(1, "save", True), (1, "restore", True)]  # earlier results kept
        assert phases[2] == (2, "save", False)
        errors = [e for e in recs if e["type"] == "error"]
        assert errors and errors[0]["iteration"] == 2 and errors[0]["phase"] == "save"
        message = errors[0]["message"]
        assert "connection" in message or "cannot reach" in message, message
        assert message.startswith(f"s3://{bucket}/kill: ") and "\n" not in message
        assert not any(p[0] == 3 for p in phases)
        assert any(s["type"] == "summary" and s["phase"] == "save" for s in recs)

        server.start()  # same data directory, port and keys: look at what is left
        keys = server.list_keys(bucket, "kill/")
        assert not any(k.endswith("/.metadata") for k in keys), keys  # never committed
        assert not any("checkpoint-1/" in k for k in keys), keys  # removed as usual
    finally:
        server.stop()
        if "proc" in locals() and proc.poll() is None:
            proc.kill()

