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
  1.30 GB/s (4 pairs). On bare metal it costs a second and changes nothing.

  A warm-up only helps for the seconds before the guest reports the pages again, so a
  tool whose turn outlasts that window still pays. Where the kernel lets root set it,
  `reporting_paused` stops free page reporting for the whole comparison and backs the
  memory the run needs once, then restores the setting: touching memory on the
  development VM ran at 0.23-0.31 GB/s on reported pages and 6.1-7.8 GB/s on backed ones.
  That changes a kernel setting of the machine, so it is opt-in (`--page-reporting
  pause`); by default the scripts leave the machine as it is and say what they found.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ckptbench.units import parse_size
from harness import ToolError, run

GIB = 1 << 30
# Free page reporting (virtio-balloon's, for one) hands free blocks of at least this order
# back to the host; a value above the largest order the buddy allocator has turns it off.
REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
BUDDYINFO = Path("/proc/buddyinfo")


def drop_caches() -> None:
    """sync, then drop the page cache when permitted (root); otherwise the tools' own
    cache rules apply (fio's invalidate=1, ckptbench's cold-cache restore)."""
    subprocess.run(["sync"], check=False)
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def warm_size(moved_bytes: int, reserve: int | None = None) -> int:
    """Default warm-up: twice the bytes a run moves (a tool's buffers plus the page cache)
    and 1 GiB, at most half the memory available (or all of it but `reserve` bytes)."""
    cap = available_memory() // 2 if reserve is None else available_memory() - reserve
    return max(0, min(2 * moved_bytes + GIB, cap))


def warm_memory(nbytes: int) -> None:
    """Touch nbytes of memory in a child process that then exits, so the pages are backed."""
    if nbytes > 0:
        done = run([sys.executable, "-c", "import sys, numpy as np\n"
                    "a = np.empty(int(sys.argv[1]), np.uint8); a[::4096] = 1", str(nbytes)])
        if done.returncode:
            raise ToolError(f"warming {nbytes} bytes of memory failed ({done.returncode}): "
                            f"{done.tail()}")


def max_page_order() -> int:
    """The buddy allocator's largest order: /proc/buddyinfo has one column per order."""
    with contextlib.suppress(OSError, IndexError):
        return len(BUDDYINFO.read_text().splitlines()[0].split()) - 5
    return 10


def _set_reporting_order(value: str) -> str | None:
    """Write the order; None when done, else why not (the kernel's refusal)."""
    try:
        REPORTING_ORDER.write_text(value + "\n")
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def add_reporting_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--page-reporting", choices=["leave", "pause"], default="leave",
                    help="leave: run on the machine as it is; pause: turn the VM's free page "
                    "reporting off for the run (root; machine_state.py says why), back the "
                    "memory the run needs once, and restore the setting at the end, also on "
                    "SIGTERM or SIGHUP [default: leave]")


@contextlib.contextmanager
def _exit_on_hangup_or_term() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run as SystemExit, so `finally` blocks still run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGTERM, signal.SIGHUP)
    previous = [signal.signal(sig, lambda num, _frame: sys.exit(128 + num)) for sig in signals]
    try:
        yield
    finally:
        for sig, handler in zip(signals, previous, strict=True):
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def reporting_paused(back_bytes: int, pause: bool = True) -> Iterator[str]:
    """With `pause`: free page reporting off for the comparison, `back_bytes` of memory backed once, the
    kernel's setting restored on the way out (also on an error, SIGTERM or SIGHUP). Yields
    a line for the report that says what was done, or why not: without root, on a kernel
    without the setting or one that will not turn it off, the tools run on the machine as
    it is. Without `pause`, only says what the setting is."""
    try:
        old = REPORTING_ORDER.read_text().strip()
    except OSError:
        yield "no free page reporting"
        return
    if not old.isdigit():  # -1: the setting is built in, no device reports pages
        yield f"no free page reporting (order {old})"
        return
    if not pause:
        yield f"free page reporting left as it is (order {old})"
        return
    off = str(max_page_order() + 1)  # above the largest order: no free block qualifies
    if int(old) >= int(off):  # left off by someone else, or by a run that was killed
        warm_memory(back_bytes)
        yield (f"free page reporting already off (order {old}: not ours to restore; the "
               f"kernel's default is pageblock_order, 9 on x86-64), {back_bytes / GIB:.2f} GiB backed")
        return
    with _exit_on_hangup_or_term():
        why = _set_reporting_order(off)
        if why is not None:  # mainline kernels refuse orders above the largest
            yield (f"free page reporting on (order {old}; could not set {off}: {why}): freed "
                   f"memory costs whichever tool touches it next")
            return
        try:
            warm_memory(back_bytes)
            yield f"free page reporting off (was order {old}), {back_bytes / GIB:.2f} GiB backed"
        finally:
            why = _set_reporting_order(old)
            if why is not None:
                print(f"could not restore free page reporting ({why}): echo {old} > "
                      f"{REPORTING_ORDER}", file=sys.stderr)


def memory_for_run(args: argparse.Namespace, turn_bytes: int) -> contextlib.AbstractContextManager[str]:
    """What --page-reporting asks for, with the memory a turn needs backed: twice the
    bytes a turn writes (a tool's buffers and the page cache) and 1 GiB, leaving 2 GiB."""
    return reporting_paused(warm_size(turn_bytes, reserve=2 * GIB), args.page_reporting == "pause")


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


def cpu_ticks(stat: str | None = None) -> tuple[int, int]:
    """(stolen, total) CPU ticks of the machine so far, from /proc/stat's first line
    (`stat` for tests). On a VM, steal is time the guest's vCPUs were runnable but the
    host ran something else: a busy neighbour slows whichever tool's turn it lands in, so
    vs_warp prints each turn's share (below 0.02 is a quiet host)."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    fields = [int(v) for v in text.splitlines()[0].split()[1:9]]  # user .. steal
    return fields[7], sum(fields)


def stolen_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of CPU time stolen between two cpu_ticks() readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def pairs_ratio(reference: list[float], ours: list[float]) -> float:
    """Median of the per-pair ratios: holds better than the ratio of medians when the
    machine's speed drifts from one pair to the next."""
    return statistics.median(b / a for a, b in zip(reference, ours, strict=True))
