"""Stopping a run on a signal: SIGTERM and SIGHUP are handled like SIGINT.

`timeout`, systemd and Slurm stop a job with SIGTERM (to the whole process group), a closed
terminal sends SIGHUP. Either one, like Ctrl-C, raises :class:`Interrupted` in the main
thread: the run stops its ranks, removes what it wrote and the CLI exits with one line
and status 128 + the signal. Later signals are ignored while that cleanup runs (a second
Ctrl-C would leave debris behind). The ranks themselves keep the default action, so a
signal to the process group ends them at once; the parent cleans up after them.

An MPI rank (mpirun, srun: `scancel`, a time limit) cannot clean up: its peers may be
gone or blocked in an MPI call, where no Python handler runs. It ends at once instead,
and MPI rank 0 first writes one line saying so (:func:`exit_on_signals`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (a KeyboardInterrupt: every path that stops on
    Ctrl-C stops on it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def signal_name(exc: BaseException) -> str:
    """The signal an interrupt came from (a bare KeyboardInterrupt: SIGINT)."""
    return exc.name if isinstance(exc, Interrupted) else "SIGINT"


def exit_status(exc: BaseException) -> int:
    return 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals(enabled: bool = True) -> Iterator[None]:
    """Within the block, the first of SIGINT, SIGTERM, SIGHUP raises Interrupted; the next
    ones are ignored. A signal that was ignored (nohup) or has a handler of someone else's
    stays as it was; outside the main thread nothing changes."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if fired:
            return
        fired.append(signum)
        raise Interrupted(signum)

    previous = {}
    for sig in STOP_SIGNALS:
        current = signal.getsignal(sig)
        ours = current is signal.SIG_DFL or (sig == signal.SIGINT
                                             and current is signal.default_int_handler)
        if ours:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# What the MPI rank that ends on a signal writes first (set by the coordinator only).
_last_words: list[Callable[[str], str]] = []


def _end(signum: int) -> None:
    with contextlib.suppress(Exception):
        if _last_words:
            line = _last_words[-1](signal.Signals(signum).name)
            os.write(2, f"ckptbench: error: {line}\n".encode())
    os._exit(128 + signum)


def exit_on_signals() -> None:
    """This process (an MPI rank) ends at once on the first of SIGINT, SIGTERM, SIGHUP,
    with status 128 + the signal, after writing the line :func:`say_on_signal` set (if
    any), even while its main thread is blocked in an MPI call: the interpreter's C
    handler, in whichever thread the signal lands, writes the signal to a pipe that a
    thread of this module waits on. From the main thread only; a signal that is ignored
    (nohup) or handled by someone else stays as it was."""
    if threading.current_thread() is not threading.main_thread():
        return
    stops = [sig for sig in STOP_SIGNALS if signal.getsignal(sig) in (
        signal.SIG_DFL, signal.default_int_handler)]
    if not stops:
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for sig in stops:
        signal.signal(sig, lambda signum, frame: _end(signum))

    def wait() -> None:
        while True:
            got = os.read(read_fd, 1)
            if got and got[0] in stops:
                _end(got[0])

    threading.Thread(target=wait, name="ckptbench-stop-signals", daemon=True).start()


def say_on_signal(line: Callable[[str], str]) -> None:
    """The line (after 'ckptbench: error: ') that exit_on_signals writes, given the
    signal's name."""
    _last_words.append(line)
