"""Two MPI ranks through the resharded restart's fetch (tests only): rank 0 reads two
ranges of rank 1's memory copy.

    mpirun -np 2 python tests/runner/mpi_fetch_ranges_run.py DIR

Round 1: the copy is not there yet, an answer (missing), not a hang. Round 2: rank 0
already failed (an error) while rank 1 now has the copy and sends: rank 0 still takes
it in, so neither waits for ever. Round 3: the bytes arrive and match. Prints "ok RANK".
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ckptbench.plan.tier_reads import CopyRead
from ckptbench.plan.tiers import plan_tiers
from ckptbench.runner.tier_mpi import MpiPeers
from ckptbench.runner.tier_reshard import Mover, ReshardRestart, plan_restart
from ckptbench.runner.tier_store import copy_name, write_copy
from ckptbench.tierspec import TiersSpec


def main() -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    base = Path(sys.argv[1])
    dirs = [base / "node0", base / "node1"]
    dirs[rank].mkdir(parents=True, exist_ok=True)
    tp = plan_tiers(TiersSpec(use=("memory",), ranks_per_node=1), ["h", "h"])
    assert tp is not None
    held = np.random.default_rng(11).integers(0, 256, 3 << 20, dtype=np.uint8)
    reads = [CopyRead(1, 4096, 1 << 20, 7, 0, 0),
             CopyRead(1, (2 << 20) + 8, 512 << 10, 7, 1 << 20, 1 << 20)]
    if rank == 0:
        r = plan_restart("process", 4, set(), reads, tp, 0, dirs[0], lambda f, o: "none")
    else:
        r = ReshardRestart("process", 4, set(), [], {}, np.empty(0, dtype=np.uint8))
    peers = MpiPeers(SimpleNamespace(c=comm, MPI=MPI))
    mover = Mover(rank, dirs[rank], np.ones(3 << 20, dtype=np.uint8), [], peers)
    mover.asked = comm.allgather(r.requests())
    gone = mover.move(r, False, None)
    assert gone == (["process 1 has no copy of process 1's shard"] if rank == 0 else []), gone
    comm.Barrier()
    if rank == 1:
        write_copy(dirs[1] / copy_name(1, 4), held)
    comm.Barrier()
    assert mover.move(r, False, "failed before" if rank == 0 else None) == []
    assert mover.move(r, False, None) == []
    if rank == 0:
        want = np.concatenate([held[4096:4096 + (1 << 20)],
                               held[(2 << 20) + 8:(2 << 20) + 8 + (512 << 10)]])
        assert np.array_equal(r.data, want)
    print(f"ok {rank}", flush=True)


if __name__ == "__main__":
    main()
