#!/usr/bin/env python3
"""Peak memory of a whole run (every process together) against the checkpoint's size.

Runs `ckptbench run` on a 20 GiB checkpoint written by 4 ranks (Llama 3 8B fp32 weights,
FSDP2 over 6 ranks, ranks 0-3) and samples the resident memory of the process tree
every 20 ms. The claim to check: data is streamed in bounded buffers, so the sum over
all processes stays under 1 GiB whatever the checkpoint size.

    python benchmarks/memory_bound.py --dir /mnt/nvme/x
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

WORKLOAD = """\
[workload]
name = "llama3-8b-fp32-weights-6"
[model]
name = "llama3-8b"
[state]
param_dtype = "float32"
optimizer = "none"
[parallel]
world_size = 6
"""


def tree_rss(proc: psutil.Process) -> tuple[int, int]:
    total, procs = 0, 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
            procs += 1
        except psutil.Error:
            pass
    return total, procs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--ranks", default="0-3")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more ckptbench run options")
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="ckptbench-mem-"))
    base.mkdir(parents=True, exist_ok=True)
    wl = base / "workload.toml"
    wl.write_text(WORKLOAD)
    cmd = [sys.executable, "-m", "ckptbench", "run", str(wl), "--target", str(base / "target"),
           "--ranks", args.ranks, "--results", str(base / f"mem-{time.time_ns()}.jsonl"), *args.extra]
    print("$", " ".join(cmd))
    start = time.monotonic()
    child = subprocess.Popen(cmd)
    proc = psutil.Process(child.pid)
    peak, peak_procs = 0, 0
    while child.poll() is None:
        rss, n = tree_rss(proc)
        if rss > peak:
            peak, peak_procs = rss, n
        time.sleep(0.02)
    print(f"exit {child.returncode} after {time.monotonic() - start:.1f} s; peak RSS of the whole "
          f"process tree {peak / 2**20:.0f} MiB ({peak_procs} processes)")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
