"""Pure arithmetic from a workload to a Plan: per-rank chunks, their files, their writers.

One module per concern: ``sharding`` (torch.chunk arithmetic), ``mesh``, ``fsdp``,
``tensor_parallel``, ``pipeline``, ``expert``, ``state`` (state-dict keys), ``dedup``
(DCP's writer choice), ``files`` (grouping), and the two layout families ``dtensor``
(FSDP2/HSDP/TP/PP/EP as DCP saves them) and ``megatron`` (DLIO's Megatron-DeepSpeed).
"""

from __future__ import annotations

from ckptbench.plan.bounds import check_plan_size
from ckptbench.plan.core import MANIFEST_NAME, PLAN_SCHEMA, ChunkView, Plan, StateKey
from ckptbench.spec import Workload

__all__ = ["MANIFEST_NAME", "PLAN_SCHEMA", "ChunkView", "Plan", "StateKey", "build_plan"]


def build_plan(workload: Workload) -> Plan:
    """Every chunk each rank writes; refused first if it would be too big to plan."""
    check_plan_size(workload)
    if workload.parallel.layout == "megatron-deepspeed":
        from ckptbench.plan.megatron import build_megatron_plan

        return build_megatron_plan(workload)
    from ckptbench.plan.dtensor import build_dtensor_plan

    return build_dtensor_plan(workload)
