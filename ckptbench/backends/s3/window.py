"""How many requests one process keeps in flight to an endpoint that is struggling.

A loaded endpoint (a MinIO on a busy 2-core machine) answers too many concurrent parts by
closing connections or with SlowDown; botocore's retries back off per request, but every
other part keeps pushing. So the process's window of parts in flight halves on each
retried connection loss or throttle and grows back by about one part per window of
parts stored (additive increase, multiplicative decrease, as TCP does), up to what the
options allow. Only this process's threads wait on it: a plain threading lock. Saves
(each part) and restores (each ranged GET, its body read included) take a place in it.

A request botocore retries keeps its thread inside the call, and so inside its place: a
window that only gated new requests would leave every request already in flight retrying
at once, however narrow the window had become. So each retry after a lost connection or
a throttle gives its place back and waits for one under the narrowed window (`rejoin`,
from botocore's request-created event). Without that, an 8-rank save on a loaded 2-core
MinIO kept 32 parts of 64 MiB in flight through every retry: none arrived within MinIO's
30 s per request (its ReadTimeout/WriteTimeout), each was cut and sent again, and no part
completed for the 120 s of the stall timeout (benchmarks/results/2026-12-s3-under-load.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from ckptbench.backends.s3.errors import backoff, is_connection_error

LOST_ROUNDS = 2  # a request sent again after botocore's every attempt lost its connection
T = TypeVar("T")


class Window:
    """Parts in flight in this process: unlimited (the options' bound applies) until the
    endpoint pushes back."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._limit: float | None = None
        self._in_flight = 0
        self._held = threading.local()  # places this thread holds (slot() may nest)
        self.peak = 0  # the most parts in flight at once: where growth stops limiting

    @property
    def limit(self) -> float | None:
        return self._limit

    def congested(self) -> None:
        """A connection lost or a throttle: half the parts in flight (at least one)."""
        with self._cond:
            base = self._limit if self._limit is not None else max(self._in_flight, 1)
            self._limit = max(1.0, base / 2)

    def _enter(self) -> None:
        """Take a place once the window has one (called under the condition)."""
        while self._limit is not None and self._in_flight >= int(self._limit):
            self._cond.wait(1.0)
        self._in_flight += 1
        self.peak = max(self.peak, self._in_flight)

    def rejoin(self) -> None:
        """A retry of a request this thread sends in a place: the place is given back and
        taken again once the (narrowed) window has room; a thread holding none goes on."""
        if not getattr(self._held, "n", 0):
            return
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()
            self._enter()

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        with self._cond:
            self._enter()
        self._held.n = getattr(self._held, "n", 0) + 1
        ok = False
        try:
            yield
            ok = True
        finally:
            self._held.n -= 1
            with self._cond:
                self._in_flight -= 1
                if ok and self._limit is not None:
                    self._limit += 1 / self._limit
                    if self._limit > self.peak:
                        self._limit = None  # back to the options' bound
                self._cond.notify_all()


def backing_off(window: Window, send: Callable[[], T], attempts: int,
                give_up: Callable[[], bool] = lambda: False) -> T:
    """`send()` in a place of `window`. A request whose every attempt (`attempts`, botocore's)
    lost its connection is sent again, LOST_ROUNDS times at most, after a longer backoff
    and with the window halved (unless `give_up()`: the caller no longer needs it)."""
    for round_ in range(LOST_ROUNDS + 1):
        try:
            with window.slot():
                return send()
        except Exception as exc:
            if round_ == LOST_ROUNDS or not is_connection_error(exc) or give_up():
                raise
            window.congested()
            backoff(attempts + round_)
    raise AssertionError("unreachable")
