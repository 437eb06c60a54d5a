"""Pipeline parallelism: which stage holds which tensors.

Contiguous layer ranges, as even as possible (the first `layers % pp` stages take one
more); embeddings go to the first stage, the final norm and output to the last.
"""

from __future__ import annotations

from ckptbench.models import TensorDef


def layer_ranges(layers: int, stages: int) -> list[range]:
    base, extra = divmod(layers, stages)
    out, start = [], 0
    for s in range(stages):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def stage_of(tensor: TensorDef, ranges: list[range]) -> int:
    if tensor.position == "first":
        return 0
    if tensor.position == "last":
        return len(ranges) - 1
    assert tensor.layer is not None
    for s, r in enumerate(ranges):
        if tensor.layer in r:
            return s
    raise ValueError(f"layer {tensor.layer} outside every stage")


def split_by_stage(tensors: list[TensorDef], layers: int, stages: int) -> list[list[TensorDef]]:
    """Tensors of each stage, in model order (= each stage module's state-dict order)."""
    ranges = layer_ranges(layers, stages)
    out: list[list[TensorDef]] = [[] for _ in range(stages)]
    for t in tensors:
        out[stage_of(t, ranges)].append(t)
    return out
