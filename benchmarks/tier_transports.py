#!/usr/bin/env python3
"""The peer tier over its two transports under one launcher (mpirun): MPI point-to-point
(``--peer-transport auto``) and TCP sockets (``--peer-transport tcp``), each against a
plain transfer of the same bytes over the same transport, measured in the same run.

Runs interleaved A/B/B/A (MPI, TCP, TCP, MPI by default) on one workload with nodes
emulated by --ranks-per-node, and prints per run and per transport (median of its runs):

  replication x plain   the slowest process's replication over the plain transfer of the
                        same bytes (median over checkpoints; 1.0: at the transport's limit)
  fetch x plain         a replaced node's fetch from its peers over a plain transfer from
                        the same holder, just before
  peer s, fetch s       the replication (slowest process) and the node restart's seconds

and the MPI / TCP ratio of the medians of each. Needs mpirun and mpi4py.

    python benchmarks/tier_transports.py --dir /tmp/tt --scale 16 --ranks-per-node 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def one_run(transport: str, args: argparse.Namespace, results: Path) -> dict[str, Any]:
    """One tiered run; the peer tier's and the node restart's summaries."""
    memory = Path(tempfile.mkdtemp(prefix="ckptbench-bench-", dir="/dev/shm"))
    target = args.dir / "t"
    shutil.rmtree(target, ignore_errors=True)
    common = [args.workload, "--scale", str(args.scale), "--target", str(target),
              "--results", str(results), "--memory-dir", str(memory), "--tiers",
              "memory,peer", "--ranks-per-node", str(args.ranks_per_node), "--peer-replicas",
              str(args.replicas), "--iterations", str(args.iterations)]
    cmd = [shutil.which("mpirun") or "mpirun", "-np", str(args.processes), "--oversubscribe",
           sys.executable, "-m", "ckptbench", "run", *common, "--peer-transport",
           "auto" if transport == "mpi" else "tcp"]
    env = {**os.environ, **MPI_ENV, "PYTHONPATH": str(ROOT)}
    try:
        subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=1800)
    finally:
        shutil.rmtree(memory, ignore_errors=True)
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    peer = next(r for r in recs if r["type"] == "tier_summary" and r["tier"] == "peer")
    node = next(r for r in recs if r["type"] == "tier_restore_summary"
                and r["scenario"] == "node")
    return {"transport": peer["transport"], "replication_x": peer["over_baseline"],
            "fetch_x": node["over_baseline"].get("peer"), "peer_s": peer["blocking_s"],
            "fetch_s": node["seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default=str(ROOT / "workloads" / "llama3-8b-fsdp2-8.toml"))
    ap.add_argument("--dir", type=Path, required=True, help="results directory (created)")
    ap.add_argument("--scale", type=int, default=16)
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--order", default="mpi,tcp,tcp,mpi", help="the runs, in turn")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    keys = ("replication_x", "fetch_x", "peer_s", "fetch_s")
    rows: dict[str, list[dict[str, Any]]] = {"mpi": [], "tcp": []}
    print(f"{'run':>4} {'transport':>12} " + " ".join(f"{k:>14}" for k in keys))
    for k, transport in enumerate(args.order.split(",")):
        row = one_run(transport, args, args.dir / f"{k}-{transport}.jsonl")
        rows[transport].append(row)
        print(f"{k:>4} {row['transport']:>12} "
              + " ".join(f"{row[c] if row[c] is not None else float('nan'):14.3f}"
                         for c in keys), flush=True)
    med = {t: {c: statistics.median(r[c] for r in rs if r[c] is not None) for c in keys}
           for t, rs in rows.items() if rs}
    for t, m in med.items():
        print(f"median {t:>4}: " + ", ".join(f"{c} {v:.3f}" for c, v in m.items()))
    if len(med) == 2:
        print("MPI / TCP: " + ", ".join(f"{c} {med['mpi'][c] / med['tcp'][c]:.2f}"
                                        for c in keys if med["tcp"][c]))


if __name__ == "__main__":
    main()
