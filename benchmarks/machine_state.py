"""Putting the machine in the same state before each tool's run, the order of the runs and
the per-pair ratio: what the side-by-side scripts (vs_fio, vs_warp) share.

Two effects would otherwise decide a comparison on their own:

* the page cache: dropped before each run (when permitted), so no tool reads or overwrites
  what the other left cached;
* on virtual machines with free page reporting (Firecracker, others with a balloon device),
  memory freed to the guest kernel is handed back to the host within seconds, and faulting
  it back in costs more than writing the data to disk: a buffered write of 1.4 GB measured
  0.56 GB/s with 1.4 GB of other memory touched beforehand and 1.07 GB/s without (6 pairs),
  so the tool holding more memory, or starting later after a cache drop, loses. Touching
  memory in a process that exits at once (`warm_memory`) makes the pages each tool fills
  next backed, as on bare metal: after a 4 GiB warm-up the same writes measured 1.29 and
  1.30 GB/s (4 pairs). On bare metal it costs a second and changes nothing. vs_warp
  leaves it off by default (its docstring says why).
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ckptbench.cli.run_cmd import parse_size

GIB = 1 << 30


def drop_caches() -> None:
    """sync, then drop the page cache when permitted (root); otherwise the tools' own
    cache rules apply (fio's invalidate=1, ckptbench's cold-cache restore)."""
    subprocess.run(["sync"], check=False)
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def warm_size(moved_bytes: int) -> int:
    """Default warm-up: twice the bytes a run moves (a tool's buffers plus the page cache)
    and 1 GiB, at most half the memory available."""
    return min(2 * moved_bytes + GIB, mem_available() // 2)


def warm_memory(nbytes: int) -> None:
    """Touch nbytes of memory in a child process that then exits, so the pages are backed."""
    if nbytes > 0:
        subprocess.run([sys.executable, "-c", "import sys, numpy as np\n"
                        "a = np.empty(int(sys.argv[1]), np.uint8); a[::4096] = 1", str(nbytes)],
                       check=True)


def parse_warm(text: str) -> int | None:
    """--warm-memory: 'auto' (None: warm_size), '0' (none) or a size such as 4GiB."""
    if text == "auto":
        return None
    return 0 if text.strip() == "0" else parse_size(text, "--warm-memory")


def prepare_turn(warm: int, settle: float = 0.0) -> None:
    """Before a tool's turn: drop the page cache, wait `settle` seconds, warm `warm` bytes."""
    drop_caches()
    time.sleep(settle)
    warm_memory(warm)


def turns(repeat: int, reference: str, ours: str = "ckptbench") -> Iterator[tuple[int, str]]:
    """(pair, tool) in ABBA order (reference, ours, ours, reference, ...): neither tool
    always runs right after the other (its deletes, its freed memory)."""
    for i in range(repeat):
        yield from ((i, tool) for tool in ((reference, ours) if i % 2 == 0 else (ours, reference)))


def pairs_ratio(reference: list[float], ours: list[float]) -> float:
    """Median of the per-pair ratios: holds better than the ratio of medians when the
    machine's speed drifts from one pair to the next."""
    return statistics.median(b / a for a, b in zip(reference, ours, strict=True))
