"""What a stalled process was waiting on: every thread's stack, and a one-line summary.

"rank 7 stalled: no byte moved for 120 s" leaves the user to guess whether the rank sat
in a storage call that never returned, a lock, a retry's backoff or its own bookkeeping.
So a stall names, per thread, the innermost frame of the run's own code and the call it
was in (in its one line), and the whole dump goes to the error record.

Two ways to get it: a process that sees its own stall (runner.stall) dumps its threads
through faulthandler and names them from threading; the local launcher's parent, which also sees stalls the rank
cannot (runner.watch_ranks), asks the rank with DUMP_SIGNAL, answered by faulthandler from
C (no Python code of the rank's has to run, a thread holding the GIL does not stop it)
into a file the parent made and unlinked before the fork (`DumpFile`: nothing to delete).
Both write the same text format, which `summarize` reads.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass

DUMP_SIGNAL = signal.SIGUSR1
DUMP_WAIT_S = 2.0  # how long the parent waits for a signalled rank's dump
DUMP_BYTES = 256 * 1024  # at most this much of a dump is read back
SUMMARY_THREADS = 4  # threads named in the one-line summary (the dump has them all)
_HEADER = re.compile(r"^(?:Current thread|Thread) (.+?) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_LIBRARY = tuple(p for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib",
                                                                     "purelib", "platlib")}
                 if p)
_OWN = ("runner/stall.py", "runner/thread_dump.py")  # the watch itself: never the answer


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    func: str

    @property
    def library(self) -> bool:
        """Python's own or an installed package's (botocore, urllib3): not the run's code."""
        return self.path.startswith(_LIBRARY) or self.path.startswith("<")

    def __str__(self) -> str:
        return f"{self.func} ({_short(self.path)}:{self.line})"


def _short(path: str) -> str:
    for marker in ("/ckptbench/", "/site-packages/", "/tests/"):
        if marker in path:
            return marker.strip("/") + "/" + path.split(marker, 1)[1]
    return os.path.basename(path)


def format_threads() -> str:
    """Every thread of this process, innermost frame first (faulthandler's text), each
    thread named where threading knows it."""
    with tempfile.TemporaryFile() as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        text = f.read(DUMP_BYTES).decode(errors="replace")
    for t in threading.enumerate():
        if t.ident is not None:
            text = text.replace(f"hread 0x{t.ident:016x} (", f"hread {t.name} (")
    return text


def parse(dump: str) -> list[tuple[str, list[Frame]]]:
    """(thread, frames innermost first) for each thread of a dump."""
    threads: list[tuple[str, list[Frame]]] = []
    for line in dump.splitlines():
        head = _HEADER.match(line)
        if head:
            threads.append((head.group(1), []))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1][1].append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    return threads


def summarize(dump: str, first: str = "MainThread") -> str:
    """One line: for each thread running the run's code (idle pool threads and the watch
    itself left out), where in that code it was and the call it was waiting in. `first`
    (the thread that was watched) leads, so that other threads cannot crowd it out."""
    parts = []
    for name, frames in sorted(parse(dump), key=lambda thread: thread[0] != first):
        own = next((f for f in frames if not f.library), None)
        if own is None or own.path.endswith(_OWN):
            continue
        inner = frames[0]
        parts.append(f"{name} in {own}" + (f" waiting in {inner}" if inner != own else ""))
    if not parts:
        return "no thread of the run's code found in its thread dump"
    more = len(parts) - SUMMARY_THREADS
    shown = "; ".join(parts[:SUMMARY_THREADS])
    return shown + (f"; and {more} more thread(s) (the thread dump has them)" if more > 0 else "")


class DumpFile:
    """An unlinked file a rank dumps its threads into on DUMP_SIGNAL (made by the parent
    before the fork, so both hold it; it disappears with the last descriptor)."""

    def __init__(self, fd: int | None = None) -> None:
        """A new file, or the one open at `fd` (a guard process's: runner.watch_mpi)."""
        # held open for the run's length, closed by close(): not a with-block's file
        self._file = tempfile.TemporaryFile(prefix="ckptbench-threads-") \
            if fd is None else open(fd, "r+b", buffering=0, closefd=False)  # noqa: SIM115

    def fileno(self) -> int:
        return self._file.fileno()

    def arm(self) -> None:
        """In the rank: DUMP_SIGNAL writes every thread's stack here (from C)."""
        faulthandler.register(DUMP_SIGNAL, file=self.fileno(), all_threads=True,
                              chain=False)

    def write(self, text: str) -> None:
        """In the rank: its own dump (runner.stall's watchdog)."""
        os.write(self.fileno(), text.encode(errors="replace"))

    def read(self) -> str:
        return os.pread(self.fileno(), DUMP_BYTES, 0).decode(errors="replace")

    def request(self, pid: int) -> str:
        """In the parent: the rank's dump, asked for with DUMP_SIGNAL unless it already
        wrote one; '' when none came within DUMP_WAIT_S (a stopped process answers none)."""
        if self.read():
            return self.read()
        try:
            os.kill(pid, DUMP_SIGNAL)
        except OSError:
            return ""
        deadline, size, settled = time.monotonic() + DUMP_WAIT_S, 0, 0
        while time.monotonic() < deadline and settled < 3:
            time.sleep(0.05)
            now = len(self.read())
            settled = settled + 1 if now and now == size else 0
            size = now
        return self.read()

    def close(self) -> None:
        self._file.close()
