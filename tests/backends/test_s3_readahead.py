"""Ranged GETs kept ahead of the reader (backends/s3/readahead.py): sequential reads stream
whole ranges, scattered reads (a restore plan's chunks of another rank's file) fetch only
what they ask for. First the handle alone over an in-memory object (its fetches recorded),
then the botocore default path against the real MinIO, counting its requests."""

from __future__ import annotations

import os
import uuid
from concurrent.futures import Future

import pytest

from ckptbench.backends.s3.boto_readahead import boto_readahead
from ckptbench.backends.s3.readahead import Chunk, ReadAhead, plan_gets
from ckptbench.testing import MinioServer

from .conformance import MIB, write_object
from .test_s3 import s3
from .test_s3_transports import TRANSPORTS

KIB = 1 << 10


class Recorded:
    """An object in memory served the way a ranged GET serves it; every GET recorded."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.gets: list[tuple[int, int]] = []

    def fetch(self, offset: int, length: int) -> Future[Chunk]:
        self.gets.append((offset, length))
        piece = bytearray(self.data[offset:offset + length])
        out: Future[Chunk] = Future()
        out.set_result(Chunk(piece, len(piece), len(self.data)))
        return out


def read(handle: ReadAhead, offset: int, n: int) -> bytes:
    buf = bytearray(n)
    got = handle.readinto(offset, memoryview(buf))
    return bytes(buf[:got])


def test_sequential_reads_stream_whole_ranges() -> None:
    obj = Recorded(os.urandom(5 * MIB + 3))
    h = ReadAhead(obj.fetch, MIB, depth=3)
    out = b"".join(read(h, off, 256 * KIB) for off in range(0, len(obj.data), 256 * KIB))
    assert out == obj.data
    assert obj.gets[0] == (0, 256 * KIB)  # the first read: what it asks for
    assert all(n == MIB for _, n in obj.gets[1:-1])  # then whole ranges ahead
    assert sum(n for _, n in obj.gets) == len(obj.data)  # nothing fetched twice or past the end


def test_scattered_reads_fetch_only_what_they_ask() -> None:
    obj = Recorded(os.urandom(4 * MIB))
    h = ReadAhead(obj.fetch, MIB, depth=4)
    offsets = range(1000, 4 * MIB, 97 * KIB)  # 4-byte reads with gaps between them
    assert [read(h, off, 4) for off in offsets] == [obj.data[o:o + 4] for o in offsets]
    assert obj.gets == [(o, 4) for o in offsets]


def test_a_read_past_the_end_is_short_and_a_jump_back_rereads() -> None:
    obj = Recorded(os.urandom(3 * MIB))
    h = ReadAhead(obj.fetch, MIB, depth=2)
    assert read(h, 3 * MIB - 10, 100) == obj.data[-10:]
    assert read(h, 3 * MIB, 5) == b""
    assert read(h, 5, 2 * MIB) == obj.data[5:5 + 2 * MIB]  # a jump: only the span asked
    assert obj.gets[-2:] == [(5, MIB), (5 + MIB, MIB)]


class Direct:
    """A handle that reads into the caller's buffer (as S3Reader does), reads recorded."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads: list[tuple[int, int]] = []

    def readinto(self, offset: int, buf: memoryview) -> int:
        piece = self.data[offset:offset + len(buf)]
        buf[:len(piece)] = piece
        self.reads.append((offset, len(buf)))
        return len(piece)

    def close(self) -> None:
        pass


def test_reads_of_a_range_or_more_go_straight_into_the_buffer() -> None:
    """Whole-object reads (warp-shaped runs) are read in place; a small read that
    follows on streams ranges from where they ended, and a large one it holds is copied."""
    obj = Recorded(os.urandom(5 * MIB))
    direct = Direct(obj.data)
    h = ReadAhead(obj.fetch, MIB, depth=2, direct=direct)  # type: ignore[arg-type]
    assert read(h, 0, 2 * MIB) == obj.data[:2 * MIB]
    assert read(h, 2 * MIB, MIB) == obj.data[2 * MIB:3 * MIB]
    assert read(h, 3 * MIB, 100) == obj.data[3 * MIB:3 * MIB + 100]
    assert direct.reads == [(0, 2 * MIB), (2 * MIB, MIB)]
    assert obj.gets == [(3 * MIB, MIB), (4 * MIB, MIB)]
    assert read(h, 3 * MIB + 100, MIB) == obj.data[3 * MIB + 100:4 * MIB + 100]  # in flight
    assert len(direct.reads) == 2 and len(obj.gets) == 2


