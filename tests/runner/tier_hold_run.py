"""`ckptbench run` with the peer tier's replication held at a known point (tests only).

    python tests/runner/tier_hold_run.py --at I --procs P,Q --flag PATH -- RUN ARGS...

At checkpoint I, processes P and Q (the run's process indices) create PATH.p<process>
(holding their pid) as they are about to send their replicas, then block for ever: their
replication is in flight until something kills them. Every other process replicates as
usual. Wraps what the CLI builds: runner.tiers' send_all (TCP; inherited by the forked
ranks) and, under mpirun, MpiPeers.exchange (its I-th replica exchange).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ckptbench.cli import main
from ckptbench.runner import tier_mpi, tiers


def install(at: int, procs: set[int], flag: str) -> None:
    real = tiers.send_all

    def hold(proc: int) -> None:
        part = Path(f"{flag}.p{proc}.part")
        part.write_text(str(os.getpid()))
        part.rename(f"{flag}.p{proc}")
        while True:  # held until killed
            time.sleep(0.05)

    def held(addresses: Any, op: int, src: int, it: int, data: Any) -> Any:
        if it == at and src in procs:
            hold(src)
        return real(addresses, op, src, it, data)

    tiers.send_all = held  # type: ignore[assignment]
    exchange = tier_mpi.MpiPeers.exchange
    count = [0]  # replica exchanges so far: one per checkpoint

    def held_mpi(self: Any, sends: Any, recvs: Any, tag: int) -> None:
        if tag == tier_mpi.TAG_REPLICA:
            count[0] += 1
            if count[0] == at and self.c.Get_rank() in procs:
                hold(self.c.Get_rank())
        exchange(self, sends, recvs, tag)

    tier_mpi.MpiPeers.exchange = held_mpi  # type: ignore[method-assign]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--at", type=int, required=True)
    ap.add_argument("--procs", required=True)
    ap.add_argument("--flag", required=True)
    ap.add_argument("run_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    install(a.at, {int(p) for p in a.procs.split(",")}, a.flag)
    args = a.run_args[1:] if a.run_args[:1] == ["--"] else a.run_args
    sys.exit(main(["run", *args]))
