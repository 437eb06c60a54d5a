"""The device mesh of the DCP/torchtitan family: rank <-> (pp, dp_replicate, dp_shard, tp).

torchtitan orders mesh dimensions ("pp", "dp_replicate", "dp_shard", "cp", "tp") with tp
innermost, so rank = ((pp * dp_replicate + rep) * dp_shard + shard) * tp + tp_index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckptbench.spec import ParallelSpec


@dataclass(frozen=True)
class StageMesh:
    """Coordinates of the ranks of one pipeline stage, as arrays indexed alike."""

    ranks: np.ndarray
    rep: np.ndarray
    shard: np.ndarray
    tp: np.ndarray


def stage_mesh(p: ParallelSpec, stage: int) -> StageMesh:
    per_stage = p.world_size // p.pp
    local = np.arange(per_stage, dtype=np.int64)
    return StageMesh(
        ranks=(stage * per_stage + local).astype(np.int32),
        rep=local // (p.dp_shard * p.tp),
        shard=(local // p.tp) % p.dp_shard,
        tp=local % p.tp,
    )