def test_planned_gets_merge_what_follows_on_and_cut_it_in_ranges() -> None:
    spans = [(0, 100), (100, 3 * MIB), (3 * MIB + 100, 5), (10 * MIB, 4), (10 * MIB, 4),
             (20 * MIB, 0)]
    assert plan_gets(spans, MIB) == [(0, MIB), (MIB, MIB), (2 * MIB, MIB),
                                     (3 * MIB, 105), (10 * MIB, 4)]


def test_planned_scattered_reads_are_in_flight_together() -> None:
    """A restore plan's scattered small reads: exactly their bytes, `depth` GETs ahead."""
    obj = Recorded(os.urandom(4 * MIB))
    offsets = list(range(1000, 4 * MIB, 97 * KIB))
    h = ReadAhead(obj.fetch, MIB, depth=4, plan=[(o, 4) for o in offsets])
    assert read(h, offsets[0], 4) == obj.data[offsets[0]:offsets[0] + 4]
    assert obj.gets == [(o, 4) for o in offsets[:4]]  # four in flight before the first read
    assert [read(h, o, 4) for o in offsets[1:]] == [obj.data[o:o + 4] for o in offsets[1:]]
    assert obj.gets == [(o, 4) for o in offsets]


def test_planned_reads_skip_unread_spans_and_serve_unplanned_ones() -> None:
    obj = Recorded(os.urandom(6 * MIB))
    plan = [(0, 2 * MIB), (3 * MIB, MIB), (5 * MIB, 10)]
    h = ReadAhead(obj.fetch, MIB, depth=2, plan=plan)
    assert read(h, 3 * MIB + 5, 100) == obj.data[3 * MIB + 5:3 * MIB + 105]  # skips ahead
    assert read(h, 100, 50) == obj.data[100:150]  # behind the plan: a GET of its own
    assert read(h, 5 * MIB, 10) == obj.data[5 * MIB:5 * MIB + 10]
    assert (100, 50) in obj.gets and sum(n for _, n in obj.gets) <= 4 * MIB + 60


def test_planned_reads_of_a_truncated_object_are_short() -> None:
    obj = Recorded(os.urandom(MIB + 10))
    h = ReadAhead(obj.fetch, MIB, depth=2, plan=[(0, MIB), (MIB, MIB)])
    assert read(h, 0, MIB) == obj.data[:MIB]
    assert read(h, MIB, MIB) == obj.data[MIB:]


@pytest.mark.s3
@pytest.mark.parametrize("transport", ["botocore", *TRANSPORTS])
def test_planned_reads_on_minio(s3env: MinioServer, transport: str) -> None:
    """A restore plan's reads through each transport: a run of chunks and scattered
    4-byte reads, one GET per range of the run and one per scattered read."""
    b = s3(f"s3://{s3env.bucket}/plan/{uuid.uuid4().hex[:8]}", s3env.endpoint,
           concurrency=None, transport=transport)
    b.prepare()
    data = os.urandom(40 * MIB)
    write_object(b, "ck/x", data, block=8 * MIB)
    b.stats()
    run = [(off, 300 * KIB) for off in range(0, 18 * MIB, 300 * KIB)]
    scattered = [(20 * MIB + i * 600 * KIB + 7, 4) for i in range(20)]
    h = b.open_read_planned("ck/x", run + scattered)
    try:
        for off, n in run + scattered:
            buf = bytearray(n)
            assert h.readinto(off, memoryview(buf)) == n and bytes(buf) == data[off:off + n]
    finally:
        h.close()
    if transport == "botocore":  # the transports' requests are their own (not counted)
        ranges = plan_gets(run, boto_readahead(b).chunk)
        assert b.stats()["requests"] == len(ranges) + len(scattered)
    b.remove_tree("ck")
    b.release()


@pytest.mark.s3
def test_botocore_defaults_scattered_reads_are_one_get_each(s3env: MinioServer) -> None:
    """With chosen defaults (read-ahead on), 40 scattered 4-byte reads of one object cost
    40 GETs of 4 bytes (the size from the first one's Content-Range, no HEAD), not 40
    read-ahead windows of 16 MiB."""
    b = s3(f"s3://{s3env.bucket}/ra/{uuid.uuid4().hex[:8]}", s3env.endpoint, concurrency=None)
    b.prepare()
    data = os.urandom(24 * MIB)
    write_object(b, "ck/x", data, block=8 * MIB)
    b.stats()
    h = b.open_read("ck/x")
    buf = bytearray(4)
    offsets = [i * 600 * KIB + 7 for i in range(40)]
    try:
        for off in offsets:
            assert h.readinto(off, memoryview(buf)) == 4 and bytes(buf) == data[off:off + 4]
    finally:
        h.close()
    assert b.stats()["requests"] == len(offsets)
    b.remove_tree("ck")
    b.release()
