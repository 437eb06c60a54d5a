"""How long `ckptbench simulate` takes for the Llama 3 job: 54 days, 1,000 replicas, at
16,384 and at 131,072 GPUs (targets: 10 s and 60 s), next to the closed form's answer.

    python benchmarks/simulate_speed.py [--repeat 3]

Prints, per size, the wall and CPU seconds of the simulation alone (the optimum search
and imports not counted), the median over repeats, and the simulated goodput against
the multi-level model's efficiency.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ckptbench.cadence import classes as fc
from ckptbench.cadence import multilevel as ml
from ckptbench.simulate import Failures, simulate

LEVELS = [ml.Level("memory", 1.0, 30.0), ml.Level("peer", 3.0, 90.0),
          ml.Level("storage", 51.0, 729.0)]
SCOPES = ["process", "node", "job"]
TARGETS = {16_384: 10.0, 131_072: 60.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    _, classes = fc.CLASS_PRESETS["llama3"]
    needs = fc.assign(SCOPES, classes)
    for gpus, target in TARGETS.items():
        rates = fc.severity_rates(SCOPES, classes, gpus, 8)
        schedule = ml.optimum(LEVELS, rates).schedule
        failures = [Failures(c.name, c.per_second(gpus, 8), level)
                    for c, level in zip(classes, needs, strict=True)]
        walls, cpus = [], []
        for seed in range(args.repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            run = simulate(LEVELS, failures, schedule, 54 * 86400.0, 1000, seed)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        print(f"{gpus:>7} GPUs: {statistics.median(walls):6.2f} s wall "
              f"({statistics.median(cpus):6.2f} s CPU), target {target:g} s; goodput "
              f"{100 * run.mean:.2f} % +- {100 * run.ci99:.2f} (model {100 * run.analytic:.2f} %)"
              if run.analytic is not None else "")


if __name__ == "__main__":
    main()
