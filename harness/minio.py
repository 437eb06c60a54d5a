"""A real MinIO server on 127.0.0.1 for tests and benchmarks (not a mock).

`MinioServer.start()` runs the `minio` binary on a free port with a temporary data
directory and random root credentials, waits on /minio/health/live, and `stop()` ends
it. The binary comes from PATH, else from `$(go env GOPATH)/bin`, where `.ci/setup`
builds it from source (pinned). The credentials live only in this object and in the
environment handed to child processes (boto3's standard chain), never on a command line.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any

from harness import processes
from harness.processes import ToolError, find_binary, free_port

HEALTH = "/minio/health/live"
# Where MinIO moves deleted objects' files before it purges them (in bursts).
TRASH = Path(".minio.sys") / "tmp" / ".trash"


class Loopback:
    """An HTTP service of the harness on 127.0.0.1:port."""

    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint_url(self) -> str:  # boto3's spelling
        return self.endpoint


def empty_trash(data_dir: Path) -> int:
    """Remove what MinIO has not yet purged of deleted objects (`data_dir/.minio.sys/tmp/
    .trash`). MinIO purges it in bursts (30 GB in 15 s was seen), with the file system's
    discards behind them, and a burst lands in whatever is being measured then; a
    benchmark empties it (and syncs) between turns. Returns the entries removed."""
    trash = data_dir / TRASH
    entries = list(trash.iterdir()) if trash.is_dir() else []
    for entry in entries:
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    return len(entries)


def uploads_in_flight(data_dir: Path) -> bool:
    """Whether MinIO holds an unfinished multipart upload (under .minio.sys/multipart/<hash>/<id>)."""
    root = data_dir / ".minio.sys" / "multipart"
    return root.is_dir() and any(any(d.iterdir()) for d in root.iterdir() if d.is_dir())


class MinioServer(Loopback):
    """One MinIO process: `with MinioServer() as m: m.endpoint, m.env(), m.make_bucket()`."""

    def __init__(self, binary: str | None = None, data_dir: str | Path | None = None,
                 port: int | None = None, idle_timeout: str | None = None) -> None:
        found = binary or find_binary("minio")
        if not found:
            raise ToolError(
                "no `minio` binary on PATH or in $(go env GOPATH)/bin; build it with .ci/setup "
                "(go install github.com/minio/minio@<pinned version>)")
        self.binary = found
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ckptbench-minio-")
            data_dir = self._tmp.name
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        # Random per server: tests grep outputs for these to prove they never leak.
        self.access_key = "ckpt" + secrets.token_hex(8)
        self.secret_key = "ckptsecret" + secrets.token_hex(16)
        self.bucket: str | None = None  # a bucket its user made and shares (the test session's)
        # MinIO's hidden per-connection read/write deadline (MINIO_IDLE_TIMEOUT, default 30s),
        # renewed on each read and write: a body that stops moving that long is answered 503.
        self.idle_timeout = idle_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = self.data_dir.parent / f"minio-{self.port}.log" if self._tmp is None \
            else Path(self._tmp.name + ".log")

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose boto3 standard chain reaches this server."""
        env = dict(os.environ if base is None else base)
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.pop(k, None)
        env.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key,
                   AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
                   AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        return env

    def start(self, timeout: float = 60.0) -> MinioServer:
        env = dict(os.environ, MINIO_ROOT_USER=self.access_key, MINIO_ROOT_PASSWORD=self.secret_key,
                   MINIO_BROWSER="off", MINIO_UPDATE="off", MINIO_CI_CD="1")
        if self.idle_timeout is not None:
            env["MINIO_IDLE_TIMEOUT"] = self.idle_timeout
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = processes.start(
                [self.binary, "server", str(self.data_dir), "--address", f"127.0.0.1:{self.port}",
                 "--console-address", f"127.0.0.1:{free_port()}", "--quiet"],
                env=env, stdout=log, stderr=subprocess.STDOUT)
        # Even if stop() is never called (a crashed script, a killed test session), the
        # server goes with this object or at exit: never an orphan serving a deleted dir.
        self._finalizer = weakref.finalize(self, processes.stop, self.proc, 10.0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ToolError(f"minio exited with status {self.proc.returncode}: "
                                f"{self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.1)
        self.stop()
        raise ToolError(f"minio not live after {timeout:.0f}s: {self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + HEALTH, timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kill(self) -> None:
        """Stop the server abruptly (SIGKILL), as a crash would."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None:
            processes.stop(self.proc)
        self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self.log_path.unlink(missing_ok=True)

    def empty_trash(self) -> int:
        """empty_trash of this server's data directory."""
        return empty_trash(self.data_dir)

    def client(self, **config: Any) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, **config))

    def make_bucket(self, name: str | None = None) -> str:
        name = name or f"ckpt-{secrets.token_hex(4)}"
        self.client().create_bucket(Bucket=name)
        return name

    def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        client = self.client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys

    def __enter__(self) -> MinioServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
