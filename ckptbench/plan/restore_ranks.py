"""Which restore ranks a run restores and which of them each of its processes runs: pure
rank arithmetic on the save and restore layouts' sizes, shared by the formats' restores,
the fill-ins, the tiers and the runner (so none of them reaches into another for it)."""

from __future__ import annotations

import numpy as np


def restoring_ranks(all_ranks: list[int], save_world: int, restore_world: int) -> list[int]:
    """The ranks of the restore layout a run restores: all of them, or, for a subset run,
    the subset's ranks that exist in the restore layout."""
    if len(all_ranks) == save_world:
        return list(range(restore_world))
    return [r for r in all_ranks if r < restore_world]


def restore_positions(my_ranks: list[int], all_ranks: list[int], save_world: int,
                      restore_world: int, shift: int) -> list[int]:
    """Restore ranks this process runs. The run's processes (plan-rank positions) share
    the restore layout's ranks in contiguous groups; a subset run restores the ranks of
    the subset that exist in the restore layout. `shift` moves each position's group on
    by that many positions (no process reads back what its node wrote)."""
    ranks = restoring_ranks(all_ranks, save_world, restore_world)
    n = len(all_ranks)
    groups = [g.tolist() for g in np.array_split(np.array(ranks, dtype=np.int64), n)]
    pos = {r: k for k, r in enumerate(all_ranks)}
    return [x for r in my_ranks for x in groups[(pos[r] + shift) % n]]
