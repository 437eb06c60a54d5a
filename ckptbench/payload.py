"""Bytes for every chunk: fast, deterministic, unique, verifiable.

A file's content is a function of (seed, file id, iteration, byte offset): a 16 MiB pool
of values XORed, 8 bytes at a time, with a key drawn per 4 KiB block from a 64-bit mixer
of (file, iteration, block). No two blocks of any file or iteration are equal, so no
store can dedup them, and a numpy XOR runs at memory speed (~6 GB/s per core here,
against ~1 GB/s for ``default_rng().bytes()``), generated in a producer thread off the
I/O threads' clock.

Two value modes:

* ``random`` (default): a uniformly random pool and a full 64-bit key: incompressible.
* ``realistic``: pools of values shaped like a trained checkpoint (weights ~ N(0, 0.02),
  Adam first moments ~ N(0, 1e-4), second moments ~ |N(0, 1e-5)|^2-ish log-normal), one
  pool per (state kind, dtype). The key only touches the low mantissa bits (7 of bf16's,
  16 of fp32's), so sign and exponent keep their statistics: a compressor sees roughly
  what it would see on a real checkpoint, and every block is still unique.

Verification uses xxh3-64 digests of each chunk, computed when the bytes are generated
and checked on every byte read back.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import xxhash

BLOCK = 4096
WORDS_PER_BLOCK = BLOCK // 8
POOL_BYTES = 16 << 20
POOL_WORDS = POOL_BYTES // 8
MODES = ("random", "realistic")

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)

# Which mantissa bits the key may flip, per element width, in realistic mode.
_REALISTIC_MASK = {2: np.uint64(0x007F007F007F007F), 4: np.uint64(0x0000FFFF0000FFFF)}


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection on 64-bit words with full avalanche."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def stream_key(seed: int, file_id: int, iteration: int) -> int:
    """The per-file, per-iteration base every block key is derived from."""
    v = np.array([(seed * 0x100000001B3 + file_id * 0x10001 + iteration) & (2**64 - 1)],
                 dtype=np.uint64)
    return int(_mix64(_mix64(v))[0])


def _state_kind(key: str) -> str:
    if key.endswith("exp_avg_sq"):
        return "exp_avg_sq"
    if key.endswith("exp_avg"):
        return "exp_avg"
    return "weight"


@lru_cache(maxsize=16)
def _pool(mode: str, kind: str, dtype: str, seed: int) -> np.ndarray:
    """A read-only pool of POOL_WORDS uint64 words."""
    rng = np.random.default_rng(seed)
    if mode == "random":
        pool = rng.integers(0, 2**63, size=POOL_WORDS, dtype=np.uint64) * np.uint64(2) + \
            rng.integers(0, 2, size=POOL_WORDS, dtype=np.uint64)
    else:
        itemsize = 2 if dtype in ("bfloat16", "float16") else 4
        n = POOL_BYTES // itemsize
        if kind == "exp_avg":
            values = rng.normal(0.0, 1e-4, n)
        elif kind == "exp_avg_sq":
            values = np.exp(rng.normal(np.log(1e-9), 2.0, n))
        else:
            # Trained weights: mostly small Gaussians, with per-row scale variation.
            scale = np.repeat(np.exp(rng.normal(np.log(0.02), 0.3, n // 1024 + 1)), 1024)[:n]
            values = rng.normal(0.0, 1.0, n) * scale
        f32 = values.astype(np.float32)
        if dtype == "bfloat16":
            raw = (f32.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        elif dtype == "float16":
            raw = f32.astype(np.float16).view(np.uint16)
        else:
            raw = f32.view(np.uint32)
        pool = np.frombuffer(raw.tobytes(), dtype=np.uint64).copy()
    pool.flags.writeable = False
    return pool


@dataclass(frozen=True)
class Region:
    """A run of bytes [start, end) of one file that belongs to one chunk."""

    start: int
    end: int
    key: str  # state-dict key (decides the value pool in realistic mode)
    dtype: str


class PayloadGenerator:
    """Fills buffers with a file's bytes, block-aligned to the file's start."""

    def __init__(self, mode: str = "random", seed: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(mode)
        self.mode = mode
        self.seed = seed

    def _pool_and_mask(self, region: Region) -> tuple[np.ndarray, np.uint64]:
        if self.mode == "random":
            return _pool("random", "", "", self.seed), np.uint64(0xFFFFFFFFFFFFFFFF)
        itemsize = 2 if region.dtype in ("bfloat16", "float16") else 4
        pool = _pool("realistic", _state_kind(region.key), region.dtype, self.seed)
        return pool, _REALISTIC_MASK[itemsize]

    def _words(self, base: int, first_word: int, nwords: int, pool: np.ndarray,
               mask: np.uint64, out: np.ndarray) -> None:
        """Words [first_word, first_word + nwords) of the stream into out (uint64)."""
        w = first_word
        o = 0
        while o < nwords:
            block = w // WORDS_PER_BLOCK
            # Up to the end of the pool or of the request, block by block in bulk.
            p = w % POOL_WORDS
            n = min(nwords - o, POOL_WORDS - p)
            first_block_end = (block + 1) * WORDS_PER_BLOCK - w
            head = min(n, first_block_end)
            key = _mix64(np.array([block], dtype=np.uint64) + np.uint64(base))[0] & mask
            np.bitwise_xor(pool[p:p + head], key, out=out[o:o + head])
            o += head
            w += head
            p += head
            n -= head
            full = n // WORDS_PER_BLOCK
            if full:
                blocks = np.arange(w // WORDS_PER_BLOCK, w // WORDS_PER_BLOCK + full,
                                   dtype=np.uint64)
                keys = (_mix64(blocks + np.uint64(base)) & mask)[:, None]
                span = full * WORDS_PER_BLOCK
                np.bitwise_xor(pool[p:p + span].reshape(full, WORDS_PER_BLOCK), keys,
                               out=out[o:o + span].reshape(full, WORDS_PER_BLOCK))
                o += span
                w += span
                p += span
                n -= span
            if n:
                key = _mix64(np.array([w // WORDS_PER_BLOCK], dtype=np.uint64)
                             + np.uint64(base))[0] & mask
                np.bitwise_xor(pool[p:p + n], key, out=out[o:o + n])
                o += n
                w += n

    def fill(self, base: int, regions: list[Region], start: int, out: np.ndarray) -> None:
        """Bytes [start, start + len(out)) of a file whose chunks are `regions` (sorted).

        `start` must be a multiple of 8; bytes outside every region are zero (padding).
        """
        end = start + len(out)
        words = out[: len(out) // 8 * 8].view(np.uint64)
        for r in regions:
            a, b = max(r.start, start), min(r.end, end)
            if a >= b:
                continue
            pool, mask = self._pool_and_mask(r)
            a8, b8 = (a + 7) // 8 * 8, b // 8 * 8
            if a8 < b8:
                self._words(base, a8 // 8, (b8 - a8) // 8, pool, mask,
                            words[(a8 - start) // 8:(b8 - start) // 8])
            for lo, hi in ((a, min(a8, b)), (max(b8, a), b)):
                if lo < hi:  # a partial word at a chunk edge: compute it, copy its bytes
                    tmp = np.empty(1, dtype=np.uint64)
                    self._words(base, lo // 8, 1, pool, mask, tmp)
                    off = lo - lo // 8 * 8
                    out[lo - start:hi - start] = tmp.view(np.uint8)[off:off + hi - lo]

    def expected(self, base: int, region: Region) -> np.ndarray:
        """The exact bytes of one region (for pinpointing a mismatch)."""
        start = region.start // 8 * 8
        buf = np.zeros((region.end - start + 7) // 8 * 8, dtype=np.uint8)
        self.fill(base, [region], start, buf)
        return buf[region.start - start:region.end - start]


def digest(data: memoryview | np.ndarray | bytes) -> int:
    return xxhash.xxh3_64_intdigest(data.data if isinstance(data, np.ndarray) else data)


class ChunkHasher:
    """Streaming xxh3-64 digests of non-overlapping regions, fed by arbitrary buffer slices.
    The regions may come in any order (a restore plan reads a file's chunks in DCP's
    order, by key, not by offset): each slice finds its regions by offset."""

    def __init__(self, regions: list[Region]) -> None:
        self.regions = regions
        self.hashers = [xxhash.xxh3_64() for _ in regions]
        ordered = all(a.start <= b.start for a, b in itertools.pairwise(regions))
        # by offset: the regions' indices (None: their own order) and their ends
        self._order = None if ordered else sorted(range(len(regions)),
                                                  key=lambda i: regions[i].start)
        self._ends = [regions[i].end for i in self._order or range(len(regions))]

    def update(self, start: int, data: np.ndarray) -> None:
        end = start + len(data)
        p = bisect.bisect_right(self._ends, start)  # the first region ending past start
        while p < len(self._ends):
            i = p if self._order is None else self._order[p]
            r = self.regions[i]
            if r.start >= end:
                break
            a, b = max(r.start, start), min(r.end, end)
            if a < b:
                self.hashers[i].update(data[a - start:b - start].data)
            p += 1

    def digests(self) -> list[int]:
        return [h.intdigest() for h in self.hashers]
