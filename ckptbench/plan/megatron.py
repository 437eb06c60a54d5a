"""The Megatron-DeepSpeed layout as DLIO writes it for MLPerf Storage checkpointing.

Sizes and names follow DLIO's checkpointing code (the ``mlperf_storage_v2.0`` branch
that MLPerf Storage v2.0 pins), so the four MLPerf workloads come out file for file:

* ranks: tp index ``r % tp``, pipeline stage ``(r // tp) % pp``, data-parallel index
  ``r // (tp*pp)``, model-parallel index ``r % (tp*pp)``;
* layer indices 0..L+2: 0 the embedding, 1..L the transformer layers (the first
  ``L % pp`` stages take one extra), L+1 the output head, L+2 the final norm; stage 0
  starts at 0 and the last stage runs to L+2;
* a transformer layer holds six tensors (two norms, qkv, dense, h->4h, 4h->h); the
  matrices are divided by tp, and with ZeRO-3 everything is divided by dp too;
* ZeRO 1/2: data-parallel rank 0 writes ``layer_{i}-model_{mp}_model_states.pt`` per
  layer (one ``model_{mp}_model_states.pt`` when pp = 1); ZeRO 3: every rank writes
  ``zero_pp_rank_{dp}_mp_rank_{mp}_model_states.pt``;
* every rank writes ``zero_pp_rank_{dp}_mp_rank_{mp}_optim_states.pt`` holding three
  groups of ``P // world`` parameters and three of ``5*h`` in the optimizer dtype
  (fp32 master, momentum, variance: with fp16 weights, 14 bytes per parameter);
* directory ``global_epoch{E}_step{S}``.

DLIO's own parameter count is used (it counts norms once per layer and omits nothing
else), not the catalogue's, because the files must match DLIO's byte for byte.
"""

from __future__ import annotations

import numpy as np

from ckptbench.plan.core import Plan, StateKey, finalize
from ckptbench.plan.sharding import MAX_DIMS
from ckptbench.spec import DTYPE_BYTES, ModelSpec, Workload


def dlio_parameters(m: ModelSpec) -> int:
    h, f, v = m.dim, m.ffn_dim, m.vocab_size
    dkv = m.resolved_head_dim * m.kv_heads
    per_layer = h + h * (h + 2 * dkv) + h * h + h + f * 2 * h + f * h
    return v * h + per_layer * m.layers + h + v * h


def layer_tensors(m: ModelSpec, index: int, tp: int, shard: int) -> list[int]:
    """Element counts of the tensors of DLIO layer `index` (0..L+2) on one rank."""
    h, f, v, L = m.dim, m.ffn_dim, m.vocab_size, m.layers
    dkv = m.resolved_head_dim * m.kv_heads
    if index in (0, L + 1):
        return [h * v // tp // shard]
    if index == L + 2:
        return [h // shard]
    return [h // shard, h * (h + 2 * dkv) // tp // shard, h * h // tp // shard, h // shard,
            h * 2 * f // tp // shard, h * f // tp // shard]


def stage_layers(layers: int, pp: int, stage: int) -> range:
    base, extra = divmod(layers, pp)
    start = 1 + stage * base + min(stage, extra)
    end = start + base + (1 if stage < extra else 0) - 1
    if stage == 0:
        start = 0
    if stage == pp - 1:
        end = layers + 2
    return range(start, end + 1)


def build_megatron_plan(w: Workload) -> Plan:
    m, p, s = w.model, w.parallel, w.state
    tp, pp, world = p.tp, p.pp, p.world_size
    mp = tp * pp
    dp = world // mp
    shard = dp if p.zero_stage == 3 else 1
    wsize = DTYPE_BYTES[s.param_dtype]
    osize = DTYPE_BYTES[s.optimizer_dtype]
    n_opt = dlio_parameters(m) // (dp * mp)
    opt_groups = [n_opt, 5 * m.dim] * 3

    keys: list[StateKey] = []
    key_ids: dict[tuple[str, str, int], int] = {}

    def key_id(name: str, dtype: str, numel: int) -> int:
        k = (name, dtype, numel)
        if k not in key_ids:
            key_ids[k] = len(keys)
            keys.append(StateKey(name, dtype, (numel,)))
        return key_ids[k]

    chunk_key: list[int] = []
    chunk_nbytes: list[int] = []
    chunk_file: list[int] = []
    chunk_elems: list[int] = []
    file_paths: list[str] = []
    file_rank: list[int] = []

    def add_file(rank: int, name: str, tensors: list[tuple[str, str, int]]) -> None:
        fid = len(file_paths)
        file_paths.append(name)
        file_rank.append(rank)
        for tname, dtype, numel in tensors:
            chunk_key.append(key_id(tname, dtype, numel))
            chunk_nbytes.append(numel * DTYPE_BYTES[dtype])
            chunk_file.append(fid)
            chunk_elems.append(numel)

    for rank in range(world):
        tp_r, pp_r, dp_r, mp_r = rank % tp, (rank // tp) % pp, rank // mp, rank % mp
        del tp_r
        layers = stage_layers(m.layers, pp, pp_r)

        def layer_entries(li: int) -> list[tuple[str, str, int]]:
            return [(f"layer_{li}.{j}", s.param_dtype, n)
                    for j, n in enumerate(layer_tensors(m, li, tp, shard))]

        if p.zero_stage in (1, 2):
            if dp_r == 0:
                if pp > 1:
                    for li in layers:
                        add_file(rank, f"layer_{li}-model_{mp_r}_model_states.pt",
                                 layer_entries(li))
                else:
                    add_file(rank, f"model_{mp_r}_model_states.pt",
                             [e for li in layers for e in layer_entries(li)])
        else:
            add_file(rank, f"zero_pp_rank_{dp_r}_mp_rank_{mp_r}_model_states.pt",
                     [e for li in layers for e in layer_entries(li)])
        add_file(rank, f"zero_pp_rank_{dp_r}_mp_rank_{mp_r}_optim_states.pt",
                 [(f"optimizer.group_{j}", s.optimizer_dtype, n)
                  for j, n in enumerate(opt_groups)])
    del wsize, osize

    n = len(chunk_key)
    offsets = np.zeros((n, MAX_DIMS), dtype=np.int64)
    sizes = np.ones((n, MAX_DIMS), dtype=np.int64)
    sizes[:, 0] = chunk_elems
    return finalize(
        w, keys, np.array(chunk_key, dtype=np.int32), offsets, sizes,
        np.array(chunk_nbytes, dtype=np.int64), np.array(chunk_file, dtype=np.int64),
        file_paths, np.array(file_rank, dtype=np.int64), checkpoint_dir="global_epoch1_step{step}",
    )
