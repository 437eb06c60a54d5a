"""Client CPU seconds per GB of each timed phase (save, restore) of an in-process
ckptbench run: a thread samples the CPU time of this process and of its children (the
forked ranks) every few milliseconds, and each phase's CPU is what the samples grew by
between the first rank's start and the last rank's end of that phase (the rank records'
clock is ``perf_counter_ns``, the sampler's too). Start-up, payload generation before the
clock and the pauses between phases are left out; what a rank's threads spend inside the
phase (requests, copies, verification) is in. Processes named in ``exclude`` (a server
this script started) are not the client and are left out.
"""

from __future__ import annotations

import json
import threading
import time
from bisect import bisect_left
from pathlib import Path
from typing import Any

import psutil


def tree_cpu(me: psutil.Process, exclude: set[int]) -> float:
    """CPU seconds of `me`, its reaped children and its live children not excluded."""
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        if child.pid in exclude:
            continue
        try:
            c = child.cpu_times()
        except psutil.Error:
            continue  # gone between the listing and the read: counted once reaped
        total += c.user + c.system
    return total


class CpuSampler:
    """`with CpuSampler(exclude) as s: ...` then `s.per_gb(results)`."""

    def __init__(self, exclude: set[int] | None = None, every_s: float = 0.005) -> None:
        self.exclude = exclude or set()
        self.every_s = every_s
        self.samples: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._me = psutil.Process()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.perf_counter_ns(), tree_cpu(self._me, self.exclude)))
            if self._stop.wait(self.every_s):
                self.samples.append((time.perf_counter_ns(), tree_cpu(self._me, self.exclude)))
                return

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_at(self, t_ns: int) -> float:
        """CPU seconds at `t_ns`, from the nearest sample at or after it."""
        times = [t for t, _ in self.samples]
        i = min(len(times) - 1, bisect_left(times, t_ns))
        return self.samples[i][1]

    def per_gb(self, results: Path) -> dict[str, float]:
        """{'save': s/GB, 'restore': s/GB} over the phases recorded in `results`."""
        spans: dict[tuple[str, int], list[int]] = {}
        moved: dict[str, int] = {}
        for line in results.read_text().splitlines():
            rec: dict[str, Any] = json.loads(line)
            if rec.get("type") != "rank":
                continue
            key = (rec["phase"], rec["iteration"])
            span = spans.setdefault(key, [rec["start_ns"], rec["end_ns"]])
            span[0], span[1] = min(span[0], rec["start_ns"]), max(span[1], rec["end_ns"])
            moved[rec["phase"]] = moved.get(rec["phase"], 0) + int(rec["bytes"])
        cpu: dict[str, float] = {}
        for (phase, _), (a, b) in spans.items():
            cpu[phase] = cpu.get(phase, 0.0) + self.cpu_at(b) - self.cpu_at(a)
        return {phase: cpu[phase] / max(1e-9, moved[phase] / 1e9) for phase in cpu}
