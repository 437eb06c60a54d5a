"""Progress on stderr for the work a user waits for: phase, checkpoint i of N, bytes done
of the total, rate, ETA.

On a terminal a live line (rich, removed when the work ends); in a pipe or a log a plain
line every few seconds (``CKPTBENCH_PROGRESS_INTERVAL``, 5 s by default; 0 prints a line
at every change, for tests and slow logs), and none for work that ends sooner. Never on
stdout: ``--json`` and the tables keep stdout to themselves. ``CKPTBENCH_PROGRESS=off``
turns it off (``live`` or ``plain`` force one kind; ``auto``: live on a terminal).

It costs the measured phase nothing it can see: :meth:`Status.advance`, the only call made
while bytes move (and under the local launcher only in the parent process, which moves
none), adds to a counter under a lock; a thread of its own draws the line. The phase of a
run follows from the bytes done (the ranks save and restore behind barriers, in the order
of its segments), so the ranks tell nothing more than the bytes they already count.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO, TypeVar, cast

from ckptbench.errors import SpecError

ENV_MODE = "CKPTBENCH_PROGRESS"
ENV_INTERVAL = "CKPTBENCH_PROGRESS_INTERVAL"
MODES = ("auto", "live", "plain", "off")
DEFAULT_INTERVAL_S = 5.0
TICK_S = 0.1  # how often the thread looks; a plain line waits for the interval
RATE_WINDOW_S = 10.0  # the rate is the bytes of the last seconds, not since the start
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Settings:
    """How progress is shown: `mode` (auto, live, plain, off), plain lines' `interval`."""

    mode: str = "auto"
    interval: float = DEFAULT_INTERVAL_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """From CKPTBENCH_PROGRESS and CKPTBENCH_PROGRESS_INTERVAL; a bad value is one line
        naming the variable and what is allowed."""
        env = os.environ if env is None else env
        mode = env.get(ENV_MODE, "auto").strip().lower() or "auto"
        if mode in ("0", "no", "false", "none"):
            mode = "off"
        if mode not in MODES:
            raise SpecError(f"{ENV_MODE}={env.get(ENV_MODE)!r}: allowed: {', '.join(MODES)}")
        text = env.get(ENV_INTERVAL, "").strip().lower().removesuffix("s")
        try:
            interval = float(text) if text else DEFAULT_INTERVAL_S
        except ValueError:
            interval = -1.0
        if not 0 <= interval <= 86400:
            raise SpecError(f"{ENV_INTERVAL}={env.get(ENV_INTERVAL)!r}: allowed: seconds "
                            "between plain progress lines, 0 to 86400 (0: at every change)")
        return cls(mode, interval)


@dataclass(frozen=True)
class Segment:
    """One stretch of a byte-moving command: `label` ("save checkpoint 1/3") and its bytes."""

    label: str
    total: int


def locate(segments: Sequence[Segment], done: int) -> tuple[int, int]:
    """(index of the segment `done` bytes are in, bytes done within it); at a boundary,
    the next segment at 0 (the last one stays at its end)."""
    if not segments:
        return 0, 0
    for i, s in enumerate(segments):
        if done < s.total or i == len(segments) - 1:
            return i, min(done, s.total) if i == len(segments) - 1 else done
        done -= s.total
    return len(segments) - 1, segments[-1].total  # pragma: no cover


def slowest_rank(names: Sequence[int], moved: Sequence[int], totals: Sequence[int]
                 ) -> str:
    """The rank furthest behind, by the share of its own bytes it has moved: `rank 3 at
    41%` (ranks hold different shares of a checkpoint, so bytes alone would mislead)."""
    shares = [(m / t if t else 1.0, r) for r, m, t in zip(names, moved, totals, strict=False)]
    if len(shares) < 2:
        return ""
    share, rank = min(shares)
    return f"rank {rank} at {100 * share:.0f}%" if share < 1 else ""


