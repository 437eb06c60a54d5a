"""What progress costs the measured phases: the same run with progress off and on.

Pairs of runs, interleaved and in alternating order (off, on; on, off; ...) so a
drifting disk or a noisy neighbour hits both alike. "On" is the most work progress ever
does: plain lines at every change (``CKPTBENCH_PROGRESS_INTERVAL=0``) into a pipe this
script reads. Two launches:

* ``cli``: ``ckptbench run`` as a user starts it (local processes: the ranks count bytes
  in a shared array as they always do; the parent, which moves no bytes, shows them);
* ``in-process``: one rank in this process (as an MPI rank 0 does): the format's I/O
  threads call the status's ``advance`` on every block.

Reported per launch and phase: the median over pairs of each run's median phase seconds,
off and on, the ratio of the medians (on / off; 1.00: no cost), and the per-pair ratios'
median and range (how much the machine's noise moves one pair). And, independent of the
machine's load, what one ``advance`` call costs (the only call made while bytes move)
against the time an 8 MiB block takes at 10 GB/s.

    python benchmarks/progress_overhead.py --pairs 8
    python benchmarks/progress_overhead.py --workload workloads/llama3-8b-fsdp2-8.toml --scale 16
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ckptbench.records import read_records

# About 100 MB per checkpoint over 2 ranks: a save of a few tenths of a second here.
SMALL = """\
[workload]
name = "progress-bench"
description = "custom Llama, fp32 params + fp32 AdamW, FSDP2 over 2 ranks (~100 MB)"
[model]
name = "custom"
layers = 2
dim = 768
heads = 12
kv_heads = 4
ffn_dim = 2048
vocab_size = 4096
[parallel]
world_size = 2
layout = "fsdp2"
"""
PHASES = ("save", "restore")


def phase_seconds(results: Path) -> dict[str, float]:
    """Each phase's median seconds over the run's iterations (the summary's)."""
    return {r["phase"]: float(r["seconds"]) for r in read_records(results)
            if r.get("type") == "summary" and r.get("phase") in PHASES}


def run_cli(workload: Path, work: Path, on: bool, args: argparse.Namespace, n: int
            ) -> dict[str, float]:
    results = work / f"cli-{n}-{'on' if on else 'off'}.jsonl"
    env = {**os.environ, "CKPTBENCH_PROGRESS": "plain" if on else "off",
           "CKPTBENCH_PROGRESS_INTERVAL": "0"}
    cmd = [sys.executable, "-m", "ckptbench", "run", str(workload), "--target",
           str(work / "t"), "--iterations", str(args.iterations), "--scale", str(args.scale),
           "--results", str(results)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"progress_overhead: {' '.join(cmd[3:])} failed: {done.stderr[-400:]}")
    lines = sum(x.startswith("ckptbench run: ") for x in done.stderr.splitlines())
    if bool(lines) != on:
        sys.exit(f"progress_overhead: {lines} progress lines with progress "
                 f"{'on' if on else 'off'}")
    return phase_seconds(results)


def run_in_process(workload: Path, work: Path, on: bool, args: argparse.Namespace, n: int
                   ) -> dict[str, float]:
    from ckptbench.measure import build_request, measure, progress_segments
    from ckptbench.progress import Settings, Status
    from ckptbench.runner.launch_local import LocalLauncher

    results = work / f"in-{n}-{'on' if on else 'off'}.jsonl"
    req = build_request(workload, str(work / "t"), scale=args.scale, ranks=[0],
                        iterations=args.iterations)
    sink = io.StringIO()  # the lines are made and written, as into a pipe
    status = Status("run", progress_segments(req), settings=Settings("plain", 0),
                    stream=sink, enabled=on)
    with status:
        measure(req, results, LocalLauncher(in_process=True),
                on_progress=status.advance if on else None)
    if on and "ckptbench run: " not in sink.getvalue():
        sys.exit("progress_overhead: no progress line in process")
    return phase_seconds(results)


def advance_cost(calls: int = 1_000_000) -> float:
    """Seconds one Status.advance call takes (progress on, plain lines every 5 s)."""
    from ckptbench.progress import Segment, Settings, Status

    status = Status("run", [Segment("save", calls)], settings=Settings("plain", 5.0),
                    stream=io.StringIO())
    with status:
        t0 = time.perf_counter()
        for _ in range(calls):
            status.advance(1)
        return (time.perf_counter() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, default=None, help="default: ~100 MB, 2 ranks")
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--launch", choices=("cli", "in-process", "both"), default="both")
    args = ap.parse_args()
    launches = {"cli": run_cli, "in-process": run_in_process}
    chosen = list(launches) if args.launch == "both" else [args.launch]
    with tempfile.TemporaryDirectory(prefix="ckptbench-progress-") as tmp:
        work = Path(tmp)
        workload = args.workload
        if workload is None:
            workload = work / "progress-bench.toml"
            workload.write_text(SMALL)
        got: dict[tuple[str, bool], list[dict[str, float]]] = {}
        for n in range(args.pairs):
            for launch in chosen:
                for on in ((False, True) if n % 2 == 0 else (True, False)):
                    got.setdefault((launch, on), []).append(
                        launches[launch](workload, work, on, args, n))
        print(f"{args.pairs} interleaved pairs, {args.iterations} iterations a run, "
              f"workload {workload.name} at scale {args.scale}; seconds: median over pairs "
              "of each run's median phase")
        print(f"{'launch':<11} {'phase':<8} {'off s':>9} {'on s':>9} {'on/off':>7}   "
              "per-pair on/off: median [min, max]")
        for launch in chosen:
            for phase in PHASES:
                med: dict[bool, Any] = {}
                for on in (False, True):
                    med[on] = statistics.median(r[phase] for r in got[(launch, on)])
                pairs = [a[phase] / b[phase] for a, b in zip(got[(launch, True)],
                                                             got[(launch, False)], strict=True)]
                print(f"{launch:<11} {phase:<8} {med[False]:9.4f} {med[True]:9.4f} "
                      f"{med[True] / med[False]:7.3f}   {statistics.median(pairs):.3f} "
                      f"[{min(pairs):.3f}, {max(pairs):.3f}]")
    per_call = advance_cost()
    block_s = 8 * 2**20 / 10e9
    print(f"advance(): {per_call * 1e9:.0f} ns a call; an 8 MiB block at 10 GB/s takes "
          f"{block_s * 1e6:.0f} us: {per_call / block_s:.2e} of it")


if __name__ == "__main__":
    main()
