"""Tensor parallelism with torchtitan's Llama plan.

Column-wise (dim 0) for wq, wk, wv, w1, w3 and output; row-wise (dim 1) for wo and w2;
tok_embeddings sharded on the vocabulary (dim 0); norms and the router replicated;
stacked routed experts split on their hidden dimension (w1/w3 dim 2, w2 dim 1).
"""

from __future__ import annotations

import numpy as np

from ckptbench.models import TensorDef
from ckptbench.plan.sharding import Split


def tp_splits(tensor: TensorDef, tp: int, tp_index: np.ndarray) -> list[Split]:
    dim = tensor.role.tp_dim
    if tp == 1 or dim is None:
        return []
    return [Split(dim, tp, tp_index)]
