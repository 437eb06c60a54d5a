"""The local launcher's parent, watching its ranks from outside.

A rank watches its own bytes (runner.stall), but a rank that is stopped (SIGSTOP, a frozen
cgroup) or whose watchdog cannot run watches nothing: it stays alive, holds its peers in
their next gather, and the run hangs. So the parent watches too, through what the ranks
share without a lock: each rank's bytes moved and what it is watched for (empty while it
expects no bytes: computing, waiting for peers). A rank that expects bytes and moved none
for --stall-timeout, or that stays stopped that long whatever it was doing, has stalled.

And the parent reads what the ranks send it (records, errors) in a thread of its own: a
message half written by a rank that was killed (or stopped) mid-write blocks that read
for ever, and only the thread is left waiting.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckptbench.runner.stall import OVERSLEPT_S, stall_message

READ_TIMEOUT_S = 5.0  # how long the parent waits for the last messages of ended ranks
SELF_REPORT_S = 2.0  # how much longer than a running rank's own watch the parent waits


def stopped(pid: int) -> bool:
    """The process is stopped by a signal (state T in /proc; False where unknown)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


class RankWatch:
    """Checks, from the parent's loop, every rank's progress against `timeout` (0: off)."""

    def __init__(self, pids: list[int], ranks: list[int], timeout: float,
                 names: list[str] | None = None) -> None:
        """`names`: what the messages call each process ("rank N" by default)."""
        self.pids, self.ranks, self.timeout = pids, ranks, timeout
        self.names = names or [f"rank {r}" for r in ranks]
        now = time.monotonic()
        self._last = [-1] * len(pids)
        self._since = [now] * len(pids)
        self._stopped_since: list[float | None] = [None] * len(pids)
        self._checked = now

    def check(self, progress: Any, watched_for: Callable[[int], str]
              ) -> tuple[int, str] | None:
        """(index, message) of the first rank that stalled, or None."""
        if self.timeout <= 0:
            return None
        now = time.monotonic()
        if now - self._checked > OVERSLEPT_S:  # this process was stopped itself: resumed
            self._since = [now] * len(self.pids)
            self._stopped_since = [None] * len(self.pids)
        self._checked = now
        for i, pid in enumerate(self.pids):
            moved, what = progress[i], watched_for(i)
            if moved != self._last[i] or not what:
                self._last[i], self._since[i] = moved, now
            is_stopped = stopped(pid)
            if not is_stopped:
                self._stopped_since[i] = None
            elif self._stopped_since[i] is None:
                self._stopped_since[i] = now
            who = self.names[i]
            # a running rank's own watch reports first (its threads named): a moment's grace
            grace = 0.0 if is_stopped else SELF_REPORT_S
            if what and now - self._since[i] >= self.timeout + grace:
                why = " (its process is stopped: SIGSTOP?)" if is_stopped else ""
                return i, stall_message(who, self.timeout, what) + why
            since = self._stopped_since[i]
            if since is not None and now - since >= self.timeout:
                return i, (f"{who} stalled: its process was stopped (SIGSTOP?) for "
                           f"{self.timeout:g} s (--stall-timeout {self.timeout:g}s); the run "
                           "was stopped")
        return None


class Inbox:
    """Records and errors from the ranks, read by a daemon thread into this process."""

    def __init__(self, records: Any, errors: Any, start: bool = True) -> None:
        self._records_q, self._errors_q = records, errors
        self._records: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._errors: list[Any] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._read, name="ckptbench-inbox", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Start reading (after any fork: a forked child would inherit no thread)."""
        self._thread.start()

    def _read(self) -> None:
        while True:
            got = False
            try:
                self._records.put(self._records_q.get(timeout=0.05))
                got = True
            except queue.Empty:
                pass
            try:
                error = self._errors_q.get_nowait()
                with self._lock:
                    self._errors.append(error)
                got = True
            except queue.Empty:
                pass
            if self._closing.is_set() and not got:
                return

    def close(self) -> None:
        """Once the ranks have ended: read what they left, for READ_TIMEOUT_S at most."""
        self._closing.set()
        self._thread.join(READ_TIMEOUT_S)

    def take_records(self) -> list[Any]:
        out = []
        while True:
            try:
                out.append(self._records.get_nowait())
            except queue.Empty:
                return out

    def errors(self) -> list[Any]:
        with self._lock:
            return list(self._errors)
