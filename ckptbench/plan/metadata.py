"""How big DCP's ``.metadata`` is for a plan: what every restoring rank reads first.

``.metadata`` is a pickle of DCP's ``Metadata``: per state-dict key its properties and
chunk list, and per chunk its storage entry (file, offset, length). Its size is linear in
keys and chunks. The two coefficients come from real files written by torch 2.15 for
one model at two plan sizes (tests/golden/dcp_restore: ``fsdp2_to_fsdp4`` saves 147
chunks in a 40,883-byte file, ``fsdp4_to_fsdp3`` 273 chunks in 62,495 bytes, both with 84
tensor keys and 12 param_group items): 172 bytes per chunk entry (171.5), 162 per key. The tests
check the model against every golden's ``.metadata`` (within 5 %).
"""

from __future__ import annotations

from ckptbench.plan.core import Plan
from ckptbench.plan.state import PARAM_GROUP_ITEMS

BYTES_PER_CHUNK = 172
BYTES_PER_KEY = 162


def dcp_metadata_bytes(plan: Plan) -> int:
    """DCP ``.metadata`` bytes of the whole plan (all ranks, full chunk count); 0 for the
    Megatron-DeepSpeed layout, which DLIO saves without one."""
    w = plan.workload
    if w.parallel.layout == "megatron-deepspeed":
        return 0
    keys = len(plan.keys) + (len(PARAM_GROUP_ITEMS) if w.state.optimizer == "adamw" else 0)
    return BYTES_PER_KEY * keys + BYTES_PER_CHUNK * plan.n_chunks
