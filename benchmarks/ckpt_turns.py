"""One ckptbench turn of benchmarks/vs_warp.py, run in process through the library as
`ckptbench run` would, with its client CPU per GB of each timed phase (phase_cpu).

Two shapes: warp-shaped objects (every tensor one S-byte object, the tools' settings
matched, see vs_warp) and a DCP-shaped checkpoint run with ckptbench's DEFAULTS (a user who
changes nothing: part size, parts in flight and ranged GETs chosen by the backend), only
the transport named.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.phase_cpu import CpuSampler
from ckptbench.measure import build_request, measure

ROOT = Path(__file__).resolve().parent.parent
DCP_WORKLOAD = ROOT / "workloads" / "llama3-8b-fsdp2-8.toml"
DCP_SCALE, DCP_RANKS = 4, "0-1"  # two DCP files of about 0.7 GiB (issue 23's workload)


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """`env` in this process's environment for a turn (boto3's credential chain reads it;
    the forked ranks inherit it), restored after."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the forked ranks)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_turn(req_args: dict[str, Any], env: dict[str, str], workdir: Path,
             exclude: set[int]) -> dict[str, float]:
    """Median save and restore throughput (bytes/s); CPU s/GB of the whole run
    (start-up, payload generation, verification) and of each timed phase."""
    results = workdir / f"ckptbench-{time.time_ns()}.jsonl"
    with environment(env):
        req = build_request(**req_args)
        cpu0 = cpu_seconds()
        with CpuSampler(exclude) as sampler:
            outcome = measure(req, results)
        cpu = cpu_seconds() - cpu0
    summary = outcome["summary"] if outcome else []
    moved = sum(float(s["bytes"]) * s["iterations"] for s in summary)
    phases = sampler.per_gb(results)
    return {**{s["phase"]: float(s["throughput_bytes_per_s"]) for s in summary},
            "cpu_per_gb": cpu / max(1e-9, moved / 1e9),
            "cpu_save": phases.get("save", float("nan")),
            "cpu_restore": phases.get("restore", float("nan"))}


def dcp_request(endpoint: str, bucket: str, transport: str, iterations: int) -> dict[str, Any]:
    """The DCP-shaped run with every S3 setting at its default but the transport."""
    return {"workload": DCP_WORKLOAD, "target": f"s3://{bucket}/vs-warp-dcp", "scale": DCP_SCALE,
            "ranks": DCP_RANKS, "iterations": iterations,
            "backend_options": {"endpoint_url": endpoint, "transport": transport}}
