"""The stall detector: a process whose I/O moved no byte for too long has failed.

Timeouts on each storage call bound one call, but not a run whose calls keep being
retried, nor a file system that stops answering (a hung NFS or FUSE mount, a frozen
object store behind a proxy that holds connections open). So every process watches
itself: while its format saves or restores (the only time it has bytes to move), each
block, chunk or part it moves resets a clock, and a watchdog thread that sees the clock
pass ``--stall-timeout`` ends the process through the launcher's ``on_stall`` (local
processes: report to the parent and exit; MPI ranks: report to MPI process 0, which
records it and ends the job: runner.watch_mpi). Waiting for the other processes (barriers, gathers) does not count as stalling:
a process that finished its share waits for the slowest one, which watches itself.

A process that is stopped (SIGSTOP, a frozen cgroup) cannot watch itself: its watchdog
stops with it. So the watch also publishes whether it expects bytes (`publish`: what is
watched, or None while disarmed or waiting for peers), and the local launcher's parent
watches those ranks' progress counters from outside (runner.launch_local; under MPI each
rank's guard process: runner.watch_mpi).

When it fires, the message names what each thread of the process was waiting on, and the
whole thread dump goes to `dump` (runner.thread_dump): a stall is a bug report, not a guess.

A format that cannot report bytes as they move (torch-dcp: one op per save) is not
watched; its storage calls' own timeouts still apply.

Requests outside the saves and restores (an object store's control requests: claiming a
checkpoint's prefix, committing its manifest, the intent) wait on the store too, with no
byte to count: a store that froze before answering one held the run for as long as the
client retried (six tries of 60 s on S3). So the driver hands a rank's watch to its
backend (`Backend.watch_requests`), and the S3 backend arms it for each control request
(`request`): no answer for `--stall-timeout` is a stall, the same one line. Those requests
are not published to the launcher (a store answering 503 now and then is answering; the
rank's own watch counts each answer as a tick), and a stopped rank is still caught by the
launcher's check of stopped processes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from ckptbench.formats.base import Group, T
from ckptbench.runner.thread_dump import format_threads, summarize

OnStall = Callable[[str], None]
Publish = Callable[["str | None"], None]
Dump = Callable[[str], None]
OVERSLEPT_S = 2.0  # a watchdog that woke this late was itself stopped: the clock restarts


def stall_message(who: str, timeout: float, what: str) -> str:
    return (f"{who} stalled: no byte moved for {timeout:g} s during {what} "
            f"(--stall-timeout {timeout:g}s); the storage stopped answering, or allow slower "
            "storage a larger --stall-timeout")


def with_threads(message: str, dump: str, watched: str = "MainThread") -> str:
    """The stall message and what the stalled process's threads were waiting on, the
    watched thread first."""
    return f"{message}; its threads: {summarize(dump, watched)}" if dump else message


class StallWatch:
    """Calls `on_stall(message)` once, from a watchdog thread, when the watch is armed and
    no tick came for `timeout` seconds; `timeout` 0 turns it off. The message names what
    the threads were waiting on; the whole thread dump goes to `dump` first."""

    def __init__(self, timeout: float, on_stall: OnStall, who: str = "this process",
                 publish: Publish | None = None, dump: Dump | None = None) -> None:
        self.timeout = timeout
        self.publish = publish
        self.dump = dump
        self.on_stall = on_stall
        self.who = who
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._what: str | None = None  # what is being watched; None: not armed
        self._watched = "MainThread"  # the thread that armed it: named first in a stall
        self._paused = 0
        self._requests = 0  # storage requests in flight outside a watched phase
        self._request_what = ""  # the first of them (what a stall names)
        self._request_since = 0.0  # when the first of them began
        self._thread: threading.Thread | None = None
        self.fired = False

    @property
    def enabled(self) -> bool:
        return self.timeout > 0

    def tick(self, _n: int = 0) -> None:
        """Bytes moved: the clock starts again."""
        self._last = time.monotonic()

    @contextlib.contextmanager
    def watching(self, what: str) -> Iterator[None]:
        """Armed for the duration: `what` ("the save of checkpoint-1") names it."""
        if not self.enabled:
            yield
            return
        with self._lock:
            self._what, self._last = what, time.monotonic()
            self._watched = threading.current_thread().name
            self._published()
            self._start()
        try:
            yield
        finally:
            with self._lock:
                self._what = None
                self._published()

    def _start(self) -> None:
        """The watchdog thread, once (called under the lock)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ckptbench-stall",
                                            daemon=True)
            self._thread.start()

    @contextlib.contextmanager
    def request(self, what: str) -> Iterator[None]:
        """Storage requests outside a watched phase (inside one, the phase's watch covers
        them): one control request, or a run of writes that are no phase (fill-ins).
        Armed until it returns, so a store that never answers is a stall after `timeout`
        (each tick, an answer included, restarts the clock; waiting for peers holds it).
        Not published: the launcher watches the phases' bytes only. Any thread; requests
        may overlap (the clock runs from the first one in flight, which `what` names)."""
        if not self.enabled or self.fired:
            yield
            return
        with self._lock:
            counted = self._what is None
            if counted:
                if not self._requests:
                    self._request_what, self._request_since = what, time.monotonic()
                    self._watched = threading.current_thread().name
                self._requests += 1
                self._start()
        try:
            yield
        finally:
            if counted:
                with self._lock:
                    self._requests -= 1

    def _published(self) -> None:
        """Tell the launcher whether bytes are expected now (called under the lock)."""
        if self.publish is not None:
            self.publish(self._what if not self._paused else None)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Waiting for other processes (not a stall of this one): the clock is held."""
        with self._lock:
            self._paused += 1
            self._published()
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1
                self._last = time.monotonic()
                self._published()

    def _run(self) -> None:
        period = min(1.0, self.timeout / 4)
        woke = time.monotonic()
        while not self.fired:
            time.sleep(period)
            with self._lock:
                slept, woke = time.monotonic() - woke, time.monotonic()
                if slept > period + OVERSLEPT_S:  # stopped with its process, now resumed
                    self._last = woke
                what = self._what
                idle = time.monotonic() - self._last
                stalled = what is not None and not self._paused and idle >= self.timeout
                if not stalled and self._requests and not self._paused and min(
                        idle, time.monotonic() - self._request_since) >= self.timeout:
                    stalled, what = True, self._request_what
            if stalled:
                # The threads as they stalled, taken before anything can see `fired` and
                # move on; `fired` once the stall is reported.
                threads = format_threads()
                try:
                    if self.dump is not None:
                        self.dump(threads)
                    self.on_stall(with_threads(stall_message(self.who, self.timeout,
                                                             str(what)),
                                               threads, self._watched))
                finally:
                    self.fired = True


class WatchedGroup:
    """A format's Group whose collectives hold the stall clock (waiting for peers)."""

    def __init__(self, group: Group, watch: StallWatch) -> None:
        self._group = group
        self._watch = watch
        self.rank: int = group.rank
        self.size: int = group.size

    def barrier(self) -> None:
        with self._watch.waiting():
            self._group.barrier()

    def gather(self, obj: T) -> list[T] | None:
        with self._watch.waiting():
            return self._group.gather(obj)

    def bcast(self, obj: T) -> T:
        with self._watch.waiting():
            return self._group.bcast(obj)

    def host(self) -> str:
        return self._group.host()

