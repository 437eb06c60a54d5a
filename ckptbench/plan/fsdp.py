"""FSDP2 and HSDP: every parameter sharded on dim 0 over the shard group, torch.chunk style.

HSDP adds replica groups (``dp_replicate``) that hold identical shards; DCP's dedup then
picks one writer per replicated chunk.
"""

from __future__ import annotations

import numpy as np

from ckptbench.models import TensorDef
from ckptbench.plan.expert import expert_fsdp_split
from ckptbench.plan.sharding import Split


def fsdp_splits(tensor: TensorDef, dp_shard: int, ep: int, shard_index: np.ndarray) -> list[Split]:
    if dp_shard == 1 or not tensor.shape:
        return []
    if ep > 1 and tensor.role.routed_experts:
        return [expert_fsdp_split(tensor, ep, dp_shard, shard_index)]
    return [Split(0, dp_shard, shard_index)]
