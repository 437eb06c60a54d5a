"""Per-process S3 client state: a boto3 session, its clients, counters and spare part
buffers, made lazily in each process (the runner forks rank processes after ``prepare``,
and no connection may cross a fork).

Requests go through the classic botocore client (never the CRT transfer client, which has
been reported to ignore a custom endpoint).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ckptbench.backends.base import RequestWatch
from ckptbench.backends.s3.errors import count_attempt, note_retry_reason
from ckptbench.backends.s3.options import S3Options
from ckptbench.backends.s3.readahead import SMALL_PER_LARGE
from ckptbench.backends.s3.window import Window

STAT_KEYS = ("requests", "retries", "retries_throttle", "retries_server", "retries_connection",
             "retries_other", "cleanup_errors")


@functools.cache
def user_agent() -> str:
    """ckptbench's User-Agent: the tool and the versions a server operator would ask for."""
    import platform

    import botocore

    from ckptbench import __version__

    return (f"ckptbench/{__version__} botocore/{botocore.__version__} "
            f"Python/{platform.python_version()}")


def is_aws(endpoint: str) -> bool:
    host = urlsplit(endpoint).hostname or ""
    return host.endswith(".amazonaws.com") or host.endswith(".amazonaws.com.cn")


class ProcessState:
    """What one process owns: its clients, counters and spare part buffers (never forked)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.clients: dict[str, Any] = {}
        self.session: Any = None  # one boto3 session: its loader parses the S3 model once
        self.counters: collections.Counter[str] = collections.Counter()
        self.buffers: list[bytearray] = []
        self.dead = False  # the endpoint stopped answering: cleanup tries once, quickly
        self.budget_from: float | None = None  # the first cleanup call since (monotonic)
        self.cleaning = False  # the run ended here: every request is cleanup's (bounded)
        self.prepared = False  # this process prepared a run's target (S3Backend.prepare)
        self.window = Window()  # parts in flight, narrowed while the endpoint pushes back

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counters[key] += n

    def count_each(self, *keys: str) -> None:
        with self.lock:
            for key in keys:
                self.counters[key] += 1

    def stopped_answering(self) -> None:
        """The endpoint did not answer (refused, timed out, a stall): the cleanup's calls
        from now on get one short try each, within CLEANUP_BUDGET_S in all."""
        self.dead = True

    def answered(self) -> None:
        """The endpoint answered: the cleanup is patient again."""
        self.dead, self.budget_from = False, None

    def cleanup_kind(self) -> str | None:
        """The client kind for a cleanup call: 'quick'; 'last' once the endpoint stopped
        answering; None (no call) once the cleanup has spent CLEANUP_BUDGET_S on it since
        (counted from its first call then, not from the failure: a lease renewal that
        failed long before the end of the run spends nothing)."""
        if not self.dead:
            return "quick"
        with self.lock:
            now = time.monotonic()
            if self.budget_from is None:
                self.budget_from = now
            return "last" if now - self.budget_from < CLEANUP_BUDGET_S else None

    def take_stats(self) -> dict[str, int]:
        """The counters since the last call, then reset."""
        with self.lock:
            out = {k: int(self.counters.get(k, 0)) for k in STAT_KEYS}
            self.counters.clear()
        return out


_STATE_LOCK = threading.Lock()
os.register_at_fork(after_in_child=lambda: globals().__setitem__("_STATE_LOCK", threading.Lock()))


@dataclass(frozen=True)
class Resolved:
    """Endpoint, region and addressing style, resolved once (children inherit them)."""

    endpoint: str
    region: str
    addressing_style: str


# kind -> (connect timeout s, read timeout s, attempts) of the clients other than 'main'
SHORT_CLIENTS = {
    "quick": (2.0, 10.0, 2),  # probing the target; every cleanup call (delete, abort)
    "last": (2.0, 5.0, 1),  # cleanup once the endpoint stopped answering: one quick try
    # the control requests (marker, listings, intent, lease) of a process that prepared a
    # run and has no stall watch (the launcher's parent): as bounded as the probe before
    # them, their bodies (an intent of many names) with the read timeout to go out in
    "control": (2.0, 10.0, 2),
}
# Once the endpoint has stopped answering, a process's cleanup makes calls for this long
# from its first (each one try, 'last'), then none: what it could not abort or delete is named in the
# cleanup record's `left` and the run's intent stays for --clean-debris. A call answered
# in that time ends it (the endpoint is back: the cleanup goes on as usual).
CLEANUP_BUDGET_S = 10.0

# the kinds whose connect timeout also bounds sending a body (urllib3: send_timeout)
SENDS_BODIES = ("main", "control")


_WATCH: dict[int, RequestWatch] = {}  # pid -> its watch (never a forked parent's)


def watch_requests(watch: RequestWatch, pid: int) -> None:
    """The runner hands its watch to this process's S3 requests (S3Backend.watch_requests):
    control requests arm it (so a store that never answers one is a stall at
    --stall-timeout, the run's one line), and every answer ticks it. The process that prepares a run has none: its control
    requests get the short 'control' client instead (S3Backend._control)."""
    _WATCH.clear()
    _WATCH[pid] = watch


def request_watch() -> RequestWatch | None:
    """This process's stall watch, or None (none made here: a parent, a library caller)."""
    return _WATCH.get(os.getpid())


def watched(what: str) -> AbstractContextManager[None]:
    """Arms this process's stall watch (if any) for one request, named `what`."""
    watch = request_watch()
    return (watch.request(f"a request to the storage ({what})") if watch is not None
            else contextlib.nullcontext())


def _answered(response: Any = None, **_: Any) -> None:
    """needs-retry (after every attempt): an answer, whatever it said, is the store alive."""
    if response is not None and (watch := request_watch()) is not None:
        watch.tick()


class S3Clients:
    """This process's session and clients for one backend: 'main' (the configured retries
    and timeouts), 'quick' (probing the target and cleaning up: bounded even when the
    endpoint stops answering), 'last' (cleanup after it did) or 'control' (the control
    requests of a process with no stall watch that prepared a run). The connection pool is
    sized for `io_threads` runner threads each with `concurrency` requests in flight
    (and a restore's small GETs beside them)."""

    def __init__(self, options: S3Options, io_threads: int, in_flight: int) -> None:
        self.options = options
        self.io_threads = max(1, io_threads)
        self.in_flight = in_flight
        self._state: ProcessState | None = None
        self.resolved: Resolved | None = None

    def proc(self) -> ProcessState:
        state = self._state
        if state is None or state.pid != os.getpid():
            with _STATE_LOCK:
                state = self._state
                if state is None or state.pid != os.getpid():
                    state = self._state = ProcessState()
        return state

    def session(self) -> Any:
        proc = self.proc()
        if proc.session is None:
            import boto3

            with proc.lock:
                if proc.session is None:
                    proc.session = boto3.session.Session()
        return proc.session

    def resolve(self) -> Resolved:
        if self.resolved is None:
            session = self.session()
            region = session.region_name or "us-east-1"  # no IMDS region lookup
            with self.proc().lock:  # a boto3 session makes clients one at a time
                probe = session.client("s3", endpoint_url=self.options.endpoint_url,
                                       region_name=region)
            endpoint = probe.meta.endpoint_url
            self.resolved = Resolved(endpoint, region, "auto" if is_aws(endpoint) else "path")
        return self.resolved

    def read_timeout(self, kind: str) -> float:
        """The read timeout of the `kind` client (what a timed-out request waited)."""
        o = self.options
        return min(SHORT_CLIENTS.get(kind, (0.0, o.read_timeout, 0))[1], float(o.read_timeout))

    def client(self, kind: str = "main") -> Any:
        proc = self.proc()
        client = proc.clients.get(kind)
        if client is None:
            r = self.resolve()
            session = self.session()
            with proc.lock:
                client = proc.clients.get(kind)
                if client is None:
                    client = proc.clients[kind] = self._make(kind, proc, session, r)
        return client

    def _make(self, kind: str, proc: ProcessState, session: Any, r: Resolved) -> Any:
        from botocore.config import Config

        o = self.options
        connect, read, attempts = SHORT_CLIENTS.get(
            kind, (float(o.connect_timeout), float(o.read_timeout), o.max_attempts))
        connect, read = min(connect, float(o.connect_timeout)), min(read, float(o.read_timeout))
        if kind in SENDS_BODIES:
            connect = send_timeout(connect, read)
        s3cfg: dict[str, Any] = {"addressing_style": r.addressing_style}
        if o.payload_signing != "auto":
            s3cfg["payload_signing_enabled"] = o.payload_signing == "on"
        config = Config(
            # Every GET a restore's read-ahead runs at once, small ones included
            # (readahead.Lane): a smaller pool opened a connection per small GET over it
            # and dropped it after ("Connection pool is full, discarding connection").
            max_pool_connections=self.in_flight * self.io_threads * (1 + SMALL_PER_LARGE) + 4,
            # A fixed User-Agent: botocore otherwise rebuilds and sanitizes its own, character
            # by character, on every request; and no parameter validation (ckptbench builds
            # every request itself). With parts sent inline (_submit), ckptbench's CPU per GB
            # saved fell from 0.69 to 0.65 s here (docs/s3.md): CPU a small server gets back.
            user_agent=user_agent(),
            parameter_validation=False,
            connect_timeout=connect,
            read_timeout=read,
            # total_max_attempts counts the first try; botocore's max_attempts counts retries.
            retries={"mode": "standard", "total_max_attempts": min(attempts, o.max_attempts)},
            request_checksum_calculation=o.checksum,
            response_checksum_validation=o.checksum,
            s3=s3cfg,
        )
        client = session.client("s3", endpoint_url=o.endpoint_url, region_name=r.region,
                                config=config)
        events = client.meta.events
        sign_in_python(events)
        events.register("needs-retry.s3", note_retry_reason)
        events.register("needs-retry.s3", _answered)

        def created(request: Any, **_: Any) -> None:
            if count_attempt(proc.count_each, request) in ("connection", "throttle"):
                proc.window.congested()
                proc.window.rejoin()  # this retry waits for a place in the narrowed window
        events.register("request-created.s3", created)
        return client


def send_timeout(connect: float, read: float) -> float:
    """botocore's connect timeout for the client that moves the data. urllib3 applies it to
    the TCP connect *and to sending the request* (urllib3 issue #857), and Python bounds a
    sendall() as a whole: a part's body sent as one bytearray had 5 s to reach the server.
    On a loaded 2-core host 32 parts of 64 MiB shared 30-80 MB/s, so nearly every part was
    aborted ("Connection aborted: timed out", which botocore calls ConnectionClosedError)
    and sent again from its first byte: 138-307 retries per 8-rank save, and saves that
    stalled (benchmarks/results/2026-12-s3-under-load.md). So the body gets the read
    timeout, as the answer does, per 1 MiB send (writer.request_body); the target's probe
    and the cleanup calls (no large bodies) keep their short connect."""
    return max(connect, read)


PY_SIGV4 = "ckptbench-s3v4"  # botocore's own S3 SigV4 signer, under a name of ours


def sign_in_python(events: Any) -> None:
    """Sign with botocore's own SigV4 (hashlib) even where awscrt is installed. botocore
    then signs through the CRT's signer, which reads every signed body back through
    Python stream callbacks: saving took 2.5-2.6 CPU s/GB with it against 1.6-1.7
    without (docs/s3.md); the requests and signatures are the same either way."""
    import botocore.auth
    from botocore.compat import HAS_CRT

    if not HAS_CRT:
        return
    botocore.auth.AUTH_TYPE_MAPS.setdefault(PY_SIGV4, botocore.auth.S3SigV4Auth)
    events.register_first("choose-signer.s3", _choose_python_signer)


def _choose_python_signer(signature_version: Any, context: Any, signing_name: str,
                          **kwargs: Any) -> Any:
    """botocore's choice of signer (it runs first, and the first answer wins), with its
    S3 SigV4 signer taken from botocore.auth rather than botocore.crt.auth."""
    from botocore.handlers import set_operation_specific_signer

    chosen = set_operation_specific_signer(context=context, signing_name=signing_name,
                                           **kwargs) or signature_version
    return PY_SIGV4 if chosen == "s3v4" else chosen
