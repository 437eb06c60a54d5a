"""Expert parallelism: routed experts split over an expert-parallel group.

As in torchtitan, the EP group is carved out of the FSDP shard dimension (ep innermost):
a rank's EP index is ``shard % ep`` and the stacked expert tensors [E, ...] are split on
dim 0 over it. FSDP then shards each EP piece over the rest of the shard dimension
(``shard // ep``), on dim 0 while there are enough local experts, else on dim 1.
"""

from __future__ import annotations

import numpy as np

from ckptbench.models import TensorDef
from ckptbench.plan.sharding import Split


def ep_splits(tensor: TensorDef, ep: int, shard_index: np.ndarray) -> list[Split]:
    if ep == 1 or not tensor.role.routed_experts:
        return []
    return [Split(0, ep, shard_index % ep)]


def expert_fsdp_split(
    tensor: TensorDef, ep: int, dp_shard: int, shard_index: np.ndarray
) -> Split:
    """The FSDP split of a routed-expert tensor that EP already split."""
    degree = dp_shard // ep
    local_experts = tensor.shape[0] // ep
    dim = 0 if local_experts >= degree else 1
    return Split(dim, degree, shard_index // ep)
