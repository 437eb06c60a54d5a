"""Stopping a run on a signal: SIGTERM and SIGHUP are handled like SIGINT.

`timeout`, systemd and Slurm stop a job with SIGTERM (to the whole process group), a closed
terminal sends SIGHUP. Either one, like Ctrl-C, raises :class:`Interrupted` in the main
thread: the run stops its ranks, removes what it wrote and the CLI exits with one line
and status 128 + the signal. Later signals are ignored while that cleanup runs (a second
Ctrl-C would leave debris behind). The ranks themselves keep the default action, so a
signal to the process group ends them at once; the parent cleans up after them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
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
