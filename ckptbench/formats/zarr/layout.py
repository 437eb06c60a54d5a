"""Arrays, shard grids and zarr v3 metadata for every key of a plan: pure arithmetic.

Geometry. A key's shard shape is, per dimension, the gcd of every chunk boundary inside
the tensor (chunk offsets, and chunk ends short of the edge). When the plan's chunks lie
on a regular grid (FSDP2/TP torch.chunk pieces: ceil-sized, the last ones smaller) that
is the largest chunk's size and each chunk is exactly one shard; otherwise (composed
TP+FSDP splits that do not nest) each chunk is cut into several whole shards, and a plan
needing more than ``MAX_SHARDS_PER_CHUNK`` per chunk is refused with one line. Chunks
must tile each tensor exactly (no overlaps): the megatron-deepspeed layout, whose ranks
write per-rank tensors under shared names, is refused. Edge shards are stored at full
shard shape, padded with the fill value (zarr's regular grid); the padding counts in the
stored bytes. Scalars (``step``) are unsharded 0-d arrays.

Dtypes. float32/float16 are stored as themselves; bfloat16, which zarr v3 has no core
type for, as a 2-byte ``uint16`` view with ``attributes.ckptbench.dtype = "bfloat16"``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import numpy as np

from ckptbench.errors import SpecError
from ckptbench.formats.codecs import CodecSpec
from ckptbench.formats.common import NP_DTYPES, check_tiling
from ckptbench.plan import Plan
from ckptbench.plan.sharding import MAX_DIMS

MAX_SHARDS_PER_CHUNK = 64


def _morton_order_iter(grid: tuple[int, ...]) -> Any:
    try:
        from zarr.core.indexing import morton_order_iter
    except ImportError:  # pragma: no cover - any order is valid zarr; Morton is zarr-python's
        return itertools.product(*(range(n) for n in grid))
    return morton_order_iter(grid)


def _view(buf: Any) -> memoryview:
    if buf is None:  # only with write_empty_chunks=False, which the encoder never sets
        raise AssertionError("zarr's codec pipeline dropped a chunk")
    return memoryview(buf.as_buffer_like())


def _uint64_dtype() -> Any:
    from zarr.core.dtype import UInt64

    return UInt64(endianness="little")


def _largest_divisor_at_most(n: int, k: int) -> int:
    best = 1
    for d in range(1, min(n, k) + 1):
        if n % d == 0:
            best = d
    return best


class ZarrLayout:
    """Arrays, shard grids and zarr metadata for every key of a plan (pure arithmetic)."""

    def __init__(self, plan: Plan, codec: CodecSpec) -> None:
        self.plan = plan
        self.codec = codec
        nkeys = len(plan.keys)
        glob = np.ones((nkeys, MAX_DIMS), dtype=np.int64)
        for k, key in enumerate(plan.keys):
            glob[k, :len(key.global_shape)] = key.global_shape
        nz = plan.chunk_nbytes > 0
        kid = plan.chunk_key[nz].astype(np.int64)
        off = plan.chunk_offsets[nz]
        end = off + plan.chunk_sizes[nz]
        g = np.zeros((nkeys, MAX_DIMS), dtype=np.int64)
        np.gcd.at(g, kid, off)
        np.gcd.at(g, kid, np.where(end < glob[kid], end, 0))
        self.glob = glob
        self.shard = np.where(g == 0, glob, g)
        self._metadata: dict[int, Any] = {}
        check_tiling(plan, "zarr")
        per_chunk = np.prod(-(-end // self.shard[kid]) - off // self.shard[kid], axis=1)
        if len(per_chunk) and per_chunk.max() > MAX_SHARDS_PER_CHUNK:
            i = int(np.argmax(per_chunk))
            k = int(kid[i])
            raise SpecError(
                f"--format zarr: the chunks of {plan.keys[k].name!r} do not lie on a regular "
                f"grid (their boundaries share only a shard shape of "
                f"{tuple(int(x) for x in self.shard[k, :self.ndim(k)])}, {int(per_chunk[i])} "
                f"shards for one chunk; at most {MAX_SHARDS_PER_CHUNK} allowed); allowed: "
                "--format raw or torch-dcp, or a layout whose splits nest")

    # --- per key ---
    def ndim(self, k: int) -> int:
        return len(self.plan.keys[k].global_shape)

    def shard_shape(self, k: int) -> tuple[int, ...]:
        return tuple(int(x) for x in self.shard[k, :self.ndim(k)])

    def inner_chunk_shape(self, k: int) -> tuple[int, ...]:
        shard = self.shard_shape(k)
        if not shard:
            return ()
        n = _largest_divisor_at_most(shard[0], self.codec.inner_chunks)
        return (shard[0] // n, *shard[1:])

    def np_dtype(self, k: int) -> np.dtype[Any]:
        return NP_DTYPES[self.plan.keys[k].dtype]

    def metadata(self, k: int) -> Any:
        return self._metadata[k] if k in self._metadata else self._build(k)

    def _build(self, k: int) -> Any:
        import zarr.codecs as zc
        from zarr.core.dtype import parse_dtype
        from zarr.core.metadata.v3 import ArrayV3Metadata

        key = self.plan.keys[k]
        dtype = self.np_dtype(k)
        compressors = self.codec.zarr_compressors(dtype.itemsize)
        shard = self.shard_shape(k)
        inner = self.inner_chunk_shape(k)
        if shard:
            codecs: list[Any] = [zc.ShardingCodec(
                chunk_shape=inner, codecs=[zc.BytesCodec(), *compressors],
                index_codecs=[zc.BytesCodec(), zc.Crc32cCodec()], index_location="end")]
        else:
            codecs = [zc.BytesCodec(), *compressors]
        n_inner = shard[0] // inner[0] if shard else 1
        attrs: dict[str, Any] = {"ckptbench": {"key": key.name, "dtype": key.dtype, "stored_as": str(dtype),
                               "inner_chunks": n_inner, "codec": self.codec.text()}}
        meta = ArrayV3Metadata(
            shape=key.global_shape, data_type=parse_dtype(dtype, zarr_format=3),
            chunk_grid={"name": "regular", "configuration": {"chunk_shape": shard}},
            chunk_key_encoding={"name": "default", "configuration": {"separator": "/"}},
            fill_value=0, codecs=codecs, attributes=attrs, dimension_names=None)
        self._metadata[k] = meta
        return meta

    def metadata_json(self, k: int) -> bytes:
        from zarr.core.buffer import default_buffer_prototype

        data: bytes = self.metadata(k).to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes()
        return data

    def group_json(self) -> bytes:
        attrs = {"ckptbench": {"format": "zarr", "codec": self.codec.to_dict(),
                               "workload": self.plan.workload.name, "arrays": len(self.plan.keys)}}
        return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attrs},
                          indent=2).encode()

    def pieces(self, k: int, offsets: tuple[int, ...], sizes: tuple[int, ...]
               ) -> list[tuple[tuple[int, ...], tuple[slice, ...], tuple[int, ...]]]:
        """(shard coords, slice of the chunk, valid extent) of each shard a chunk covers."""
        nd = self.ndim(k)
        if nd == 0:
            return [((), (), ())]
        shard = self.shard_shape(k)
        glob = self.plan.keys[k].global_shape
        ranges = [range(o // s, -(-(o + n) // s)) for o, n, s in zip(offsets, sizes, shard, strict=True)]
        out = []
        for coords in itertools.product(*ranges):
            start = [c * s for c, s in zip(coords, shard, strict=True)]
            stop = [min(a + s, g) for a, s, g in zip(start, shard, glob, strict=True)]
            src = tuple(slice(a - o, b - o) for a, b, o in zip(start, stop, offsets, strict=True))
            out.append((coords, src, tuple(b - a for a, b in zip(start, stop, strict=True))))
        return out

    def chunk_key(self, k: int, coords: tuple[int, ...]) -> str:
        return f"{self.plan.keys[k].name}/{self.metadata(k).encode_chunk_key(coords)}"

    def encode_shard(self, k: int, block: np.ndarray, loop: asyncio.AbstractEventLoop
                     ) -> list[memoryview]:
        """One whole shard (a C-contiguous array of the shard's shape) as the byte parts of
        its object, in order: zarr's codec pipeline encodes every inner chunk, and the
        shard index (offset and length of each inner chunk, C order; chunks laid out in
        Morton order; then zarr's index codecs: bytes + crc32c) goes last, exactly as
        zarr's sharding codec lays a shard out (tests compare the bytes). The parts are
        written back to back instead of being concatenated in memory first."""
        from zarr.core.array_spec import ArrayConfig, ArraySpec
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.buffer.cpu import NDBuffer
        from zarr.core.codec_pipeline import BatchedCodecPipeline

        meta = self.metadata(k)
        config = ArrayConfig(order="C", write_empty_chunks=True)
        proto = default_buffer_prototype()
        if not self.ndim(k):  # a scalar: no sharding codec
            spec = ArraySpec(shape=(), dtype=meta.data_type, fill_value=meta.fill_value,
                             config=config, prototype=proto)
            pipeline = BatchedCodecPipeline.from_codecs(meta.codecs)
            (buf,) = loop.run_until_complete(pipeline.encode([(NDBuffer.from_numpy_array(block),
                                                               spec)]))
            return [_view(buf)]
        sharding = meta.codecs[0]
        inner = tuple(sharding.chunk_shape)
        grid = tuple(s // c for s, c in zip(block.shape, inner, strict=True))
        order = list(_morton_order_iter(grid))
        spec = ArraySpec(shape=inner, dtype=meta.data_type, fill_value=meta.fill_value,
                         config=config, prototype=proto)
        batch = []
        for coords in order:
            sub = block[tuple(slice(c * n, (c + 1) * n) for c, n in zip(coords, inner, strict=True))]
            batch.append((NDBuffer.from_numpy_array(sub if sub.flags.c_contiguous
                                                    else np.ascontiguousarray(sub)), spec))
        encoded = loop.run_until_complete(
            BatchedCodecPipeline.from_codecs(sharding.codecs).encode(batch))
        index = np.empty((*grid, 2), dtype="<u8")
        parts: list[memoryview] = []
        pos = 0
        for coords, buf in zip(order, encoded, strict=True):
            view = _view(buf)
            index[coords] = (pos, len(view))
            pos += len(view)
            parts.append(view)
        index_spec = ArraySpec(shape=index.shape, dtype=_uint64_dtype(), fill_value=2**64 - 1,
                               config=config, prototype=proto)
        (index_bytes,) = loop.run_until_complete(
            BatchedCodecPipeline.from_codecs(sharding.index_codecs).encode(
                [(NDBuffer.from_numpy_array(index), index_spec)]))
        parts.append(_view(index_bytes))
        return parts
