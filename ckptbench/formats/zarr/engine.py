"""The ``zarr`` format: one zarr v3 array per state-dict key, each rank writing whole shards.

Layout of one checkpoint ``<run>/<checkpoint>/``::

    zarr.json                       the group (attributes: format, codec, workload)
    <state-dict key>/zarr.json      one array per key, shape = the key's global shape
    <state-dict key>/c/<i>/<j>      one shard object per shard-grid cell
    .metadata                       ckptbench's manifest (written last: the commit)

The geometry (shard shapes, metadata, encoding a shard) is :mod:`.layout`'s; this module
runs it on the engine threads.

Timing. Every process builds all arrays' metadata in memory before the clock starts.
Inside the timed save, the group and array ``zarr.json`` objects are written (op
``write_meta``, durable like the data; spread round-robin over the running ranks, the
group by process 0), before the shards, while every rank encodes its shards with zarr's
codec pipeline (op ``encode``) and writes each shard whole through the backend (ops
``write_shard``: logical and stored bytes, then ``fsync``: sync + close). No shard is ever
read back or modified (no read-modify-write). ckptbench's manifest, committed by process 0
after everyone finished, still commits the checkpoint. Restore opens each array from its
``zarr.json`` (op ``open``) and reads each chunk back through zarr's array API (op
``read_shard``: get + decode), then checks the chunk's xxh3 digest against the manifest.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np

from ckptbench.backends import Backend
from ckptbench.errors import VerificationError
from ckptbench.formats.base import (
    FileJob,
    FormatBase,
    FormatOptions,
    Group,
    ThreadResult,
    from_root,
    now,
)
from ckptbench.formats.codecs import CodecSpec, parse_codec
from ckptbench.formats.common import (
    ChunkTask,
    checkpoint_of,
    chunk_bytes,
    chunk_tasks,
)
from ckptbench.formats.manifest import Digested, Manifest
from ckptbench.formats.pipeline import ByteBudget, assign_threads
from ckptbench.formats.verify import describe_difference, object_digest
from ckptbench.formats.zarr.inflight import BufferPool, Countdown, by_nbytes, settle, still_running
from ckptbench.formats.zarr.layout import ZarrLayout
from ckptbench.formats.zarr.store import BackendStore
from ckptbench.payload import digest
from ckptbench.plan import Plan


class ZarrFormat(FormatBase):
    """The Format contract (save, restore, cache_keys) in zarr v3 arrays.

    Per engine thread: a producer generates chunks (off the I/O path, bounded by the
    prefill budget), a writer encodes them with zarr's codec pipeline and hands every
    shard to a pool of I/O workers, up to zarr's ``async.concurrency`` shard writes in
    flight per thread (as zarr's own array writes do). Restore mirrors it: reads through
    zarr's array API in the pool, a verifier thread checks digests.
    """

    name: ClassVar[str] = "zarr"

    @classmethod
    def check(cls, plan: Plan, ranks: list[int], codec: CodecSpec) -> None:
        ZarrLayout(plan, codec)  # raises SpecError when the chunks do not fit zarr arrays

    @classmethod
    def memory_bytes(cls, plan: Plan, ranks: list[int], options: FormatOptions,
                     alignment: int) -> int:
        """A thread's feed always takes one chunk, however large, and encodes it whole."""
        chunk = int(plan.chunk_nbytes.max()) if len(plan.chunk_nbytes) else 0
        threads = max(1, options.threads) * max(1, len(ranks))
        return super().memory_bytes(plan, ranks, options, alignment) + 2 * chunk * threads

    def __init__(self, plan: Plan, ranks: list[int], backend: Backend, group: Group,
                 options: FormatOptions, progress: Any = None) -> None:
        super().__init__(plan, ranks, backend, group, options, progress)
        import zarr

        self.codec = parse_codec(options.codec)
        self.layout = ZarrLayout(plan, self.codec)
        self.store = BackendStore(backend, self.block, inline=True)
        self.budget = max(1, options.prefill_bytes // self.nthreads)
        self.concurrency = max(1, int(zarr.config.get("async.concurrency") or 1))
        self.pool = ThreadPoolExecutor(self.nthreads * self.concurrency,
                                       thread_name_prefix="ckptbench-zarr")
        weakref.finalize(self, self.pool.shutdown, wait=False)
        self.buffers = BufferPool()
        self._local = threading.local()
        self._arrays: dict[tuple[Any, ...], Any] = {}
        self._arrays_lock = threading.Lock()
        self._meta_keys: list[int] | None = None
        self._manifest = Manifest("", {})  # of the restore in progress

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
            gathered = self.group.gather(list(self.ranks))
            running = from_root(self.group, sorted(r for g in gathered for r in g)
                                      if gathered is not None else None)
            mine = set(self.ranks)
            self._meta_keys = [k for k in range(len(self.plan.keys))
                               if running[k % len(running)] in mine]
        return self._meta_keys

    def _meta_items(self, ckpt: str) -> list[tuple[str, bytes]]:
        items = [(f"{ckpt}/zarr.json", self.layout.group_json())] if self.group.rank == 0 else []
        for k in self._my_meta_keys():
            items.append((f"{ckpt}/{self.plan.keys[k].name}/zarr.json", self.layout.metadata_json(k)))
        return items

    @classmethod
    def written_names(cls, plan: Plan, groups: list[list[int]],
                      options: FormatOptions) -> list[str]:
        """The shards of every chunk the ranks write, the group's zarr.json and every
        array's (spread over the running ranks, so all of them are written)."""
        layout = ZarrLayout(plan, parse_codec(options.codec))
        names = {"zarr.json", *(f"{key.name}/zarr.json" for key in plan.keys)}
        for r in sorted({r for g in groups for r in g}):
            for f in plan.files_of_rank(r):
                for i in plan.chunks_of_file(f):
                    c = plan.chunk(i)
                    if c.nbytes:
                        k = int(plan.chunk_key[i])
                        names.update(layout.chunk_key(k, coords)
                                     for coords, _, _ in layout.pieces(k, c.offsets, c.sizes))
        return sorted(names)

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
    def _fill_feed(self, feed: ByteBudget, tasks: list[ChunkTask], digests: dict[tuple[int, int], int],
                 res: ThreadResult) -> None:
        try:
            for t in tasks:
                if not feed.reserve(t.nbytes):
                    return
                buf = self.buffers.get(t.nbytes + 16) if t.nbytes >= 4096 else None
                data, d = self._generate(t, buf)
                digests[(t.job.index, t.region)] = d
                feed.put((t, data, buf))
        except BaseException as exc:
            res.error = exc
            feed.stop()
        finally:
            feed.primed.set()
            feed.put(None)

    def _put_meta(self, key: str, payload: bytes, file: int, ckpt: str, res: ThreadResult) -> None:
        t0 = now()
        n = self.store.put(key, memoryview(payload))
        res.op("write_meta", file, 0, t0, now(), {"object": key[len(ckpt) + 1:], "meta_bytes": n})

    def _put_shard(self, key: str, buf: list[memoryview], logical: int, file: int, ckpt: str,
                   res: ThreadResult) -> None:
        a = now()
        stored, b = self.store.put_timed(f"{ckpt}/{key}", buf)
        c = now()
        res.op("write_shard", file, logical, a, b, {"stored_bytes": stored, "object": key})
        res.op("fsync", file, 0, b, c)

    def _write_feed(self, feed: ByteBudget, meta: list[tuple[str, bytes]], meta_file: int, ckpt: str,
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
                res.op("encode", t.job.index, 0, t0, now())
                futures = [self.pool.submit(self._put_shard, key, enc, logical, t.job.index,
                                            ckpt, res) for key, enc, logical in shards]
                done = Countdown(len(futures), self._chunk_done(feed, t, buf))
                for f in futures:
                    f.add_done_callback(done)
                pending = still_running(pending + futures)
        except BaseException as exc:
            res.error = res.error or exc
            feed.stop()
        settle(pending, feed, res)

    def _chunk_done(self, feed: ByteBudget, t: ChunkTask, buf: np.ndarray | None) -> Any:
        def done() -> None:
            if buf is not None:
                self.buffers.put(buf)
            feed.release(t.nbytes)
            self.progress(t.nbytes)
        return done

    def save(self, jobs: list[FileJob]) -> list[ThreadResult]:
        ckpt = self._checkpoint(jobs)
        tasks = self._tasks(jobs)
        groups = assign_threads(tasks, self.nthreads, by_nbytes)
        meta = self._meta_items(ckpt)  # collective the first time
        meta_groups = [meta[i::self.nthreads] for i in range(self.nthreads)]
        feeds = [ByteBudget(self.budget) for _ in groups]
        results = [ThreadResult() for _ in groups]
        digests: dict[tuple[int, int], int] = {}
        producers = [threading.Thread(target=self._fill_feed, args=(f, g, digests, r), daemon=True)
                     for f, g, r in zip(feeds, groups, results, strict=True)]
        for t in producers:
            t.start()
        for f in feeds:  # payload for the first chunks is ready before the clock starts
            f.primed.wait()
        self.group.barrier()
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
            # the metadata a reader needs (dtype, shape, chunk grid, codecs) is verified too
            results[0].objects = {key[len(ckpt) + 1:]: object_digest(payload)
                                  for key, payload in meta}
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
                t0 = now()
                meta = self._read_meta(ckpt, f"{name}/zarr.json")
                arr = AsyncArray(metadata=json.loads(meta.tobytes()),
                                 store_path=StorePath(self.store, f"{ckpt}/{name}"))
                res.op("open", file, 0, t0, now(), {"object": f"{name}/zarr.json"})
                self._check_array(arr, k)
                self._arrays[(ckpt, k)] = arr
            return arr

    def _read_meta(self, ckpt: str, name: str) -> np.ndarray:
        """Metadata object `name` of checkpoint `ckpt`, refused unless it is the one written
        (the manifest of the restore in progress holds its digest)."""
        key = f"{ckpt}/{name}"
        self.store.size_hints[key] = 64 << 10
        data = self.store.read_all(key)
        self._manifest.check_object(name, key, data)
        assert data is not None
        return data

    def _check_array(self, arr: Any, k: int) -> None:
        key = self.plan.keys[k]
        attrs = arr.metadata.attributes.get("ckptbench", {})
        if tuple(arr.shape) != key.global_shape or attrs.get("dtype") != key.dtype:
            raise VerificationError(
                f"zarr array {key.name}: shape {tuple(arr.shape)} dtype {attrs.get('dtype')!r}"
                f" where the plan has {key.global_shape} {key.dtype!r}")

    def _read_chunk(self, t: ChunkTask, ckpt: str, feed: ByteBudget, res: ThreadResult) -> None:
        try:
            self._read_one(t, ckpt, feed, res)
        except BaseException:
            feed.release(t.nbytes)  # the verifier never sees this chunk
            feed.stop()
            raise

    def _read_one(self, t: ChunkTask, ckpt: str, feed: ByteBudget, res: ThreadResult) -> None:
        arr = self._array(ckpt, t.key, t.job.index, res)
        pieces = self.layout.pieces(t.key, t.offsets, t.sizes)
        keys = [f"{ckpt}/{self.layout.chunk_key(t.key, c)}" for c, _, _ in pieces]
        shard_bytes = math.prod(self.layout.shard_shape(t.key)) * arr.dtype.itemsize
        for key in keys:
            self.store.size_hints[key] = shard_bytes + 4096
        box = tuple(slice(o, o + n) for o, n in zip(t.offsets, t.sizes, strict=True))
        t0 = now()
        try:
            data = self._loop().run_until_complete(arr.getitem(box))
        except (ValueError, IndexError, RuntimeError) as exc:  # a codec on damaged bytes
            shard = f"shard {keys[0]}" if len(keys) == 1 else f"shards {keys[0]} (of {len(keys)})"
            raise VerificationError(
                f"chunk {self.plan.keys[t.key].name} at offsets {list(t.offsets)}: its zarr "
                f"{shard} cannot be decoded ({type(exc).__name__}: {str(exc)[:120]}); truncated "
                "or altered") from None
        t1 = now()
        stored = self.store.take_read_bytes(keys)
        res.op("read_shard", t.job.index, t.nbytes, t0, t1,
               {"stored_bytes": stored, "object": keys[0][len(ckpt) + 1:]})
        feed.put((t, np.asarray(data)))
        self.progress(t.nbytes)

    def _read_tasks(self, feed: ByteBudget, tasks: list[ChunkTask], ckpt: str, res: ThreadResult) -> None:
        pending: list[Future[None]] = []
        try:
            for t in tasks:
                if not feed.reserve(t.nbytes):
                    break
                pending = still_running(
                    [*pending, self.pool.submit(self._read_chunk, t, ckpt, feed, res)])
        except BaseException as exc:
            res.error = res.error or exc
            feed.stop()
        settle(pending, feed, res)
        feed.put(None)

    def _verify_feed(self, feed: ByteBudget, ckpt: str, expected: Mapping[str, Digested], res: ThreadResult) -> None:
        try:
            while True:
                item = feed.take()
                if item is None:
                    break
                t, data = item
                got = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
                want = expected[t.job.name]["digests"][t.region]
                if len(got) != t.nbytes or digest(got) != want:
                    res.mismatches.append(self._describe_mismatch(t, got, ckpt))
                feed.release(t.nbytes)
        except BaseException as exc:
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
        return (f"chunk {key} at offsets {list(t.offsets)} (zarr {ckpt}/{shards[0]}): "
                f"{describe_difference(got, want_b)}")

    def restore_files(self, jobs: list[FileJob], manifest_key: str
                      ) -> tuple[list[ThreadResult], tuple[int, int]]:
        self.group.barrier()
        manifest, (t0, t1) = self.read_manifest(manifest_key, jobs)
        self._manifest = manifest
        expected = manifest.files
        self.store.size_hints.clear()
        self._arrays.clear()
        ckpt = self._checkpoint(jobs) if jobs else ""
        opened = None
        if self.group.rank == 0:  # the group a reader opens first
            a = now()
            self._read_meta(ckpt, "zarr.json")
            opened = (a, now())
        groups = assign_threads(self._tasks(jobs), self.nthreads, by_nbytes)
        feeds = [ByteBudget(self.budget) for _ in groups]
        results = [ThreadResult() for _ in groups]
        threads = []
        for f, g, r in zip(feeds, groups, results, strict=True):
            threads.append(threading.Thread(target=self._read_tasks, args=(f, g, ckpt, r), daemon=True))
            threads.append(threading.Thread(target=self._verify_feed, args=(f, ckpt, expected, r),
                                            daemon=True))
        if opened is not None and results:
            results[0].op("open", jobs[0].index, 0, *opened, {"object": "zarr.json"})
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results, (t0, t1)
