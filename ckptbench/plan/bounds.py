"""How much memory a plan would take, known before any planning work, and the limit on it.

Planning is linear in the items it handles: every rank of a pipeline stage holds a
piece of every tensor of that stage, once per state entry (weights, Adam moments,
master copy), and every file gets a name. A typo (``world_size = 10000000``) would
otherwise plan for minutes and fill memory, so the plan's memory is estimated from the
item count and refused, in one line, when it exceeds what this machine has available
(MemAvailable, and the process's address-space limit if lower).

The coefficients are measured peaks (resident memory above the interpreter's after
imports, the planner's temporaries included; benchmarks/plan_scale.py, recorded in
benchmarks/results/2026-12-plan-scale.md): Llama 3.1 405B on 16,384 ranks (3.5 million
items) and on 131,072 ranks (28 million items) plan in 71 and 53 bytes per item; their
DCP restore plans onto one data-parallel group fewer add 21 and 11 bytes per estimated
read (7.0 and 56 million estimated, 7.3 and 43 million actual reads). The estimate
rounds these up. A file name costs about 150 bytes (its string in the plan's tuple), a
per-chunk file name per item as much again.
"""

from __future__ import annotations

import resource

import psutil

from ckptbench.errors import SpecError
from ckptbench.models import model_tensors
from ckptbench.spec import ParallelSpec, Workload
from ckptbench.units import format_size

BYTES_PER_ITEM = 80
BYTES_PER_FILE = 150
BYTES_PER_READ = 24
MEMORY_SHARE = 0.9  # of the available memory a plan may take
DLIO_TENSORS_PER_LAYER = 6  # plan.megatron: two norms, qkv, dense, h->4h, 4h->h
DLIO_OPTIMIZER_GROUPS = 6


def plan_items(w: Workload, p: ParallelSpec | None = None) -> int:
    """An upper estimate of the (rank, tensor piece) pairs and files a plan handles
    (for layout `p`, the workload's own by default)."""
    p = p or w.parallel
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


def plan_bytes(w: Workload) -> int:
    """Estimated peak memory of planning `w` (bytes)."""
    items = plan_items(w)
    files = w.parallel.world_size * w.checkpoint.threads
    per_item = BYTES_PER_ITEM + (BYTES_PER_FILE if w.checkpoint.files == "per-chunk" else 0)
    return items * per_item + files * BYTES_PER_FILE


def restore_reads(w: Workload) -> int:
    """An upper estimate of the reads of the restore plan: two partitions of a tensor
    into n and m pieces overlap in at most n + m - 1 pairs, so the restore layout's
    items plus the saved ones."""
    return plan_items(w, w.restore_parallel) + plan_items(w)


def available_memory() -> int:
    """Bytes this process may still take: MemAvailable, or the address-space limit
    (ulimit -v) when that is lower."""
    available = int(psutil.virtual_memory().available)
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        available = min(available, max(0, soft - psutil.Process().memory_info().vms))
    return available


def _allowed(available: int | None) -> tuple[int, str]:
    available = available_memory() if available is None else available
    return int(MEMORY_SHARE * available), (f"{MEMORY_SHARE:.0%} of the {format_size(available)}"
                                           " this machine has available")


def check_plan_size(w: Workload, available: int | None = None) -> None:
    """Refuse a plan whose estimated memory exceeds what is available, in one line naming
    the fields that size it, before any planning work."""
    need = plan_bytes(w)
    allowed, have = _allowed(available)
    if need > allowed:
        p = w.parallel
        threads = w.checkpoint.threads
        also = f" x [checkpoint] threads = {threads}" if threads > 1 and p.layout == "fsdp2" else ""
        raise SpecError(
            f"plan too large: about {plan_items(w):,} items, an estimated {format_size(need)} to"
            f" plan, from [parallel] world_size = {p.world_size:,} / pp = {p.pp} and [model]"
            f" layers = {w.model.layers}{also}; allowed: at most {format_size(allowed)}"
            f" ({have}; --ranks runs a subset, but the plan covers every rank)")


def check_restore_size(w: Workload, available: int | None = None) -> None:
    """Refuse a restore plan whose estimated memory exceeds what is still available, in
    one line naming the restore layout, before its planning work."""
    reads = restore_reads(w)
    need = reads * BYTES_PER_READ
    allowed, have = _allowed(available)
    if need > allowed:
        r = w.restore_parallel
        raise SpecError(
            f"restore plan too large: about {reads:,} reads, an estimated {format_size(need)}"
            f" to plan, from the restore layout's world_size = {r.world_size:,} / pp = {r.pp}"
            f" ([restore] or --restore-world-size) and [model] layers = {w.model.layers};"
            f" allowed: at most {format_size(allowed)} ({have})")
