"""The order in which a run's checkpoints are written and read back.

``interleaved`` (ckptbench's default): each checkpoint is written, evicted from caches,
read back and removed before the next one is written, so only one checkpoint is ever on
the target.

``writes-then-reads`` (MLPerf Storage v2.0, DLIO's ``_checkpoint_write`` then
``_checkpoint_read``): all N checkpoints are written, then read back in the order they
were written, read i reading checkpoint i (DLIO loads ``global_epoch1_step{i}``); each is
evicted just before its read and removed after it. N checkpoints are on the target at
once, and the first ones are read after the later writes have passed through the caches.

The driver walks the steps; a step says whether it saves, reads (evict, restore,
cleanup), or both.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, get_args

from ckptbench.errors import SpecError

RunSequence = Literal["interleaved", "writes-then-reads"]
SEQUENCES: tuple[str, ...] = get_args(RunSequence)


@dataclass(frozen=True)
class Step:
    """One step of the loop for checkpoint `iteration`: write it, read it back, or both."""

    iteration: int
    save: bool
    read: bool


def check_sequence(sequence: str) -> None:
    """One line naming the option and what is allowed (SpecError: exit status 2)."""
    if sequence not in SEQUENCES:
        raise SpecError(f"--sequence {sequence!r}: allowed: {', '.join(SEQUENCES)}")


def steps(sequence: str, iterations: int) -> Iterator[Step]:
    """The steps of `iterations` checkpoints in `sequence` order."""
    check_sequence(sequence)
    if sequence == "interleaved" or iterations == 1:
        for it in range(1, iterations + 1):
            yield Step(it, save=True, read=True)
        return
    for it in range(1, iterations + 1):
        yield Step(it, save=True, read=False)
    for it in range(1, iterations + 1):
        yield Step(it, save=False, read=True)


__all__ = ["SEQUENCES", "RunSequence", "Step", "check_sequence", "steps"]