def size(n: float) -> str:
    """Binary units, three significant figures: 1.23 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TiB"  # pragma: no cover


def clock(seconds: float) -> str:
    """12 s, 3 min 05 s, 2 h 01 min."""
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def line(command: str, phase: str, elapsed: float, done: int = 0, total: int = 0,
         rate: float | None = None, of_phase: tuple[int, int] | None = None,
         slowest: str = "") -> str:
    """One plain progress line: `ckptbench run: save checkpoint 2/3: 12.0 MiB of 22.0 MiB
    (55%), 40.1 MiB/s, ETA 3 s; 91% of all; slowest: rank 3 at 88%; 9 s`."""
    parts = [f"ckptbench {command}: {phase}"]
    if total:
        shown_done, shown_total = of_phase or (done, total)
        pct = 100 * shown_done / shown_total if shown_total else 100.0
        parts.append(f": {size(shown_done)} of {size(shown_total)} ({pct:.0f}%)")
        parts.append(f", {size(rate)}/s" if rate else ", - B/s")
        if rate and done < total:
            parts.append(f", ETA {clock((total - done) / rate)}")
        if of_phase is not None:
            parts.append(f"; {100 * done / total:.0f}% of all")
    if slowest:
        parts.append(f"; slowest: {slowest}")
    parts.append(f"; {clock(elapsed)}")
    return "".join(parts)


class Status:
    """A command's progress on stderr, a context manager: `segments` for a command that
    moves bytes (advance() as they move), or phases set with phase()."""

    def __init__(self, command: str, segments: Sequence[Segment] = (), *,
                 enabled: bool = True, settings: Settings | None = None,
                 stream: TextIO | None = None) -> None:
        self.command = command
        self.segments = list(segments)
        self.total = sum(s.total for s in self.segments)
        self.settings = settings or Settings.from_env()
        self.stream = stream if stream is not None else sys.stderr
        self.kind = _kind(self.settings.mode, self.stream) if enabled else "off"
        self._lock = threading.Lock()
        self._draw = threading.Lock()
        self._done = 0
        self._phase = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.monotonic()
        self._samples: deque[tuple[float, int]] = deque()
        self._live: Any = None
        self._task: Any = None
        self._shown: tuple[str, int] | None = None
        self._index = -1  # the last segment a line was printed in (interval 0)
        self._last_line = 0.0
        self.printed = 0  # plain lines printed (a final one follows those)
        self.rank_names: list[int] = []  # per rank: its name and its bytes over the run
        self.rank_totals: list[int] = []
        self._ranks_moved: list[int] = []

    # --- called by the command (cheap) ---

    def advance(self, n: int) -> None:
        """Bytes moved (from any thread): a sum under a lock, nothing drawn here."""
        with self._lock:
            self._done += n

    def __call__(self, n: int) -> None:
        """The status is a launcher's progress callback: bytes moved."""
        self.advance(n)

    def ranks(self, moved: Sequence[int]) -> None:
        """Each rank's bytes moved so far (a launcher that sees them: local processes)."""
        self._ranks_moved = list(moved)

    def phase(self, label: str, at_once: bool = False) -> None:
        """A phase without bytes of its own ("building the plan"); with an interval of 0,
        or `at_once` (work known to take long: the user is told before it starts, not
        after the interval), its line is printed at once."""
        with self._lock:
            self._phase = label
        if self.kind == "plain" and self._thread is not None and (
                at_once or self.settings.interval == 0):
            with contextlib.suppress(OSError, ValueError), self._draw:
                self._draw_now(False, force=at_once)  # the interval counts from this line

    def note(self, text: str) -> None:
        """A line for the user on stderr that leaves the live line whole."""
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    # --- what is shown ---

    def _state(self, now: float
               ) -> tuple[str, int, float | None, tuple[int, int] | None, str, int]:
        """(phase, bytes done, rate over the last seconds, done/total of this segment, the
        slowest rank, the segment's index)."""
        with self._lock:
            done, phase = self._done, self._phase
        if not self.segments:
            return phase, 0, None, None, "", 0
        samples = self._samples
        if not samples or samples[-1][1] != done or now - samples[-1][0] > 1:
            samples.append((now, done))
        while len(samples) > 2 and now - samples[1][0] > RATE_WINDOW_S:
            samples.popleft()
        t0, d0 = samples[0]
        rate = (done - d0) / (now - t0) if now > t0 and done > d0 else None
        i, within = locate(self.segments, done)
        seg = self.segments[i]
        slowest = slowest_rank(self.rank_names, self._ranks_moved, self.rank_totals)
        return (self._label(phase, seg), done, rate,
                (within, seg.total) if len(self.segments) > 1 else None, slowest, i)

    @staticmethod
    def _label(phase: str, seg: Segment) -> str:
        return f"{phase}, {seg.label}" if phase else seg.label

    def _tick(self, final: bool = False) -> None:
        with self._draw:  # the thread, and phase() with an interval of 0
            self._draw_now(final)

    def _draw_now(self, final: bool, force: bool = False) -> None:
        now = time.monotonic()
        phase, done, rate, of_phase, slowest, index = self._state(now)
        elapsed = now - self._start
        if self.kind == "live":
            self._live.update(self._task, completed=done, description=phase + (
                f" (slowest: {slowest})" if slowest else ""))
            return
        interval = self.settings.interval
        changed = self._shown != (phase, done)
        due = force or (changed if interval == 0 else now - self._last_line >= interval
                        and elapsed >= interval)
        if interval == 0 and self.kind == "plain":
            self._skipped(index, elapsed, rate)
        if (due and phase) or (final and self.printed):
            self.stream.write(line(self.command, phase + (" (done)" if final else ""), elapsed,
                                   done, self.total, rate, of_phase, slowest) + "\n")
            self.stream.flush()
            self.printed += 1
            self._shown, self._last_line = (phase, done), now

    def _skipped(self, index: int, elapsed: float, rate: float | None) -> None:
        """At every change (interval 0), a segment that began and ended between two looks
        still gets its line, as done: a fast save is a change too."""
        with self._lock:
            phase = self._phase
        before = sum(s.total for s in self.segments[:self._index + 1])
        for seg in self.segments[self._index + 1:index]:
            before += seg.total
            self.stream.write(line(self.command, self._label(phase, seg) + " (done)", elapsed,
                                   before, self.total, rate, (seg.total, seg.total)) + "\n")
            self.printed += 1
        self._index = max(self._index, index)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self._tick()
            except (OSError, ValueError):  # stderr gone: the command goes on without it
                return

    def __enter__(self) -> Status:
        if self.kind == "off":
            return self
        self._start = time.monotonic()
        self._samples.append((self._start, 0))
        if self.kind == "live":
            self._live, self._task = _live(self.stream, bool(self.segments), self.total)
            self._live.start()
        self._thread = threading.Thread(target=self._run, name="ckptbench-progress",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        if self._live is not None:
            self._live.stop()
            self._live = None
        elif kind is None:
            with contextlib.suppress(OSError, ValueError):
                self._tick(final=True)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _kind(mode: str, stream: TextIO) -> str:
    if mode != "auto":
        return mode
    return "live" if _isatty(stream) and os.environ.get("TERM") != "dumb" else "plain"


_CURRENT: list[Status] = []


def current() -> Status:
    """The status of the command running (see :func:`shows_progress`), or one that shows
    nothing: library code and commands name their phases through it."""
    return _CURRENT[-1] if _CURRENT else _NOTHING


def shows_progress(command: str, first: str) -> Callable[[F], F]:
    """A command's decorator: its phases on stderr while it runs (`first` until it names
    another with ``current().phase(...)``), when it takes long enough to show them."""
    def wrap(func: F) -> F:
        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            with Status(command) as status:
                status.phase(first)
                _CURRENT.append(status)
                try:
                    return func(*args, **kwargs)
                finally:
                    _CURRENT.remove(status)
        return cast(F, run)
    return wrap


def _live(stream: TextIO, moves_bytes: bool, total: int) -> tuple[Any, Any]:
    """rich's progress line on `stream`: bytes, rate and ETA when the command moves bytes,
    else the phase and the time it has taken; removed when done."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
    if moves_bytes:
        columns += [BarColumn(), DownloadColumn(binary_units=True), TransferSpeedColumn(),
                    TimeRemainingColumn()]
    columns.append(TimeElapsedColumn())
    # What is printed meanwhile goes above the line; stdout only when it is this terminal
    # too (a file or a pipe on stdout keeps its own output: --json).
    progress = Progress(*columns, console=Console(file=stream), transient=True,
                        redirect_stdout=_isatty(sys.stdout))
    return progress, progress.add_task("", total=total if moves_bytes else None)


_NOTHING = Status("", enabled=False, settings=Settings("off"))

__all__ = ["ENV_INTERVAL", "ENV_MODE", "Segment", "Settings", "Status", "current", "line", "locate",
           "shows_progress"]
