#!/usr/bin/env python3
"""Asynchronous checkpoints against their physical limits, and what they change for a job.

On one workload, in this order:

1. a sync run (`--mode sync`): the save time of the same bytes;
2. async runs (`--mode async`) at each --step-seconds: blocking time against the physical
   limit (the state's bytes over one plain copy of them into staging, timed before each
   snapshot), the persist against the sync save, the interference of the persist with
   training steps against the same run's baseline loop;
3. the sync run again: a shared machine drifts, so the persist is compared with the
   mean of the sync saves before and after it (both printed);
4. `ckptbench cadence` for --job from the async run at the first step time, next to the
   one from the sync run.

    python benchmarks/async_checkpoints.py --dir /tmp/bench --scale 2 --ranks 0 \\
        --step-seconds 1,10 --steps-per-checkpoint 8,2 --checkpoints 4,3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptbench.measure import build_request, measure
from ckptbench.runner.options import LoopOptions

ROOT = Path(__file__).resolve().parents[1]


def run(workload: str, target: Path, results: Path, scale: int, ranks: str, iterations: int,
        **options: Any) -> dict[str, Any]:
    if target.exists():
        shutil.rmtree(target)
    req = build_request(workload, str(target), scale=scale, ranks=ranks,
                        iterations=iterations, **options)
    outcome = measure(req, results)
    assert outcome is not None
    return outcome


def save_seconds(outcome: dict[str, Any]) -> float:
    """Median over iterations of the save's span (first open to the manifest's commit)."""
    return statistics.median(i["seconds"] for i in outcome["iterations"] if i["phase"] == "save")


def cadence(results: Path, job: str, preset: str) -> dict[str, Any]:
    """`ckptbench cadence --json` for `job` from a run; --force: a run on one machine
    cannot stand for the job (ranks per node, iterations: the job model says so, and its
    warnings come back in the JSON)."""
    out = subprocess.run([sys.executable, "-m", "ckptbench", "cadence", "--results", str(results),
                          "--workload", job, "--failure-preset", preset, "--force", "--json"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def _num(x: float | None) -> str:
    return f"{'-':>7}" if x is None else f"{x:7.2f}"


def _pct(x: float | None) -> str:
    return f"{'-':>8}" if x is None else f"{100 * x:+7.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default=str(ROOT / "workloads" / "llama3-8b-fsdp2-8.toml"))
    ap.add_argument("--dir", type=Path, required=True, help="target directory (created)")
    ap.add_argument("--scale", type=int, default=2)
    ap.add_argument("--ranks", default="0")
    ap.add_argument("--step-seconds", default="1,10")
    ap.add_argument("--steps-per-checkpoint", default="8,2")
    ap.add_argument("--checkpoints", default="4,3", help="per step time")
    ap.add_argument("--sync-iterations", type=int, default=3)
    ap.add_argument("--io", choices=("buffered", "direct"), default="buffered",
                    help="direct: O_DIRECT both ways, so neither run depends on how fast the "
                         "page cache gets fresh pages (slow on VMs with free page reporting)")
    ap.add_argument("--job", default=str(ROOT / "workloads" / "llama3.1-405b-tp8-pp16-fsdp-16384.toml"))
    ap.add_argument("--failure-preset", default="llama3")
    a = ap.parse_args()
    steps = [float(x) for x in a.step_seconds.split(",")]
    spcs = [int(x) for x in a.steps_per_checkpoint.split(",")]
    cks = [int(x) for x in a.checkpoints.split(",")]
    a.dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    common = dict(scale=a.scale, ranks=a.ranks, backend_options={"io": a.io})

    sync_results = a.dir / f"sync-{stamp}.jsonl"
    sync = run(a.workload, a.dir / "sync", sync_results, iterations=a.sync_iterations, **common)
    sync_save = save_seconds(sync)
    print(f"sync: save {sync_save:.3f} s median of {a.sync_iterations}, "
          f"{sync['iterations'][0]['bytes'] / 2**30:.3f} GiB")

    rows: list[tuple[float, dict[str, Any], float]] = []
    first = None
    for step, spc, n in zip(steps, spcs, cks, strict=True):
        results = a.dir / f"async-{step:g}s-{stamp}.jsonl"
        out = run(a.workload, a.dir / "async", results, iterations=n, mode="async",
                  loop=LoopOptions(step_seconds=step, steps_per_checkpoint=spc), **common)
        first = first or results
        (s,) = out["async"]
        persist = save_seconds(out)
        rows.append((step, s, persist))
        print(f"async step {step:g} s: {results}")

    sync_after = save_seconds(run(a.workload, a.dir / "sync", a.dir / f"sync-after-{stamp}.jsonl",
                                  iterations=a.sync_iterations, **common))
    print(f"sync again: save {sync_after:.3f} s")
    sync_save = (sync_save + sync_after) / 2

    print()
    print(f"{'step s':>7} {'ckpts':>5} {'waited':>6} {'blocking':>9} {'limit':>7} {'x limit':>7} "
          f"{'copy GB/s':>9} {'persist':>8} {'x sync':>6} {'durable':>8} {'calib':>6} "
          f"{'base':>6} {'between':>7} {'during':>7} {'interf.':>8} {'vs betw.':>8}")
    for step, s, persist in rows:
        print(f"{step:7g} {s['checkpoints']:5d} {s['waited_checkpoints']:6d} "
              f"{s['blocking_without_wait_s']['median']:9.3f} {s['limit_s']['median']:7.3f} "
              f"{s['blocking_over_limit']['median']:7.2f} {s['copy_bytes_per_s'] / 1e9:9.2f} "
              f"{persist:8.3f} {persist / sync_save:6.2f} {s['durable_after_s']['median']:8.3f} "
              f"{s['calibrated_step_s']:6.2f} {s['baseline_step_s']:6.2f} "
              f"{s['between_step_s'] or 0:7.2f} {_num(s['during_step_s'])} "
              f"{_pct(s['interference'])} {_pct(s['interference_against_between'])}")
    print("step times (s): calibrated, baseline loop, the loop's steps between persists and "
          "those whose midpoint is in one (-: none); interference: extra time of the steps "
          "overlapping a persist / (persist time - that), against the baseline and against "
          "the steps between persists")
    print("blocking: median over checkpoints of the slowest process, waits left out; limit: "
          "bytes / a plain copy timed before each snapshot, x limit: median of the pairs; persist: first write to the manifest's commit (median), "
          "x sync: over the mean of the sync saves of the same bytes before and after")

    assert first is not None
    print()
    print(f"cadence for {Path(a.job).name} ({a.failure_preset} failures):")
    for name, path in (("sync", sync_results), ("async", first)):
        c = cadence(path, a.job, a.failure_preset)
        best, cost = c["recommended"], c["cost"]
        print(f"  {name:5}: C {cost['save_s']:.3g} s, persist {cost['persist_s']:.3g} s, "
              f"interference {100 * cost['interference']:.3g} %, R {cost['restore_s']:.3g} s -> "
              f"every {best['interval_s'] / 60:.3g} min, goodput {100 * best['goodput']:.2f} %, "
              f"{best['gpu_hours_lost_per_day']:,.0f} GPU-h lost/day")
        warnings = (c.get("job_model") or {}).get("warnings") or []
        if warnings:
            print(f"         job model warnings (--force): "
                  f"{', '.join(w['check'] for w in warnings)}")


if __name__ == "__main__":
    main()
