"""asv benchmarks: save/restore throughput (GB/s) through the same runner as the CLI,
plan and restore-plan building at the Llama 3 cluster's scale and 8x it (131,072 ranks),
payload generation speed, and the simulation of a 54-day run at both scales.

    asv run --python=same --quick
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from ckptbench.measure import build_request, measure
from ckptbench.payload import PayloadGenerator, Region
from ckptbench.plan import build_plan
from ckptbench.plan.export import restore_summary
from ckptbench.plan.restore import build_restore_plan
from ckptbench.spec import load_workload, with_restore

WORKLOADS = Path(__file__).resolve().parent.parent / "workloads"
# Where save/restore benchmarks write; point it at the storage to measure.
TARGET_ROOT = os.environ.get("CKPTBENCH_ASV_TARGET", tempfile.gettempdir())

CASES = {
    # name: (workload file, --scale, ranks)
    "tiny": ("tiny.toml", 1, [0, 1, 2, 3]),
    "llama3-8b/scale8/2-ranks": ("llama3-8b-fsdp2-8.toml", 8, [0, 1]),
}


def _run(case: str, io: str) -> dict[str, float]:
    name, scale, ranks = CASES[case]
    work = Path(tempfile.mkdtemp(prefix="ckptbench-asv-", dir=TARGET_ROOT))
    try:
        req = build_request(WORKLOADS / name, str(work / "target"), scale=scale, ranks=ranks,
                            iterations=1, backend_options={"io": io})
        outcome = measure(req, work / "results.jsonl") or {"summary": []}
        return {s["phase"]: s["throughput_bytes_per_s"] / 1e9 for s in outcome["summary"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


class SaveRestore:
    """Aggregate save and restore throughput, GB/s (1e9 bytes/s), buffered I/O."""

    params = (list(CASES), ["buffered", "direct"])
    param_names = ["workload", "io"]
    unit = "GB/s"
    number = 1
    repeat = 1
    timeout = 600

    def setup_cache(self):
        return {f"{c}|{io}": _run(c, io) for c in CASES for io in ("buffered", "direct")}

    def track_save(self, cache, case, io):
        return cache[f"{case}|{io}"]["save"]

    def track_restore(self, cache, case, io):
        return cache[f"{case}|{io}"]["restore"]

    track_save.unit = "GB/s"  # type: ignore[attr-defined]  # asv reads it off the method
    track_restore.unit = "GB/s"  # type: ignore[attr-defined]


FILE_16K = "llama3.1-405b-tp8-pp16-fsdp-16384.toml"
FILE_131K = "llama3.1-405b-tp8-pp16-fsdp-131072.toml"


class Plan:
    """Plan building for llama3.1-405b on 16,384 ranks (the Llama 3 cluster: TP8 x PP16 x
    FSDP128) and on 131,072 ranks (FSDP1024). Budget: 2 s at 16k; 10 s and 2 GB at 131k
    (benchmarks/plan_scale.py prints the same in one table)."""

    timeout = 300
    number = 1
    repeat = (1, 3, 60.0)
    warmup_time = 0

    def setup(self):
        self.workload = load_workload(WORKLOADS / FILE_16K)
        self.workload_131k = load_workload(WORKLOADS / FILE_131K)

    def time_plan_405b_16384_ranks(self):
        build_plan(self.workload)

    def peakmem_plan_405b_16384_ranks(self):
        build_plan(self.workload)

    def time_plan_405b_131072_ranks(self):
        build_plan(self.workload_131k)

    def peakmem_plan_405b_131072_ranks(self):
        build_plan(self.workload_131k)


class RestorePlan:
    """`ckptbench plan --restore` for llama3.1-405b saved on 16,384 ranks and restored onto
    127 data-parallel groups (TP8 x PP16 x FSDP127 = 16,256 ranks, a job that lost a
    group), and saved on 131,072 ranks and restored onto 130,944 (FSDP1023): the save plan,
    the DCP restore plan and its summary. Budget: 10 s, 4 GiB at 16k; 20 s at 131k."""

    timeout = 600
    number = 1
    repeat = (1, 3, 60.0)
    warmup_time = 0

    def setup(self):
        self.workload = with_restore(load_workload(WORKLOADS / FILE_16K),
                                     {"world_size": 16256}, "--restore-world-size")
        self.workload_131k = with_restore(load_workload(WORKLOADS / FILE_131K),
                                          {"world_size": 130944}, "--restore-world-size")

    def _summary(self, workload=None):
        return restore_summary(build_restore_plan(build_plan(workload or self.workload)))

    def time_restore_plan_405b_16256_ranks(self):
        self._summary()

    def peakmem_restore_plan_405b_16256_ranks(self):
        self._summary()

    def track_amplification_405b_16256_ranks(self):
        return self._summary()["amplification"]

    track_amplification_405b_16256_ranks.unit = "x"  # type: ignore[attr-defined]

    def time_restore_plan_405b_130944_ranks(self):
        self._summary(self.workload_131k)

    def peakmem_restore_plan_405b_130944_ranks(self):
        self._summary(self.workload_131k)


class Payload:
    """Payload generation speed per core (GB/s): must never be the bottleneck."""

    params = ["random", "realistic"]
    param_names = ["mode"]

    def setup(self, mode):
        self.gen = PayloadGenerator(mode, seed=1)
        self.buf = np.empty(64 << 20, dtype=np.uint8)
        self.regions = [Region(0, 1 << 40, "model.layers.0.attention.wq.weight", "bfloat16")]

    def track_generate_gbps(self, mode):
        start = time.perf_counter()
        for i in range(8):
            self.gen.fill(12345, self.regions, i * len(self.buf), self.buf)
        return 8 * len(self.buf) / (time.perf_counter() - start) / 1e9

    track_generate_gbps.unit = "GB/s"  # type: ignore[attr-defined]


class Simulate:
    """`ckptbench simulate` of the Llama 3 job (docs/cadence.md's worked example: memory,
    peer and storage levels, the llama3 failure classes, restarts by scope): 1,000 runs of
    54 days at 16,384 and at 131,072 GPUs. Budget: 5 s and 10 s
    (benchmarks/simulate_speed.py prints the same, with the goodput)."""

    timeout = 120
    number = 1
    repeat = (1, 3, 60.0)
    warmup_time = 0

    def setup(self):
        from benchmarks.simulate_speed import run  # asv imports this file as benchmarks.*

        self.run = run

    def time_simulate_131072_gpus_54_days(self):
        self.run(131_072)

    def time_simulate_16384_gpus_54_days(self):
        self.run(16_384)


if __name__ == "__main__":  # a quick look without asv
    print(json.dumps({c: _run(c, "buffered") for c in CASES}, indent=1))
