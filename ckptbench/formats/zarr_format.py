"""The ``zarr`` format: one zarr v3 array per state-dict key, each rank writing whole shards.

Layout of one checkpoint ``<run>/<checkpoint>/``::

    zarr.json                       the group (attributes: format, codec, workload)
    <state-dict key>/zarr.json      one array per key, shape = the key's global shape
    <state-dict key>/c/<i>/<j>      one shard object per shard-grid cell
    .metadata                       ckptbench's manifest (written last: the commit)

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

Timing. Every process builds all arrays' metadata in memory before the clock starts.
Inside the timed save, the group and array ``zarr.json`` objects are written (op
``write_meta``, durable like the data; spread round-robin over the running ranks, the
group by process 0), before the shards, while every rank encodes its shards with zarr's codec pipeline (op ``encode``) and writes each
shard whole through the backend (ops ``write_shard``: logical and stored bytes, then
``fsync``: sync + close). No shard is ever read back or modified (no read-modify-write).
ckptbench's manifest, committed by process 0 after everyone finished, still commits the
checkpoint. Restore opens each array from its ``zarr.json`` (op ``open``) and reads each
chunk back through zarr's array API (op ``read_shard``: get + decode), then checks the
chunk's xxh3 digest against the manifest.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import queue
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ckptbench.errors import SpecError, VerificationError
from ckptbench.formats.codecs import CodecSpec, parse_codec
from ckptbench.formats.common import (
    NP_DTYPES,
    ChunkTask,
    check_tiling,
    checkpoint_of,
    chunk_bytes,
    chunk_tasks,
    manifest_name,
)
from ckptbench.formats.zarr_store import BackendStore
from ckptbench.payload import digest
from ckptbench.plan import Plan
from ckptbench.plan.sharding import MAX_DIMS
from ckptbench.runner.engine import FileJob, RankEngine, ThreadResult, now

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

        return self.metadata(k).to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes()

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


class _Feed:
    """Chunks handed from a producer to a consumer thread, bounded by bytes in flight."""

    def __init__(self, budget: int) -> None:
        self.q: queue.Queue[Any] = queue.Queue()
        self.budget = budget
        self.used = 0
        self.stopped = False
        self.cv = threading.Condition()
        self.primed = threading.Event()

    def reserve(self, n: int) -> bool:
        with self.cv:
            while self.used and self.used + n > self.budget and not self.stopped:
                self.primed.set()
                self.cv.wait(0.1)
            self.used += n
            return not self.stopped

    def release(self, n: int) -> None:
        with self.cv:
            self.used -= n
            self.cv.notify_all()

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()

    def take(self) -> Any:
        while True:
            try:
                return self.q.get(timeout=0.1)
            except queue.Empty:
                if self.stopped:
                    return None


def _assign(tasks: list[ChunkTask], threads: int) -> list[list[ChunkTask]]:
    """Largest chunk first to the least-loaded thread; each thread keeps plan order."""
    loads = [0] * threads
    out: list[list[tuple[int, ChunkTask]]] = [[] for _ in range(threads)]
    for i in sorted(range(len(tasks)), key=lambda i: -tasks[i].nbytes):
        t = min(range(threads), key=loads.__getitem__)
        out[t].append((i, tasks[i]))
        loads[t] += tasks[i].nbytes
    return [[task for _, task in sorted(lst, key=lambda p: p[0])] for lst in out]


class _Buffers:
    """Reusable generation buffers (fresh pages cost as much as the copy into them)."""

    KEEP = 64

    def __init__(self) -> None:
        self.free: list[np.ndarray] = []
        self.lock = threading.Lock()

    def get(self, n: int) -> np.ndarray:
        with self.lock:
            fits = [i for i, b in enumerate(self.free) if n <= len(b) <= 2 * n + 4096]
            if fits:
                return self.free.pop(min(fits, key=lambda i: len(self.free[i])))
        return np.empty(n, dtype=np.uint8)

    def put(self, buf: np.ndarray) -> None:
        with self.lock:
            self.free.append(buf)
            del self.free[:-self.KEEP]


class ZarrEngine(RankEngine):
    """RankEngine's collective contract (save, restore, cache_keys), in zarr v3 arrays.

    Per engine thread: a producer generates chunks (off the I/O path, bounded by the
    prefill budget), a writer encodes them with zarr's codec pipeline and hands every
    shard to a pool of I/O workers, up to zarr's ``async.concurrency`` shard writes in
    flight per thread (as zarr's own array writes do). Restore mirrors it: reads through
    zarr's array API in the pool, a verifier thread checks digests.
    """

    def __init__(self, plan: Plan, ranks: list[int], backend: Any, comm: Any, options: Any,
                 progress: Any = None) -> None:
        super().__init__(plan, ranks, backend, comm, options, progress)
        import zarr

        self.codec = parse_codec(options.codec)
        self.layout = ZarrLayout(plan, self.codec)
        self.store = BackendStore(backend, self.block, inline=True)
        self.budget = max(1, options.prefill_bytes // self.nthreads)
        self.concurrency = max(1, int(zarr.config.get("async.concurrency") or 1))
        self.pool = ThreadPoolExecutor(self.nthreads * self.concurrency,
                                       thread_name_prefix="ckptbench-zarr")
        weakref.finalize(self, self.pool.shutdown, wait=False)
        self.buffers = _Buffers()
        self._local = threading.local()
        self._arrays: dict[tuple[Any, ...], Any] = {}
        self._arrays_lock = threading.Lock()
        self._meta_keys: list[int] | None = None

    def _loop(self) -> asyncio.AbstractEventLoop:
        """This thread's event loop for zarr's coroutines (the store answers inline)."""
        loop = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
        return loop

    # --- what this process writes ---
    def _checkpoint(self, jobs: list[FileJob]) -> str:
        return checkpoint_of(self.plan, jobs, "zarr")

    def _tasks(self, jobs: list[FileJob]) -> list[ChunkTask]:
        return chunk_tasks(self.plan, jobs)

    def _my_meta_keys(self) -> list[int]:
        """Keys whose zarr.json this process writes: spread round-robin over the running
        plan ranks (key k -> the k-th running rank, cyclically), so no rank writes them all
        (under FSDP every key's origin chunk is rank 0's). Collective the first time: every
        process learns which plan ranks run."""
        if self._meta_keys is None:
            gathered = self.comm.gather(list(self.ranks))
            running = self.comm.bcast(sorted(r for g in gathered for r in g)
                                      if gathered is not None else None)
            mine = set(self.ranks)
            self._meta_keys = [k for k in range(len(self.plan.keys))
                               if running[k % len(running)] in mine]
        return self._meta_keys

    def _meta_items(self, ckpt: str) -> list[tuple[str, bytes]]:
        items = [(f"{ckpt}/zarr.json", self.layout.group_json())] if self.comm.rank == 0 else []
        for k in self._my_meta_keys():
            items.append((f"{ckpt}/{self.plan.keys[k].name}/zarr.json", self.layout.metadata_json(k)))
        return items

    def cache_keys(self, jobs: list[FileJob]) -> list[str]:
        if not jobs:
            return []
        ckpt = self._checkpoint(jobs)
        keys = [f"{ckpt}/{self.layout.chunk_key(t.key, coords)}" for t in self._tasks(jobs)
                for coords, _, _ in self.layout.pieces(t.key, t.offsets, t.sizes)]
        return keys + [k for k, _ in self._meta_items(ckpt)]

    # --- payload ---
    def _generate(self, t: ChunkTask, buf: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        return chunk_bytes(self.gen, t, self.layout.np_dtype(t.key), buf)

    def _encode(self, t: ChunkTask, data: np.ndarray) -> list[tuple[str, list[Any], int]]:
        """Each whole shard a chunk covers, encoded: (key, byte parts, logical bytes)."""
        k = t.key
        shard = self.layout.shard_shape(k)
        pieces = self.layout.pieces(k, t.offsets, t.sizes)
        out = []
        for coords, src, valid in pieces:
            block = data[src] if src else data
            if valid != shard:
                padded = np.zeros(shard, dtype=data.dtype)
                padded[tuple(slice(0, v) for v in valid)] = block
                block = padded
            elif not block.flags.c_contiguous:
                block = np.ascontiguousarray(block)
            parts = self.layout.encode_shard(k, block, self._loop())
            out.append((self.layout.chunk_key(k, coords), parts,
                        math.prod(valid) * data.dtype.itemsize))
        return out

    # --- save ---
    def _fill_feed(self, feed: _Feed, tasks: list[ChunkTask], digests: dict[tuple[int, int], int],
                 res: ThreadResult) -> None:
        try:
            for t in tasks:
                if not feed.reserve(t.nbytes):
                    return
                buf = self.buffers.get(t.nbytes + 16) if t.nbytes >= 4096 else None
                data, d = self._generate(t, buf)
                digests[(t.job.index, t.region)] = d
                feed.q.put((t, data, buf))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            res.error = exc
            feed.stop()
        finally:
            feed.primed.set()
            feed.q.put(None)

    def _put_meta(self, key: str, payload: bytes, file: int, ckpt: str, res: ThreadResult) -> None:
        t0 = now()
        n = self.store.put(key, memoryview(payload))
        res.ops.append(("write_meta", file, 0, t0, now(), {"object": key[len(ckpt) + 1:],
                                                           "meta_bytes": n}))

    def _put_shard(self, key: str, buf: list[memoryview], logical: int, file: int, ckpt: str,
                   res: ThreadResult) -> None:
        a = now()
        stored, b = self.store.put_timed(f"{ckpt}/{key}", buf)
        c = now()
        res.ops.append(("write_shard", file, logical, a, b, {"stored_bytes": stored, "object": key}))
        res.ops.append(("fsync", file, 0, b, c))

    def _write_feed(self, feed: _Feed, meta: list[tuple[str, bytes]], meta_file: int, ckpt: str,
               res: ThreadResult) -> None:
        pending: list[Future[None]] = []
        try:
            pending += [self.pool.submit(self._put_meta, key, payload, meta_file, ckpt, res)
                        for key, payload in meta]
            while True:
                item = feed.take()
                if item is None:
                    break
                t, data, buf = item
                t0 = now()
                shards = self._encode(t, data)
                res.ops.append(("encode", t.job.index, 0, t0, now()))
                futures = [self.pool.submit(self._put_shard, key, enc, logical, t.job.index,
                                            ckpt, res) for key, enc, logical in shards]
                done = _Countdown(len(futures), self._chunk_done(feed, t, buf))
                for f in futures:
                    f.add_done_callback(done)
                pending = _still_running(pending + futures)
        except BaseException as exc:  # noqa: BLE001 - reported to the group
            res.error = res.error or exc
            feed.stop()
        _settle(pending, feed, res)

    def _chunk_done(self, feed: _Feed, t: ChunkTask, buf: np.ndarray | None) -> Any:
        def done() -> None:
            if buf is not None:
                self.buffers.put(buf)
            feed.release(t.nbytes)
            self.progress(t.nbytes)
        return done

    def save(self, jobs: list[FileJob]) -> list[ThreadResult]:
        ckpt = self._checkpoint(jobs)
        tasks = self._tasks(jobs)
        groups = _assign(tasks, self.nthreads)
        meta = self._meta_items(ckpt)  # collective the first time
        meta_groups = [meta[i::self.nthreads] for i in range(self.nthreads)]
        feeds = [_Feed(self.budget) for _ in groups]
        results = [ThreadResult() for _ in groups]
        digests: dict[tuple[int, int], int] = {}
        producers = [threading.Thread(target=self._fill_feed, args=(f, g, digests, r), daemon=True)
                     for f, g, r in zip(feeds, groups, results, strict=True)]
        for t in producers:
            t.start()
        for f in feeds:  # payload for the first chunks is ready before the clock starts
            f.primed.wait()
        self.comm.barrier()
        writers = [threading.Thread(target=self._write_feed, args=(f, m, jobs[0].index, ckpt, r),
                                    daemon=True)
                   for f, m, r in zip(feeds, meta_groups, results, strict=True)]
        for t in writers:
            t.start()
        for t in writers + producers:
            t.join()
        if all(r.error is None for r in results):
            results[0].digests = {job.index: [digests[(job.index, i)]
                                              for i in range(len(job.regions))] for job in jobs}
        return results

    # --- restore ---
    def _array(self, ckpt: str, k: int, file: int, res: ThreadResult) -> Any:
        """Array `k` of checkpoint `ckpt`, opened from its zarr.json once (op ``open``)."""
        with self._arrays_lock:
            lock = self._arrays.setdefault((ckpt, k, "lock"), threading.Lock())
        with lock:
            arr = self._arrays.get((ckpt, k))
            if arr is None:
                from zarr.core.array import AsyncArray
                from zarr.storage import StorePath

                name = self.plan.keys[k].name
                self.store.size_hints[f"{ckpt}/{name}/zarr.json"] = 64 << 10
                t0 = now()
                arr = self._loop().run_until_complete(
                    AsyncArray.open(StorePath(self.store, f"{ckpt}/{name}"), zarr_format=3))
                res.ops.append(("open", file, 0, t0, now(), {"object": f"{name}/zarr.json"}))
                self._check_array(arr, k)
                self._arrays[(ckpt, k)] = arr
            return arr

    def _check_array(self, arr: Any, k: int) -> None:
        key = self.plan.keys[k]
        attrs = arr.metadata.attributes.get("ckptbench", {})
        if tuple(arr.shape) != key.global_shape or attrs.get("dtype") != key.dtype:
            raise VerificationError(
                f"zarr array {key.name}: shape {tuple(arr.shape)} dtype {attrs.get('dtype')!r}"
                f" where the plan has {key.global_shape} {key.dtype!r}")

    def _read_chunk(self, t: ChunkTask, ckpt: str, feed: _Feed, res: ThreadResult) -> None:
        try:
            self._read_one(t, ckpt, feed, res)
        except BaseException:
            feed.release(t.nbytes)  # the verifier never sees this chunk
            feed.stop()
            raise

    def _read_one(self, t: ChunkTask, ckpt: str, feed: _Feed, res: ThreadResult) -> None:
        arr = self._array(ckpt, t.key, t.job.index, res)
        pieces = self.layout.pieces(t.key, t.offsets, t.sizes)
        keys = [f"{ckpt}/{self.layout.chunk_key(t.key, c)}" for c, _, _ in pieces]
        shard_bytes = math.prod(self.layout.shard_shape(t.key)) * arr.dtype.itemsize
        for key in keys:
            self.store.size_hints[key] = shard_bytes + 4096
        box = tuple(slice(o, o + n) for o, n in zip(t.offsets, t.sizes, strict=True))
        t0 = now()
        data = self._loop().run_until_complete(arr.getitem(box))
        t1 = now()
        stored = self.store.take_read_bytes(keys)
        res.ops.append(("read_shard", t.job.index, t.nbytes, t0, t1,
                        {"stored_bytes": stored, "object": keys[0][len(ckpt) + 1:]}))
        feed.q.put((t, np.asarray(data)))
        self.progress(t.nbytes)

    def _read_tasks(self, feed: _Feed, tasks: list[ChunkTask], ckpt: str, res: ThreadResult) -> None:
        pending: list[Future[None]] = []
        try:
            for t in tasks:
                if not feed.reserve(t.nbytes):
                    break
                pending = _still_running(
                    [*pending, self.pool.submit(self._read_chunk, t, ckpt, feed, res)])
        except BaseException as exc:  # noqa: BLE001 - reported to the group
            res.error = res.error or exc
            feed.stop()
        _settle(pending, feed, res)
        feed.q.put(None)

    def _verify_feed(self, feed: _Feed, ckpt: str, expected: dict[str, Any], res: ThreadResult) -> None:
        try:
            while True:
                item = feed.take()
                if item is None:
                    break
                t, data = item
                got = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
                want = expected[manifest_name(t.job)]["digests"][t.region]
                if len(got) != t.nbytes or digest(got) != want:
                    res.mismatches.append(self._describe_mismatch(t, got, ckpt))
                feed.release(t.nbytes)
        except BaseException as exc:  # noqa: BLE001
            res.error = res.error or exc
            feed.stop()

    def _describe_mismatch(self, t: ChunkTask, got: np.ndarray, ckpt: str) -> str:
        """Name the chunk, its zarr object and the first differing byte (off the clock)."""
        key = self.plan.keys[t.key].name
        shards = [self.layout.chunk_key(t.key, c) for c, _, _ in
                  self.layout.pieces(t.key, t.offsets, t.sizes)]
        missing = [s for s in shards if not self.backend.exists(f"{ckpt}/{s}")]
        if missing:
            return (f"chunk {key} at offsets {list(t.offsets)}: zarr shard {ckpt}/{missing[0]} "
                    "is missing (zarr reads it as fill values)")
        want, _ = self._generate(t)
        want_b = np.ascontiguousarray(want).reshape(-1).view(np.uint8)
        n = min(len(got), len(want_b))
        differ = np.flatnonzero(got[:n] != want_b[:n])
        first = int(differ[0]) if len(differ) else n
        return (f"chunk {key} at offsets {list(t.offsets)} (zarr {ckpt}/{shards[0]}): bytes "
                f"differ from chunk byte {first} of {t.nbytes}")

    def restore(self, jobs: list[FileJob], manifest_key: str
                ) -> tuple[list[ThreadResult], tuple[int, int]]:
        self.comm.barrier()
        manifest, (t0, t1) = self.read_manifest(manifest_key, jobs, "zarr")
        expected = manifest["files"]
        self.store.size_hints.clear()
        self._arrays.clear()
        ckpt = self._checkpoint(jobs) if jobs else ""
        groups = _assign(self._tasks(jobs), self.nthreads)
        feeds = [_Feed(self.budget) for _ in groups]
        results = [ThreadResult() for _ in groups]
        threads = []
        for f, g, r in zip(feeds, groups, results, strict=True):
            threads.append(threading.Thread(target=self._read_tasks, args=(f, g, ckpt, r), daemon=True))
            threads.append(threading.Thread(target=self._verify_feed, args=(f, ckpt, expected, r),
                                            daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results, (t0, t1)


def _still_running(pending: list[Future[None]]) -> list[Future[None]]:
    """Raise the first failure among finished I/O futures; keep the unfinished ones."""
    for f in pending:
        if f.done() and f.exception() is not None:
            raise f.exception()  # type: ignore[misc]
    return [f for f in pending if not f.done()]


def _settle(pending: list[Future[None]], feed: _Feed, res: ThreadResult) -> None:
    """Wait for the I/O still in flight; its first failure is the thread's error."""
    for f in pending:
        failure = f.exception()
        if failure is not None and res.error is None:
            res.error = failure
            feed.stop()


class _Countdown:
    """A future callback that runs `then` once `n` futures are done."""

    def __init__(self, n: int, then: Any) -> None:
        self.n = n
        self.then = then
        self.lock = threading.Lock()
        if n == 0:
            then()

    def __call__(self, _future: Any) -> None:
        with self.lock:
            self.n -= 1
            last = self.n == 0
        if last:
            self.then()
