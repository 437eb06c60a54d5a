"""Ranged GETs kept ahead of the reader (backends/s3/readahead.py): sequential reads stream
whole ranges, scattered reads (a restore plan's chunks of another rank's file) fetch only
what they ask for. First the handle alone over an in-memory object (its fetches recorded),
then the botocore default path against the real MinIO, counting its requests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from ckptbench.backends.s3.boto_readahead import boto_readahead
from ckptbench.backends.s3.readahead import (
    LARGE_HELD,
    SMALL_PER_LARGE,
    SMALL_QUEUED,
    Chunk,
    ReadAhead,
    plan_gets,
)
from ckptbench.testing.conformance import MIB, write_object
from harness import MinioServer

from .test_s3 import s3
from .test_s3_transports import TRANSPORTS

KIB = 1 << 10


class Arriving(Future[Chunk]):
    """A GET still in flight until the reader waits for it (its bytes arrive then)."""

    def __init__(self, make: Callable[[], Chunk]) -> None:
        super().__init__()
        self.make = make

    def result(self, timeout: float | None = None) -> Chunk:
        if not self.done():
            self.set_result(self.make())
        return super().result(timeout)


class Recorded:
    """An object in memory served the way a ranged GET serves it; every GET recorded.
    `in_flight`: each GET stays in flight until the reader waits for it (else it is done
    at once)."""

    def __init__(self, data: bytes, in_flight: bool = False) -> None:
        self.data = data
        self.in_flight = in_flight
        self.gets: list[tuple[int, int]] = []

    def fetch(self, offset: int, length: int) -> Future[Chunk]:
        self.gets.append((offset, length))

        def make() -> Chunk:
            piece = bytearray(self.data[offset:offset + length])
            return Chunk(piece, len(piece), len(self.data))

        if self.in_flight:
            return Arriving(make)
        out: Future[Chunk] = Future()
        out.set_result(make())
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
    """A restore plan's scattered small reads: exactly their bytes, SMALL_PER_LARGE x
    `depth` GETs ahead (a small GET waits on latency, not bandwidth)."""
    obj = Recorded(os.urandom(4 * MIB), in_flight=True)
    offsets = list(range(1000, 4 * MIB, 97 * KIB))
    h = ReadAhead(obj.fetch, MIB, depth=2, plan=[(o, 4) for o in offsets])
    assert read(h, offsets[0], 4) == obj.data[offsets[0]:offsets[0] + 4]
    ahead = SMALL_PER_LARGE * 2
    # in flight before the first read, and the next one in the place it freed
    assert obj.gets == [(o, 4) for o in offsets[:ahead + 1]]
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


def test_a_threads_handles_share_its_large_gets_in_flight() -> None:
    """The next file's GETs start only in the lane's free places once this file's are all
    requested: never more than `depth` large GETs in flight for one reader thread (each
    GET here in flight until the reader waits for it)."""
    chunk = 2 * MIB
    a, b = Recorded(os.urandom(8 * MIB), in_flight=True), Recorded(os.urandom(4 * MIB),
                                                                   in_flight=True)
    ha = ReadAhead(a.fetch, chunk, depth=2, plan=[(0, 8 * MIB)])
    hb = ReadAhead(b.fetch, chunk, depth=2, plan=[(0, 4 * MIB)])
    assert read(ha, 0, chunk) == a.data[:chunk]
    assert a.gets == [(0, chunk), (chunk, chunk), (2 * chunk, chunk)]  # the freed place refilled
    hb.prefetch()
    assert b.gets == [] and ha.plan  # the lane is full of this file's GETs
    assert read(ha, chunk, chunk) == a.data[chunk:2 * chunk]
    assert not ha.plan  # all of this file's GETs are requested
    hb.prefetch()
    assert b.gets == []  # this file's last GETs hold both places
    assert read(ha, 2 * chunk, chunk) == a.data[2 * chunk:3 * chunk]
    hb.prefetch()
    assert b.gets == [(0, chunk)]  # one place was free
    assert read(ha, 3 * chunk, chunk) == a.data[3 * chunk:]
    ha.close()
    assert read(hb, 0, 4 * MIB) == b.data and b.gets == [(0, chunk), (chunk, chunk)]


def test_the_next_files_small_gets_start_at_once_in_half_the_small_places() -> None:
    """A rank's few scalars in another file (4-byte chunks) are fetched while its own
    file's large GETs run, taking at most half the small places: the current file's own
    small reads keep the other half."""
    chunk = 2 * MIB
    a, b = Recorded(os.urandom(8 * MIB)), Recorded(os.urandom(4 * MIB), in_flight=True)
    ha = ReadAhead(a.fetch, chunk, depth=2, plan=[(0, 8 * MIB), (8 * MIB - 4, 4)])
    offsets = list(range(100, 4 * MIB, 97 * KIB))
    hb = ReadAhead(b.fetch, chunk, depth=2, plan=[(o, 4) for o in offsets])
    assert read(ha, 0, chunk) == a.data[:chunk]
    hb.prefetch()
    half = SMALL_PER_LARGE * 2 // 2
    assert b.gets == [(o, 4) for o in offsets[:half]]
    assert [read(hb, o, 4) for o in offsets] == [b.data[o:o + 4] for o in offsets]
    assert read(ha, chunk, 6 * MIB) == a.data[chunk:]


def test_small_gets_done_wait_for_the_reader_without_holding_a_place() -> None:
    """Small GETs that have arrived hold no place: a file ahead gets all its scalars
    fetched while the reader is still elsewhere, up to SMALL_QUEUED of them."""
    b = Recorded(os.urandom(4 * MIB))  # every GET arrives at once
    offsets = list(range(100, 4 * MIB, 13 * KIB))
    assert len(offsets) > SMALL_QUEUED
    hb = ReadAhead(b.fetch, MIB, depth=2, plan=[(o, 4) for o in offsets])
    hb.prefetch()
    assert b.gets == [(o, 4) for o in offsets[:SMALL_QUEUED]]
    assert [read(hb, o, 4) for o in offsets] == [b.data[o:o + 4] for o in offsets]


def test_a_borrowed_view_is_the_gets_bytes_and_holds_its_buffer() -> None:
    released: list[int] = []

    def fetch(offset: int, length: int) -> Future[Chunk]:
        piece = bytearray(data[offset:offset + length])
        out: Future[Chunk] = Future()
        out.set_result(Chunk(piece, len(piece), len(data), lambda: released.append(offset)))
        return out

    data = os.urandom(3 * MIB)
    h = ReadAhead(fetch, MIB, depth=2, plan=[(0, 100), (100, MIB - 100), (MIB, 10)])
    first, second = h.borrow(0, 100), h.borrow(100, MIB - 100)
    assert first is not None and second is not None
    assert bytes(first[0]) == data[:100] and bytes(second[0]) == data[100:MIB]
    first[1]()
    assert released == []  # the GET is read to its end, but one view is still lent
    second[1]()
    assert released == [0]
    assert h.borrow(MIB - 5, 10) is None  # in no one GET: the caller reads it (readinto)
    third = h.borrow(MIB, 10)
    assert third is not None and bytes(third[0]) == data[MIB:MIB + 10]
    h.close()
    third[1]()
    assert released == [0, MIB]


@pytest.mark.s3
def test_botocore_staging_buffers_are_made_before_the_clock(s3env: MinioServer) -> None:
    """warm_reads() makes (and zeroes: touches) a staging buffer per large GET a lane may
    hold (LARGE_HELD per GET in flight) and one more, so a restore's first GETs do not
    wait on page faults; reads keep that many."""
    b = s3(f"s3://{s3env.bucket}/warm/{uuid.uuid4().hex[:8]}", s3env.endpoint, concurrency=None)
    b.prepare()
    ahead = boto_readahead(b)
    b.warm_reads()
    made = list(ahead.spare)
    assert len(made) == ahead.keep == LARGE_HELD * b.concurrency + 1
    data = os.urandom(3 * ahead.chunk // 2)
    write_object(b, "ck/x", data, block=8 * MIB)
    h = b.open_read_planned("ck/x", [(0, len(data))])
    try:
        buf = bytearray(len(data))
        assert h.readinto(0, memoryview(buf)) == len(data) and buf == data
    finally:
        h.close()
    assert len(ahead.spare) == ahead.keep and all(any(x is y for y in made) for x in ahead.spare)
    b.remove_tree("ck")
    b.release()


@pytest.mark.s3
@pytest.mark.parametrize("transport", ["botocore", *TRANSPORTS])
def test_planned_reads_on_minio(s3env: MinioServer, transport: str) -> None:
    """A restore plan's reads through each transport: a run of chunks and scattered
    4-byte reads, one GET per range of the run (ramping up: the reader thread's first
    file) and one per scattered read."""
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
        ranges = plan_gets(run, boto_readahead(b).chunk, ramp=True)  # the thread's first
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


class Held:
    """An object in memory whose GETs finish only when the test says so (any order)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.gets: dict[tuple[int, int], Future[Chunk]] = {}

    def fetch(self, offset: int, length: int) -> Future[Chunk]:
        fut: Future[Chunk] = Future()
        self.gets[(offset, length)] = fut
        return fut

    def finish(self, offset: int, length: int) -> None:
        piece = bytearray(self.data[offset:offset + length])
        self.gets[(offset, length)].set_result(Chunk(piece, len(piece), len(self.data)))


