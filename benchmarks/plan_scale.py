#!/usr/bin/env python3
"""Plan time and peak memory of Llama 3.1 405B at the Llama 3 cluster's scale (16,384
ranks) and 8x it (131,072 ranks), save plans and DCP restore plans onto one data-parallel
group fewer (16,256 and 130,944 ranks).

Each case runs in a fresh process, so its peak resident memory (ru_maxrss) is its own;
the seconds are wall time of the library calls (`build_plan`, then `build_restore_plan`
and the restore summary), CPU seconds beside them, and the process's resident memory
after imports, before any planning.

    python benchmarks/plan_scale.py                 # every case
    python benchmarks/plan_scale.py 405b-131072     # one case
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "workloads"
CASES = {
    # name: (workload file, restore world size or None)
    "405b-16384": ("llama3.1-405b-tp8-pp16-fsdp-16384.toml", None),
    "405b-16384-restore-16256": ("llama3.1-405b-tp8-pp16-fsdp-16384.toml", 16256),
    "405b-131072": ("llama3.1-405b-tp8-pp16-fsdp-131072.toml", None),
    "405b-131072-restore-130944": ("llama3.1-405b-tp8-pp16-fsdp-131072.toml", 130944),
}


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(case: str) -> dict[str, float | int]:
    """One case, in this process: seconds and peak memory."""
    from ckptbench.plan import build_plan
    from ckptbench.plan.export import restore_summary
    from ckptbench.plan.restore import build_restore_plan
    from ckptbench.spec import load_workload, with_restore

    name, restore = CASES[case]
    workload = load_workload(WORKLOADS / name)
    if restore is not None:
        workload = with_restore(workload, {"world_size": restore}, "--restore-world-size")
    base = _rss_mib()
    cpu, start = time.process_time(), time.perf_counter()
    plan = build_plan(workload)
    out: dict[str, float | int] = {"plan_s": time.perf_counter() - start,
                                   "plan_cpu_s": time.process_time() - cpu,
                                   "chunks": plan.n_chunks}
    if restore is not None:
        cpu, start = time.process_time(), time.perf_counter()
        s = restore_summary(build_restore_plan(plan))
        out.update(restore_s=time.perf_counter() - start, restore_cpu_s=time.process_time() - cpu,
                   reads=s["reads"], amplification=s["amplification"])
    out.update(base_rss_mib=base, peak_rss_mib=_rss_mib())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"one of {', '.join(CASES)}")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; allowed: {', '.join(CASES)}")
    if args.child:
        print(json.dumps(child(args.child)))
        return
    print(f"{'case':28} {'plan s':>7} {'cpu s':>6} {'restore s':>9} {'cpu s':>6} "
          f"{'peak RSS':>9} {'after imports':>13}  chunks / reads")
    for case in args.cases or CASES:
        done = subprocess.run([sys.executable, __file__, "--child", case], capture_output=True,
                              text=True, check=False, cwd=ROOT)
        if done.returncode:
            print(f"{case:28} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(done.stdout)
        restore = (f"{r['restore_s']:9.2f} {r['restore_cpu_s']:6.2f}" if "restore_s" in r
                   else f"{'-':>9} {'-':>6}")
        counts = f"{r['chunks']:,}" + (f" / {r['reads']:,} ({r['amplification']:.3f}x)"
                                       if "reads" in r else "")
        print(f"{case:28} {r['plan_s']:7.2f} {r['plan_cpu_s']:6.2f} {restore} "
              f"{r['peak_rss_mib']:6.0f} MiB {r['base_rss_mib']:9.0f} MiB  {counts}", flush=True)


if __name__ == "__main__":
    main()
