"""A fault-injecting HTTP proxy in front of a real S3 endpoint: real retries against the
real server behind it (503 SlowDown, 500, a reset connection, a cut-off body, a server
that freezes at a chosen request), chosen per request, everything else forwarded
unchanged."""

from __future__ import annotations

import http.client
import select
import socket
import struct
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from harness.minio import Loopback

_ERRORS = {
    "503": (503, "Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
}
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade", "expect"}
FAULTS = ("503", "500", "reset", "truncate", "freeze", "pause", "slow", "stall")
BODY_FAULTS = ("pause", "slow", "stall")  # taken before the body is read (the others after)
PAUSE_S = 3.0  # how long a "pause" stops reading a request's body
PAUSE_AFTER = 1 << 20  # ... after its first MiB
SLOW_RATE = 4 << 20  # bytes per second a "slow" request's body is read at
STALL_S = 20.0  # the longest a "stall" stops sending a body to the server


class FaultProxy(Loopback):
    """A tiny HTTP/1.1 proxy on 127.0.0.1 in front of an S3 endpoint.

    Requests that `match(method, path)` consume the queued `faults` one each, in order:
    ``"503"`` answers SlowDown, ``"500"`` InternalError, ``"reset"`` reads the request and
    resets the connection without an answer, ``"truncate"`` forwards, then sends half the
    response body and resets, ``"freeze"`` stops answering from that request on: it and
    every later one (new connections are still accepted, as a SIGSTOPped server's kernel
    does) wait unanswered until :meth:`thaw`, then are reset, never forwarded. Unlike a
    SIGSTOP, nothing sent while frozen reaches the server later, so what the server holds
    is fixed at the freeze. ``"pause"`` stops reading the request's body for PAUSE_S after
    its first MiB (a server short of CPU), then forwards it; ``"slow"`` reads the body at
    SLOW_RATE (a slow link), then forwards it. ``"stall"`` streams the body to the server, stops
    sending after its first MiB (the whole body is still read from the client, so no client
    timeout takes part) until the server answers or closes the connection (its own idle
    timeout), or `stall_s` passes: then it sends the rest, and the server's answer goes back
    to the client; a connection the server dropped is reset to the client. `stalls` says
    how each stall ended: ``"answered <status>"``, ``"closed"`` or ``"resumed"``. Everything else is forwarded unchanged (the Host header is
    kept, so SigV4 signatures stay valid). `injected` lists what was done to which request.

    `hold_s`: each matching request waits that long before its fault or its forwarding (a
    slow endpoint: a client's requests are all in flight before the first fault), and
    `peak` is the most matching requests in the proxy at once among those that came once
    the faults were spent: how many a client sends again at once while it retries.
    """

    def __init__(self, upstream: str, faults: list[str] | None = None,
                 match: Callable[[str, str], bool] | None = None, hold_s: float = 0.0,
                 stall_s: float = STALL_S) -> None:
        unknown = sorted(set(faults or []) - set(FAULTS))
        if unknown:
            raise ValueError(f"FaultProxy faults {unknown}: allowed are {', '.join(FAULTS)}")
        up = urlsplit(upstream)
        self.upstream = (up.hostname or "127.0.0.1", up.port or 80)
        self.faults = list(faults or [])
        self.match = match or (lambda method, path: True)
        self.injected: list[tuple[str, str, str]] = []
        self.user_agents: list[str] = []  # of every request, in order
        self.forwarded = 0
        self.hold_s = hold_s
        self.stall_s = stall_s
        self.stalls: list[str] = []
        self.active = 0  # matching requests being forwarded now
        self.peak = 0
        self.frozen = threading.Event()
        self.thawed = threading.Event()
        self.lock = threading.Lock()
        self.server = _ProxyServer(self)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def body_fault(self, method: str, path: str) -> str | None:
        """The fault at the head of the queue if it acts on reading the body (BODY_FAULTS)."""
        with self.lock:
            if not (self.faults and self.faults[0] in BODY_FAULTS and self.match(method, path)):
                return None
            fault = self.faults.pop(0)
            self.injected.append((fault, method, path))
            return fault

    def next_fault(self, method: str, path: str, user_agent: str,
                   taken: str | None = None) -> str | None:
        """Record the request; the fault it gets, if any (`taken`: its body fault)."""
        with self.lock:
            self.user_agents.append(user_agent)
            if taken is not None:
                return taken
            if not (self.faults and self.match(method, path)):
                return None
            fault = self.faults.pop(0)
            self.injected.append((fault, method, path))
            return fault

    def hold(self, method: str, path: str, faulted: bool) -> bool:
        """A matching request waits `hold_s`; whether it counts in `peak` (one that got no
        fault: the faults are spent; call `release` once it is answered)."""
        if not self.match(method, path):
            return False
        counted = not faulted
        with self.lock:
            if counted:
                self.active += 1
                self.peak = max(self.peak, self.active)
        if self.hold_s:
            self.thawed.wait(self.hold_s)
        return counted

    def release(self) -> None:
        with self.lock:
            self.active -= 1

    def thaw(self) -> None:
        """Reset every request held since the freeze (none of them reaches the server)."""
        self.thawed.set()

    def hold_if_frozen(self) -> bool:
        """While frozen, wait for the thaw; whether the request is to be reset."""
        if not self.frozen.is_set():
            return False
        self.thawed.wait()
        return True

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.thaw()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, proxy: FaultProxy) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.proxy = proxy


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle_one_request(self) -> None:
        """The base's, for every method, and a client that went away ends the connection."""
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

    def _body(self, fault: str | None) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        if fault == "slow":
            got = bytearray()
            while len(got) < n:  # a tenth of a second's worth at a time
                got += self.rfile.read(min(SLOW_RATE // 10, n - len(got)))
                self.server.proxy.thawed.wait(0.1)
            return bytes(got)
        if fault != "pause" or n <= PAUSE_AFTER:
            return self.rfile.read(n) if n else b""
        head = self.rfile.read(PAUSE_AFTER)
        self.server.proxy.thawed.wait(PAUSE_S)  # the client's sends block meanwhile
        return head + self.rfile.read(n - PAUSE_AFTER)

    def _reset(self) -> None:
        """Close with RST (SO_LINGER 0), as a crashed server or a middlebox would."""
        self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def _error(self, fault: str) -> None:
        status, reason, code, message = _ERRORS[fault]
        xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
               f"<Message>{message}</Message></Error>").encode()
        self.send_response_only(status, reason)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(xml) if self.command != "HEAD" else 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(xml)

    def _proxy(self) -> None:
        proxy = self.server.proxy
        taken = proxy.body_fault(self.command, self.path)
        if taken == "stall":
            proxy.next_fault(self.command, self.path, self.headers.get("User-Agent", ""), taken)
            self._stall()
            return
        body = self._body(taken)
        fault = proxy.next_fault(self.command, self.path, self.headers.get("User-Agent", ""),
                                 taken)
        counted = proxy.hold(self.command, self.path, faulted=fault is not None)
        try:
            self._answer(body, fault)
        finally:
            if counted:
                proxy.release()

    def _answer(self, body: bytes, fault: str | None) -> None:
        proxy = self.server.proxy
        if fault is not None and fault in _ERRORS:
            self._error(fault)
            return
        if fault == "freeze":
            proxy.frozen.set()
        if fault == "reset" or proxy.hold_if_frozen():
            self._reset()
            return
        conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
        try:
            conn.request(self.command, self.path, body=body or None, headers=self._headers())
            resp = conn.getresponse()
            data = resp.read()
            with proxy.lock:
                proxy.forwarded += 1
            if proxy.hold_if_frozen():  # answered after the freeze: never seen by the client
                self._reset()
                return
            self._relay(resp, data, fault)
        finally:
            conn.close()

    def _headers(self) -> dict[str, str]:
        """The request's headers to forward (the Host kept: SigV4 signatures stay valid)."""
        return {k: v for k, v in self.headers.items() if k.lower() not in _HOP}

    def _stall(self) -> None:
        """The "stall" fault (see FaultProxy): the server sees a body that stops moving."""
        proxy = self.server.proxy
        n = int(self.headers.get("Content-Length") or 0)
        conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self._headers().items():
                conn.putheader(k, v)
            conn.endheaders()
            head = self.rfile.read(min(PAUSE_AFTER, n))
            conn.send(head)
            rest = self.rfile.read(n - len(head))  # the client has sent all of it
            assert conn.sock is not None
            answered, _, _ = select.select([conn.sock], [], [], proxy.stall_s)
            if not answered:
                conn.send(rest)
            resp = conn.getresponse()
            data = resp.read()
        except (http.client.HTTPException, OSError):
            with proxy.lock:
                proxy.stalls.append("closed")
            self._reset()
            return
        finally:
            conn.close()
        with proxy.lock:
            proxy.stalls.append(f"answered {resp.status}" if answered else "resumed")
            proxy.forwarded += 1
        self._relay(resp, data, None)

    def _relay(self, resp: http.client.HTTPResponse, data: bytes, fault: str | None) -> None:
        """Send the server's answer (`data`: its body) back to the client."""
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
