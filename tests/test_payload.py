"""Payload: deterministic, unique per block/file/iteration, verifiable, realistic on demand."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import xxhash

from ckptbench.payload import BLOCK, ChunkHasher, PayloadGenerator, Region, stream_key


def fill(gen, base, regions, start, n):
    buf = np.zeros(n, dtype=np.uint8)
    gen.fill(base, regions, start, buf)
    return buf


REGIONS = [
    Region(0, 1002, "model.a", "bfloat16"),
    Region(1002, 50_006, "optim.state.a.exp_avg", "float32"),
    Region(50_006, 50_010, "optim.state.a.step", "float32"),
    Region(50_010, (3 << 20) + 6, "model.b", "bfloat16"),
]


@pytest.mark.parametrize("mode", ["random", "realistic"])
def test_any_window_gives_the_same_bytes(mode):
    gen = PayloadGenerator(mode, seed=7)
    total = REGIONS[-1].end
    whole = fill(gen, 11, REGIONS, 0, (total + 7) // 8 * 8)[:total]
    for seg in (4096, 1 << 20, 3 << 19):
        parts = np.concatenate([fill(gen, 11, REGIONS, s, seg) for s in range(0, total, seg)])
        assert np.array_equal(parts[:total], whole)
    for r in REGIONS:
        assert np.array_equal(gen.expected(11, r), whole[r.start:r.end])


def test_no_two_blocks_are_equal_across_files_and_iterations():
    gen = PayloadGenerator("random", seed=0)
    region = [Region(0, 4 << 20, "model.w", "float32")]
    blocks = []
    for file_id in range(3):
        for iteration in range(2):
            data = fill(gen, stream_key(0, file_id, iteration), region, 0, 4 << 20)
            blocks += [bytes(b) for b in data.reshape(-1, BLOCK)]
    assert len(set(blocks)) == len(blocks)
    # Far beyond the 16 MiB pool the blocks are still new.
    far = fill(gen, stream_key(0, 0, 0), [Region(0, 1 << 40, "model.w", "float32")], 1 << 30, 1 << 20)
    assert not {bytes(b) for b in far.reshape(-1, BLOCK)} & set(blocks)


def test_random_mode_is_incompressible_and_realistic_mode_is_not():
    rnd = fill(PayloadGenerator("random", 1), 5, [Region(0, 8 << 20, "model.w", "bfloat16")], 0, 4 << 20)
    assert len(zlib.compress(rnd.tobytes(), 6)) > 0.99 * len(rnd)
    real = PayloadGenerator("realistic", 1)
    w = fill(real, 5, [Region(0, 8 << 20, "model.w", "bfloat16")], 0, 4 << 20)
    ratio_w = len(w) / len(zlib.compress(w.tobytes(), 6))
    assert 1.1 < ratio_w < 1.6  # trained bf16 weights: ~1.2-1.5x, never like zeros
    m = fill(real, 5, [Region(0, 8 << 20, "optim.state.w.exp_avg", "float32")], 0, 4 << 20)
    ratio_m = len(m) / len(zlib.compress(m.tobytes(), 6))
    assert 1.0 <= ratio_m < 1.3
    values = w.view(np.uint16).astype(np.uint32) << 16
    floats = values.view(np.float32)
    assert np.isfinite(floats).all() and 0.005 < float(np.std(floats)) < 0.1


def test_the_seed_changes_everything():
    a = fill(PayloadGenerator("random", 1), 5, REGIONS, 0, 1 << 16)
    b = fill(PayloadGenerator("random", 2), 5, REGIONS, 0, 1 << 16)
    assert (a != b).mean() > 0.99


def test_chunk_hasher_takes_regions_in_any_order() -> None:
    """A restore plan reads a file's chunks in DCP's order (by key), not by offset: each
    slice, whole chunks or blocks across several, lands in its own chunks' digests."""
    data = np.random.default_rng(7).integers(0, 256, 10_000, dtype=np.uint8)
    regions = [Region(6000, 9000, "c", "bf16"), Region(0, 2500, "a", "bf16"),
               Region(9000, 10_000, "d", "bf16"), Region(2500, 6000, "b", "bf16")]
    want = [xxhash.xxh3_64_intdigest(data[r.start:r.end].tobytes()) for r in regions]
    by_chunk = ChunkHasher(regions)
    for r in regions:  # the plan's order
        by_chunk.update(r.start, data[r.start:r.end])
    assert by_chunk.digests() == want
    by_block = ChunkHasher(regions)
    for off in range(0, 10_000, 4096):  # a whole file in blocks, in offset order
        by_block.update(off, data[off:off + 4096])
    assert by_block.digests() == want
