"""Client CPU seconds per GB of each timed phase (save, restore) of an in-process
ckptbench run: a thread samples the CPU time of this process and of its children (the
forked ranks) every 20 ms, and each phase's CPU is what the samples grew by
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


class ProcessTree:
    """CPU seconds of this process, its reaped children and its live children (not those
    excluded). The children are listed again every `relist` samples only: listing walks
    all of /proc, which on a busy host costs more than the rest of a sample; the forked
    ranks live for the whole run, so a list a fraction of a second old holds them."""

    def __init__(self, exclude: set[int], relist: int = 10) -> None:
        self.exclude = exclude
        self.relist = relist
        self.me = psutil.Process()
        self.children: list[psutil.Process] = []
        self.n = 0

    def cpu(self) -> float:
        if self.n % self.relist == 0:
            self.children = [c for c in self.me.children(recursive=True)
                             if c.pid not in self.exclude]
        self.n += 1
        t = self.me.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in self.children:
            try:
                c = child.cpu_times()
            except psutil.Error:
                continue  # gone since the listing: counted once reaped
            total += c.user + c.system
        return total


class CpuSampler:
    """`with CpuSampler(exclude) as s: ...` then `s.per_gb(results)`. Samples every
    `every_s` (cheap: about 1% of a core) and interpolates between them: a phase of a
    second or more is placed to within a few per cent."""

    def __init__(self, exclude: set[int] | None = None, every_s: float = 0.02) -> None:
        self.every_s = every_s
        self.samples: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._tree = ProcessTree(exclude or set())
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.perf_counter_ns(), self._tree.cpu()))
            if self._stop.wait(self.every_s):
                self.samples.append((time.perf_counter_ns(), self._tree.cpu()))
                return

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_at(self, t_ns: int) -> float:
        """CPU seconds at `t_ns`, interpolated between the samples either side of it."""
        times = [t for t, _ in self.samples]
        i = bisect_left(times, t_ns)
        if i <= 0 or i >= len(times):
            return self.samples[min(max(i, 0), len(times) - 1)][1]
        (t0, c0), (t1, c1) = self.samples[i - 1], self.samples[i]
        return c0 + (c1 - c0) * (t_ns - t0) / max(1, t1 - t0)

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
