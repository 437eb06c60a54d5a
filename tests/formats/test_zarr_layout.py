"""The zarr layout: shard grids from the plan's chunks, metadata, and shard bytes."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import numpy as np
import pytest

from ckptbench.errors import SpecError
from ckptbench.formats.codecs import parse_codec
from ckptbench.formats.zarr import MAX_SHARDS_PER_CHUNK, ZarrLayout
from ckptbench.plan import Plan, build_plan
from ckptbench.spec import load_workload, parse_workload

from .conftest import ROOT, TINY


def plan_of(world: int, tp: int, *, dim: int = 64, ffn: int = 72, vocab: int = 100,
            param_dtype: str = "float32") -> Plan:
    return build_plan(parse_workload({
        "model": {"name": "custom", "layers": 1, "dim": dim, "heads": 8, "kv_heads": 4,
                  "ffn_dim": ffn, "vocab_size": vocab},
        "state": {"param_dtype": param_dtype},
        "parallel": {"world_size": world, "tp": tp},
    }))


def chunks(plan: Plan) -> list[Any]:
    return [plan.chunk(i) for i in range(plan.n_chunks) if plan.chunk_nbytes[i]]


def key_index(plan: Plan, name: str) -> int:
    return [k.name for k in plan.keys].index(name)


def test_fsdp_tp_chunks_are_one_shard_each() -> None:
    plan = build_plan(load_workload(TINY))  # FSDP2 x TP2 over 4 ranks
    lay = ZarrLayout(plan, parse_codec("none"))
    for c in chunks(plan):
        k = key_index(plan, c.key)
        pieces = lay.pieces(k, c.offsets, c.sizes)
        assert len(pieces) == 1, c
        _coords, _src, valid = pieces[0]
        assert valid == c.sizes
        if c.sizes:
            assert lay.shard_shape(k) == tuple(
                max(x.sizes[d] for x in chunks(plan) if x.key == c.key) for d in range(len(c.sizes)))


def test_uneven_torch_chunk_pieces_keep_the_ceil_grid() -> None:
    # vocab 100 over 8 FSDP ranks: torch.chunk pieces of 13 (7 x 13 + 9).
    plan = plan_of(8, 1, vocab=100)
    lay = ZarrLayout(plan, parse_codec("none"))
    k = key_index(plan, "model.tok_embeddings.weight")
    assert lay.shard_shape(k) == (13, 64)
    sizes = sorted(c.sizes[0] for c in chunks(plan) if c.key == "model.tok_embeddings.weight")
    assert sizes == [9] + [13] * 7
    last = next(c for c in chunks(plan) if c.key == "model.tok_embeddings.weight" and c.sizes[0] == 9)
    ((coords, _src, valid),) = lay.pieces(k, last.offsets, last.sizes)
    assert coords == (7, 0) and valid == (9, 64)  # the edge shard, padded to 13 rows on disk


def test_composed_splits_that_do_not_nest_fall_back_to_whole_smaller_shards() -> None:
    # ffn 72, TP 2 -> 36 rows, FSDP 5 -> pieces of 8,8,8,8,4: boundaries share only 4 rows.
    plan = plan_of(10, 2, ffn=72)
    lay = ZarrLayout(plan, parse_codec("none"))
    k = key_index(plan, "model.layers.0.feed_forward.w1.weight")
    assert lay.shard_shape(k) == (4, 64)
    for c in chunks(plan):
        if c.key != plan.keys[k].name:
            continue
        pieces = lay.pieces(k, c.offsets, c.sizes)
        assert len(pieces) == c.sizes[0] // 4
        covered = np.zeros(c.sizes, dtype=int)
        for _coords, src, valid in pieces:
            covered[src] += 1
            assert valid == (4, 64)
        assert (covered == 1).all()  # whole shards that tile the chunk exactly


def test_too_many_shards_per_chunk_is_one_line() -> None:
    plan = plan_of(6, 2, ffn=688, dim=64)  # TP pieces of 344 rows cut in 115,115,114
    with pytest.raises(SpecError, match="do not lie on a regular grid") as err:
        ZarrLayout(plan, parse_codec("none"))
    assert "\n" not in str(err.value) and f"at most {MAX_SHARDS_PER_CHUNK}" in str(err.value)


def test_megatron_plans_are_refused() -> None:
    plan = build_plan(load_workload(ROOT / "workloads" / "mlperf-llama3-8b.toml"))
    with pytest.raises(SpecError, match=r"tile each tensor exactly.*overlap.*megatron"):
        ZarrLayout(plan, parse_codec("none"))


def test_inner_chunks_divide_the_shard() -> None:
    plan = plan_of(8, 1, vocab=100)
    k = key_index(plan, "model.tok_embeddings.weight")  # shard (13, 64): 13 is prime
    assert ZarrLayout(plan, parse_codec("none:inner_chunks=4")).inner_chunk_shape(k) == (13, 64)
    k2 = key_index(plan, "model.layers.0.attention.wq.weight")  # shard (8, 64)
    lay = ZarrLayout(plan, parse_codec("none:inner_chunks=4"))
    assert lay.inner_chunk_shape(k2) == (2, 64)
    meta = json.loads(lay.metadata_json(k2))
    assert meta["attributes"]["ckptbench"]["inner_chunks"] == 4
    assert meta["codecs"][0]["configuration"]["chunk_shape"] == [2, 64]


def test_metadata_records_the_true_dtype() -> None:
    plan = plan_of(2, 1, param_dtype="bfloat16")
    lay = ZarrLayout(plan, parse_codec("zstd"))
    w = json.loads(lay.metadata_json(key_index(plan, "model.layers.0.attention.wq.weight")))
    assert w["data_type"] == "uint16" and w["shape"] == [64, 64]
    assert w["attributes"]["ckptbench"]["dtype"] == "bfloat16"
    assert w["chunk_grid"]["configuration"]["chunk_shape"] == [32, 64]
    sharding = w["codecs"][0]
    assert sharding["name"] == "sharding_indexed"
    assert [c["name"] for c in sharding["configuration"]["codecs"]] == ["bytes", "zstd"]
    assert [c["name"] for c in sharding["configuration"]["index_codecs"]] == ["bytes", "crc32c"]
    m = json.loads(lay.metadata_json(key_index(plan, "optim.state.layers.0.attention.wq.weight.exp_avg")))
    assert m["data_type"] == "float32" and m["attributes"]["ckptbench"]["dtype"] == "float32"
    step = json.loads(lay.metadata_json(key_index(plan, "optim.state.layers.0.attention.wq.weight.step")))
    assert step["shape"] == [] and step["codecs"][0]["name"] == "bytes"
    group = json.loads(lay.group_json())
    assert group["node_type"] == "group" and group["attributes"]["ckptbench"]["format"] == "zarr"


def zarr_own_encoding(lay: ZarrLayout, k: int, block: np.ndarray) -> bytes:
    """The shard as zarr-python's sharding codec encodes it."""
    from zarr.core.array_spec import ArrayConfig, ArraySpec
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.buffer.cpu import NDBuffer
    from zarr.core.codec_pipeline import BatchedCodecPipeline
    from zarr.core.sync import sync

    meta = lay.metadata(k)
    spec = ArraySpec(shape=block.shape, dtype=meta.data_type, fill_value=meta.fill_value,
                     config=ArrayConfig(order="C", write_empty_chunks=True),
                     prototype=default_buffer_prototype())
    (buf,) = sync(BatchedCodecPipeline.from_codecs(meta.codecs).encode(
        [(NDBuffer.from_numpy_array(block), spec)]))
    return buf.to_bytes()


@pytest.mark.parametrize("codec", ["none", "none:inner_chunks=4", "zstd", "lz4",
                                   "blosc:shuffle=byte,inner_chunks=2", "blosc:shuffle=bit"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_shards_are_byte_identical_to_zarrs_sharding_codec(codec: str, dtype: str) -> None:
    plan = plan_of(2, 1, param_dtype=dtype)
    lay = ZarrLayout(plan, parse_codec(codec))
    loop = asyncio.new_event_loop()
    rng = np.random.default_rng(1)
    try:
        for name in ("model.layers.0.attention.wq.weight", "model.norm.weight",
                     "optim.state.layers.0.attention.wq.weight.step"):
            k = key_index(plan, name)
            shard = lay.shard_shape(k)
            block = (rng.standard_normal(shard) * 0.02).astype(np.float32)
            block = block.view(np.uint32).__rshift__(16).astype(np.uint16) \
                if lay.np_dtype(k).itemsize == 2 else block
            mine = b"".join(bytes(p) for p in lay.encode_shard(k, block, loop))
            assert mine == zarr_own_encoding(lay, k, block), name
            assert len(mine) >= (math.prod(shard) * block.itemsize if codec.startswith("none") else 1)
    finally:
        loop.close()
