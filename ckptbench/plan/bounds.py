"""How big a plan would be, known before any planning work, and the limit on it.

Planning is linear in the items it handles: every rank of a pipeline stage holds a
piece of every tensor of that stage, once per state entry (weights, Adam moments,
master copy), and every file gets a name. A typo (``world_size = 10000000``) would
otherwise plan for minutes and fill memory. Planning costs about 1.5 us and 300 bytes
per item; the limit (about 25 s, 5 GB) is 4.5 times the largest shipped plan (Llama 3.1
405B on the 16,384-rank Llama 3 cluster: 3.5 million items, 2.8 million chunks), so the
same model on 65,536 ranks still plans.
"""

from __future__ import annotations

from ckptbench.errors import SpecError
from ckptbench.models import model_tensors
from ckptbench.spec import Workload

MAX_PLAN_ITEMS = 16_000_000
DLIO_TENSORS_PER_LAYER = 6  # plan.megatron: two norms, qkv, dense, h->4h, 4h->h
DLIO_OPTIMIZER_GROUPS = 6


def plan_items(w: Workload) -> int:
    """An upper estimate of the (rank, tensor piece) pairs and files a plan handles."""
    p = w.parallel
    ranks_per_stage = p.world_size // p.pp
    if p.layout == "megatron-deepspeed":
        # Each rank holds its stage's layers (+3 for embedding, head and final norm).
        layers = -(-w.model.layers // p.pp) + 3
        return p.world_size * (layers * DLIO_TENSORS_PER_LAYER + DLIO_OPTIMIZER_GROUPS + 2)
    adamw = w.state.optimizer == "adamw"
    # Per tensor: the weights, Adam's two moments, a master copy (sharded like the
    # weights), and Adam's step (one scalar for all holders).
    entries = 1 + 2 * adamw + (w.state.master_dtype != "none")
    tensors = len(model_tensors(w.model))
    files = p.world_size * w.checkpoint.threads
    return ranks_per_stage * tensors * entries + tensors * adamw + files


def check_plan_size(w: Workload) -> None:
    """Refuse a plan above MAX_PLAN_ITEMS with one line naming the fields that size it."""
    items = plan_items(w)
    if items > MAX_PLAN_ITEMS:
        p = w.parallel
        threads = w.checkpoint.threads
        also = f" x [checkpoint] threads = {threads}" if threads > 1 and p.layout == "fsdp2" else ""
        raise SpecError(
            f"plan too large: about {items:,} items from [parallel] world_size = {p.world_size:,}"
            f" / pp = {p.pp} and [model] layers = {w.model.layers}{also}; allowed: at most"
            f" {MAX_PLAN_ITEMS:,} items (--ranks runs a subset, but the plan covers every rank)"
        )
