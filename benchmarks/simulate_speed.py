"""How long `ckptbench simulate` takes for the Llama 3 job: 54 days, 1,000 replicas, at
16,384 and at 131,072 GPUs (targets: 5 s and 10 s), under the stated rules.

    python benchmarks/simulate_speed.py [--repeat 3]

The job of docs/cadence.md's worked example: Llama 3's failure classes, a memory copy
(1 s save, 30 s restore), a peer copy (3 s, 90 s) and storage (51 s, 129 s), restarts of
20 s (in-process, after process failures), 150 s (warm spare, node) and 600 s
(replacement, group and job), and the schedules given (the model's optima). Prints, per
size, the wall and CPU seconds of the simulation alone (imports not counted), the median
over repeats, the goodput and the failures simulated.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from ckptbench.cadence import classes as fc
from ckptbench.cadence.multilevel import Level, Schedule
from ckptbench.simulate import Failures, Simulated, Topology, simulate

LEVELS = [Level("memory", 1.0, 30.0), Level("peer", 3.0, 90.0), Level("storage", 51.0, 129.0)]
SCOPES = ["process", "node", "job"]
RESTART_S = {"process": 20.0, "node": 150.0, "group": 600.0, "job": 600.0}
GPUS_PER_NODE = 8
DAYS = 54
REPLICAS = 1000
SCHEDULES = {16_384: Schedule(240.6, (0, 13)), 131_072: Schedule(40.0, (1, 21))}
TARGETS = {16_384: 5.0, 131_072: 10.0}


def llama3(gpus: int) -> list[Failures]:
    """Llama 3's classes at `gpus`, each with the restart of its scope."""
    _, classes = fc.CLASS_PRESETS["llama3"]
    return [Failures(c.name, c.per_second(gpus, GPUS_PER_NODE), c.scope, RESTART_S[c.scope])
            for c in classes]


def run(gpus: int, seed: int = 0, replicas: int = REPLICAS) -> Simulated:
    return simulate(LEVELS, SCOPES, llama3(gpus), SCHEDULES[gpus], DAYS * 86400.0,
                    Topology(math.ceil(gpus / GPUS_PER_NODE)), replicas, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for gpus, target in TARGETS.items():
        walls, cpus = [], []
        for seed in range(args.repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            result = run(gpus, seed)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        print(f"{gpus:>7} GPUs: {statistics.median(walls):6.2f} s wall "
              f"({statistics.median(cpus):6.2f} s CPU), target {target:g} s; goodput "
              f"{100 * result.mean:.2f} % +- {100 * result.ci99:.2f}, "
              f"{result.failures_per_replica / DAYS:.1f} failures a day, restores "
              f"{result.restores_by_level}, overflowed {result.overflowed}")


if __name__ == "__main__":
    main()
