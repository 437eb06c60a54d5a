"""Torch DCP's coordinator cost on a save, measured: what the job model charges for the
coordinator's part of C instead of ckptbench's own manifest encoder.

At every save DCP's coordinator (rank 0) receives every rank's local plan, deduplicates
them, builds the global plan and the ``Metadata`` of every chunk, validates it, sends the
plans back, and at the end indexes every chunk's storage location and pickles
``.metadata``: work that grows with the chunk count and that no other rank shares.
``benchmarks/dcp_coordinator_cost.py`` times these steps (in one process, on synthetic
FSDP plans of 172 chunks per rank) at increasing chunk counts, and a least-squares line
``seconds = a + b * chunks`` is fitted per plan-caching mode; the log of the run is
benchmarks/results/2026-12-dcp-coordinator.md. Writing ``.metadata`` is storage: the
job model takes it from the run (the manifest is as large).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    """seconds = a + b * chunks, and where the figures come from."""

    a_s: float
    b_s_per_chunk: float
    what: str
    source: str

    def seconds(self, chunks: int) -> float:
        return max(self.a_s + self.b_s_per_chunk * chunks, 0.0)

    def describe(self) -> str:
        return (f"{self.what}: {self.a_s:.3g} s + {self.b_s_per_chunk * 1e6:.3g} us per chunk,"
                f" {self.source}")


SOURCE = ("torch 2.15.0, CPython 3.11.7, CPU seconds on an AMD EPYC VM (2 vCPUs shared"
          " with other jobs), 11k-352k chunks fitted, 2026-12-03")

# DefaultSavePlanner(enable_plan_caching=False), DCP's default: every save plans anew.
DCP_SAVE_COORDINATOR = CostModel(-0.0827, 69.52e-6, "DCP's default planner, plan caching off",
                                 SOURCE)
# enable_plan_caching=True, a save after the first with unchanged plans: the ranks send
# empty plans and the coordinator reuses its cached global plan; .metadata is still
# indexed and pickled.
DCP_SAVE_CACHED = CostModel(-0.1185, 14.45e-6, "plan caching on, a save after the first",
                            SOURCE)
