"""A real MinIO server on 127.0.0.1 for tests and benchmarks (not a mock).

`MinioServer.start()` runs the `minio` binary on a free port with a temporary data
directory and random root credentials, waits on /minio/health/live, and `stop()` ends
it. The binary comes from PATH, else from `$(go env GOPATH)/bin`, where `.ci/setup`
builds it from source (pinned). The credentials live only in this object and in the
environment handed to child processes (boto3's standard chain), never on a command line.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any

HEALTH = "/minio/health/live"


def go_bin_dir() -> Path:
    """`$(go env GOPATH)/bin` (without running go when GOPATH is set or go is missing)."""
    gopath = os.environ.get("GOPATH")
    if not gopath and shutil.which("go"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            gopath = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True,
                                    timeout=30).stdout.strip()
    return Path(gopath or Path.home() / "go").expanduser() / "bin"


def find_binary(name: str) -> str | None:
    """`name` on PATH, else in the Go bin directory; None if neither has it."""
    found = shutil.which(name)
    if found:
        return found
    candidate = go_bin_dir() / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Loopback:
    """An HTTP service of the tests on 127.0.0.1:port."""

    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint_url(self) -> str:  # boto3's spelling
        return self.endpoint


class MinioServer(_Loopback):
    """One MinIO process: `with MinioServer() as m: m.endpoint, m.env(), m.make_bucket()`."""

    def __init__(self, binary: str | None = None, data_dir: str | Path | None = None,
                 port: int | None = None) -> None:
        found = binary or find_binary("minio")
        if not found:
            raise FileNotFoundError(
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
        self.proc: subprocess.Popen[bytes] | None = None
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
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        try:
            self.proc = subprocess.Popen(
                [self.binary, "server", str(self.data_dir), "--address", f"127.0.0.1:{self.port}",
                 "--console-address", f"127.0.0.1:{free_port()}", "--quiet"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
        finally:
            log.close()
        # Even if stop() is never called (a crashed script, a killed test session), the
        # server goes with this object or at exit: never an orphan serving a deleted dir.
        self._finalizer = weakref.finalize(self, _terminate, self.proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"minio exited with status {self.proc.returncode}: "
                                   f"{self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"minio not live after {timeout:.0f}s: {self.log_tail()}")

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
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            with contextlib.suppress(OSError):
                self.log_path.unlink()

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


# --- a fault-injecting HTTP proxy: real retries against the real server behind it ---
_ERRORS = {
    "503": (503, "Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
}
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade", "expect"}


class FaultProxy(_Loopback):
    """A tiny HTTP/1.1 proxy on 127.0.0.1 in front of an S3 endpoint.

    Requests that `match(method, path)` consume the queued `faults` one each, in order:
    ``"503"`` answers SlowDown, ``"500"`` InternalError, ``"reset"`` reads the request and
    resets the connection without an answer, ``"truncate"`` forwards, then sends half the
    response body and resets. Everything else is forwarded unchanged (the Host header is
    kept, so SigV4 signatures stay valid). `injected` lists what was done to which request.
    """

    def __init__(self, upstream: str, faults: list[str] | None = None,
                 match: Any = None) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        up = urlsplit(upstream)
        self.upstream = (up.hostname or "127.0.0.1", up.port or 80)
        self.faults = list(faults or [])
        self.match = match or (lambda method, path: True)
        self.injected: list[tuple[str, str, str]] = []
        self.user_agents: list[str] = []  # of every request, in order
        self.forwarded = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _reset(self) -> None:
                import struct

                self.wfile.flush()
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True

            def handle_one_request(self) -> None:  # noqa: D401 - same as the base, all methods
                try:
                    self.raw_requestline = self.rfile.readline(65537)
                    if not self.raw_requestline:
                        self.close_connection = True
                        return
                    if not self.parse_request():
                        return
                    self._proxy()
                    self.wfile.flush()
                except (ConnectionError, TimeoutError, OSError):
                    self.close_connection = True

            def _proxy(self) -> None:
                import http.client

                body = self._body()
                fault = None
                with proxy.lock:
                    proxy.user_agents.append(self.headers.get("User-Agent", ""))
                    if proxy.faults and proxy.match(self.command, self.path):
                        fault = proxy.faults.pop(0)
                        proxy.injected.append((fault, self.command, self.path))
                if fault in _ERRORS:
                    status, reason, code, message = _ERRORS[fault]
                    xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                           f"<Message>{message}</Message></Error>").encode()
                    self.send_response_only(status, reason)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(xml) if self.command != "HEAD" else 0))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(xml)
                    return
                if fault == "reset":
                    self._reset()
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    with proxy.lock:
                        proxy.forwarded += 1
                    self.send_response_only(resp.status, resp.reason)
                    for k, v in resp.getheaders():
                        if k.lower() not in _HOP and k.lower() != "content-length":
                            self.send_header(k, v)
                    length = resp.getheader("Content-Length") if self.command == "HEAD" else len(data)
                    self.send_header("Content-Length", str(length or 0))
                    self.end_headers()
                    if fault == "truncate" and len(data) > 1:
                        self.wfile.write(data[:len(data) // 2])
                        self._reset()
                        return
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