def test_a_threads_first_file_ramps_up_its_gets() -> None:
    """The first GETs of a reader thread with none in flight grow from chunk/16 to the
    chunk, so its first read waits on a few MiB, not on `depth` whole chunks sharing the
    bandwidth; the next file, opened while GETs run, starts at whole chunks."""
    chunk = 64 * MIB
    gets = plan_gets([(0, 300 * MIB), (400 * MIB, 4)], chunk, ramp=True)
    assert [n // MIB for _, n in gets[:6]] == [4, 8, 16, 32, 64, 64]
    assert sum(n for _, n in gets) == 300 * MIB + 4 and gets[-1] == (400 * MIB, 4)
    assert plan_gets([(0, 3 * MIB)], MIB, ramp=True) == plan_gets([(0, 3 * MIB)], MIB)
    first = Recorded(os.urandom(8 * MIB), in_flight=True)
    h1 = ReadAhead(first.fetch, 4 * MIB, depth=2, plan=[(0, 8 * MIB)])
    assert [n for _, n in h1.plan or []] == [2 * MIB, 4 * MIB, 2 * MIB]
    h1.prefetch()
    h2 = ReadAhead(first.fetch, 4 * MIB, depth=2, plan=[(0, 8 * MIB)])
    assert [n for _, n in h2.plan or []] == [4 * MIB, 4 * MIB]
    h1.close()
    h2.close()


def test_a_get_done_out_of_order_gives_its_place_while_the_reader_waits() -> None:
    """Concurrent GETs finish in any order: the second one done while the reader still
    waits on the first lets the plan's next GET start at once, so the rank keeps `depth`
    requests in flight (the store was otherwise left idle between waves)."""
    import threading
    import time

    big = 2 * MIB  # larger than a small GET
    data = os.urandom(4 * big)
    obj = Held(data)
    handle = ReadAhead(obj.fetch, big, 2, plan=[(0, 4 * big)])
    out = bytearray(big)
    reader = threading.Thread(target=handle.readinto, args=(0, memoryview(out)))
    reader.start()
    deadline = time.monotonic() + 10
    while len(obj.gets) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(obj.gets) == [(0, big), (big, big)]
    obj.finish(big, big)  # the second GET is done, the first still in flight
    while len(obj.gets) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (2 * big, big) in obj.gets and not obj.gets[(0, big)].done()
    obj.finish(0, big)
    reader.join(10)
    assert bytes(out) == data[:big]
    assert len(obj.gets) == 4  # the first one read: the last GET of the plan started
    obj.finish(2 * big, big)
    handle.close()
