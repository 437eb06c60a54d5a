"""Stalled MPI ranks: watched from outside, reported through MPI process 0.

Under the local launcher a parent watches every rank (runner.watch_ranks) and writes the
error record. Under mpirun/srun there is no parent of ours, and MPI cannot carry the news:
the peers of a stalled rank sit in a collective waiting for it, only the main thread may
call MPI (funneled), and a stopped rank (SIGSTOP, a frozen cgroup) runs no code at all. So:

* process 0 listens on a TCP socket of its own (`Inbox`) for one stall notice (who
  stalled, the one line, the thread dump), writes the error record, prints the line and
  exits, which makes mpirun/srun end the job (bounded: no collective is waited on);
* each rank's own stall watch (runner.stall) sends its notice there (`notify`);
* each rank starts a guard process (`start_guard`, ``python -m
  ckptbench.runner.watch_mpi``) that reads the rank's bytes moved and what it is watched
  for from a shared page (`Board`), and its process state, with the local launcher's
  rules (runner.watch_ranks.RankWatch); on a stall it asks the rank for its thread dump
  (answered from C by a rank that still runs, none by a stopped one) and sends the notice.
  The guard dies with its rank.

A notice carries a token process 0 broadcast, so nothing else on the network ends a run.
Where process 0 cannot be reached (or is the stalled one, stopped) the sender prints the
line itself and ends its rank, which ends the job; the record is then not written.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from ckptbench.records import ErrorRecord, JsonlSink
from ckptbench.runner.launch_local import die_with_parent
from ckptbench.runner.stall import StallWatch, with_threads
from ckptbench.runner.thread_dump import DumpFile
from ckptbench.runner.watch_ranks import RankWatch

WHAT_BYTES = 128
NOTICE_BYTES = 4 << 20  # a notice is the line and a thread dump (DUMP_BYTES): bounded
ACK_WAIT_S = 10.0  # how long a sender waits for process 0 to have recorded its notice
Address = tuple[str, int, str]  # host, port, token


class Board:
    """A rank's bytes moved and what its watch is armed for, in a page its guard reads
    (an unlinked file: nothing to delete)."""

    def __init__(self, fd: int | None = None) -> None:
        if fd is None:
            # held for the run's length: not a with-block's file
            self._file: Any = tempfile.TemporaryFile(prefix="ckptbench-board-")  # noqa: SIM115
            self._file.truncate(mmap.PAGESIZE)
            fd = self._file.fileno()
        self.fd = fd
        self._map = mmap.mmap(fd, mmap.PAGESIZE)
        self._moved = 0

    def tick(self, n: int) -> None:
        self._moved += n
        struct.pack_into("q", self._map, 0, self._moved)

    def publish(self, what: str | None) -> None:
        self._map[8:8 + WHAT_BYTES] = (what or "").encode()[:WHAT_BYTES - 1].ljust(WHAT_BYTES,
                                                                                  b"\0")

    def moved(self) -> int:
        return int(struct.unpack_from("q", self._map, 0)[0])

    def watched_for(self) -> str:
        return bytes(self._map[8:8 + WHAT_BYTES]).split(b"\0", 1)[0].decode(errors="replace")


class Inbox:
    """Process 0's: the first stall notice is recorded to `sink`, printed, and ends this
    process (and so the job)."""

    def __init__(self, sink: JsonlSink | None) -> None:
        self.sink = sink
        self.token = secrets.token_hex(16)
        self._server = socket.create_server(("", 0))
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, name="ckptbench-stall-inbox", daemon=True).start()

    @property
    def address(self) -> Address:
        return socket.gethostname(), self._server.getsockname()[1], self.token

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(ACK_WAIT_S)
            data = b""
            try:
                while not data.endswith(b"\n") and len(data) < NOTICE_BYTES:
                    chunk = conn.recv(1 << 16)
                    if not chunk:
                        break
                    data += chunk
                notice = json.loads(data)
            except (OSError, ValueError):
                return
            if not isinstance(notice, dict) or notice.get("token") != self.token:
                return
            self.record(str(notice.get("message")), notice.get("threads") or None,
                        lambda: conn.sendall(b"ok\n"))

    def record(self, message: str, threads: str | None,
               acknowledge: Callable[[], None] = lambda: None) -> None:
        """Record and print the stall, then end this process (once, whoever asks)."""
        with self._lock:
            if self.sink is not None:
                self.sink.write(ErrorRecord(0, "run", "stall", message, threads=threads))
                self.sink.flush()
            _say(message)
            with contextlib.suppress(OSError):
                acknowledge()
            os._exit(1)

    def close(self) -> None:
        self._server.close()


def _say(message: str) -> None:
    sys.stderr.write(f"ckptbench: error: {message}\n")
    sys.stderr.flush()


def notify(address: Address, message: str, threads: str) -> bool:
    """Send a stall notice to process 0; True once it was recorded there."""
    host, port, token = address
    body = json.dumps({"token": token, "message": message, "threads": threads}) + "\n"
    try:
        with socket.create_connection((host, port), timeout=ACK_WAIT_S) as conn:
            conn.settimeout(ACK_WAIT_S)
            conn.sendall(body.encode(errors="replace"))
            return conn.recv(16).startswith(b"ok")
    except OSError:
        return False


def report_or_exit(address: Address | None, message: str, threads: str,
                   stalled: int | None = None) -> None:
    """A rank's (or its guard's) stall: to process 0, or printed here when it cannot be
    reached; then this process (and the `stalled` one: its guard's) ends, ending the job."""
    if address is not None and notify(address, message, threads):
        # process 0 is ending the job: ending here first would race it (mpirun would stop
        # it with SIGTERM, a second line); this is only the backstop
        time.sleep(ACK_WAIT_S)
    else:
        _say(message)
    if stalled is not None:
        os.kill(stalled, signal.SIGKILL)
    os._exit(1)


def watch_this_rank(timeout: float, address: Address | None, who: str
                    ) -> tuple[StallWatch, Callable[[int], None], subprocess.Popen[bytes] | None]:
    """This rank's stall watch, what counts its bytes moved, and its guard process (stop
    it with `stop_guard`). With --stall-timeout off nothing is made: no board, no dump
    file, no signal handler, no guard."""
    if timeout <= 0:
        return StallWatch(0, lambda _message: None, who), lambda _n: None, None
    board, dump = Board(), DumpFile()
    dump.arm()  # the guard may ask for the dump

    def stalled(message: str) -> None:
        """A rank that sees its own stall sends it, with its thread dump, to process 0,
        which records it and ends the job; only the main thread may call MPI."""
        report_or_exit(address, message, dump.read())

    watch = StallWatch(timeout, stalled, who, board.publish, dump.write)
    return watch, board.tick, start_guard(board, dump, address, timeout, who)


def start_guard(board: Board, dump: DumpFile, address: Address | None, timeout: float,
                who: str) -> subprocess.Popen[bytes]:
    """The guard of this rank: a process that dies with it."""
    host, port, token = address or ("", 0, "")
    return subprocess.Popen(
        [sys.executable, "-m", "ckptbench.runner.watch_mpi", str(os.getpid()), str(board.fd),
         str(dump.fileno()), repr(timeout), who, host, str(port), token],
        pass_fds=(board.fd, dump.fileno()), stdin=subprocess.DEVNULL, close_fds=True)


def stop_guard(guard: subprocess.Popen[bytes] | None) -> None:
    if guard is not None:
        guard.kill()
        guard.wait()


def _guard(argv: list[str]) -> None:
    pid, board_fd, dump_fd, timeout, who, host, port, token = argv
    rank = int(pid)
    die_with_parent(rank)
    board, dump = Board(int(board_fd)), DumpFile(int(dump_fd))
    watch = RankWatch([rank], [0], float(timeout), names=[who])
    address = (host, int(port), token) if host else None
    while True:
        time.sleep(min(1.0, float(timeout) / 4))
        found = watch.check([board.moved()], lambda _i: board.watched_for())
        if found is not None:
            threads = dump.request(rank)
            report_or_exit(address, with_threads(found[1], threads), threads, stalled=rank)


if __name__ == "__main__":
    _guard(sys.argv[1:])
