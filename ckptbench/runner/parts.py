"""A phase's seconds in named parts, so that C and R say where their time went.

save      data (the first rank's start to the last rank's end: the format's writes),
          gather (the ranks' reports reaching process 0, and its check that every
          file written is still there, up to the manifest's build),
          coordinator (process 0's CPU: the manifest built and encoded), metadata (the
          manifest's bytes written to storage), commit (the rename that makes them the
          checkpoint; 0 where one request writes and commits, as an object store's PUT)
restore   metadata (the manifest read: the slowest reader's), setup (from there to the
          first data read: the manifest decoded, the reads planned, the reader's clients
          and handles made, its first requests sent), first_byte (the first data read's
          wait: on an object store, the first GET's connection and its first range
          arriving while the others share the bandwidth), data (the rest: reading and
          verifying the chunks). setup and first_byte are the last rank's (the one that
          ends the phase): what a restarting job pays before its data flows.

The parts add up to the phase's seconds (first start to last end). The coordinator's
part and the gather are ops of the coordinator's lane too (``coordinator``, ``gather``),
so the timeline labels them instead of leaving a gap before the commit.
"""

from __future__ import annotations

from collections.abc import Sequence

from ckptbench.formats.manifest import CommitTimes
from ckptbench.records import OpRecord, RankRecord, Record

SAVE_PARTS = ("data", "gather", "coordinator", "metadata", "commit")
RESTORE_PARTS = ("metadata", "setup", "first_byte", "data")
FIRST_RESTORE = ("setup", "first_byte")  # per restore, not per byte (jobmodel)


def _data_span(records: Sequence[Record]) -> tuple[int, int]:
    ranks = [r for r in records if isinstance(r, RankRecord)]
    if not ranks:
        return 0, 0
    return min(r.start_ns for r in ranks), max(r.end_ns for r in ranks)


def coordinator_ops(iteration: int, records: Sequence[Record], built: int, times: CommitTimes,
                    name: str) -> list[OpRecord]:
    """The coordinator's ops of a committed save: the gather (the last rank's end to the
    build), the manifest's build and encoding, and its commit (written and renamed)."""
    _, end = _data_span(records)
    out = []
    if end and built > end:
        out.append(OpRecord(iteration, "save", 0, -1, "gather", name, 0, end, built))
    out.append(OpRecord(iteration, "save", 0, -1, "coordinator", name, 0, built,
                        times.encoded))
    out.append(OpRecord(iteration, "save", 0, -1, "commit", name, 0, times.encoded, times.end))
    return out


def save_parts(records: Sequence[Record], built: int, times: CommitTimes) -> dict[str, float]:
    """The committed save's parts, in seconds (their sum: the phase's span)."""
    start, end = _data_span(records)
    start = start or built
    end = max(end, start)
    return {
        "data": (end - start) / 1e9,
        "gather": max(built - end, 0) / 1e9,
        "coordinator": (times.encoded - max(built, end)) / 1e9,
        "metadata": (times.renamed - times.encoded) / 1e9,
        "commit": (times.end - times.renamed) / 1e9,
    }


def self_committed_parts(records: Sequence[Record], built: int, times: CommitTimes
                         ) -> tuple[dict[str, float], dict[str, float]]:
    """A save its library committed (torch-dcp): its parts (the ranks' span, which holds
    the library's planning, writes and commit) and, off its clock, ckptbench's own
    manifest after it (the gather, build and commit, kept for restores' checks)."""
    start, end = _data_span(records)
    start = start or built
    end = max(end, start)
    return ({"data": (end - start) / 1e9},
            {"ckptbench_manifest": max(times.end - end, 0) / 1e9})


def first_read(ops: Sequence[OpRecord], rank: int) -> tuple[int, int, int] | None:
    """A rank's (manifest read's end, first data read's start and end), or None where the
    rank read no data."""
    mine = [o for o in ops if o.rank == rank]
    reads = [o for o in mine if o.op == "read"]
    if not reads:
        return None
    first = min(reads, key=lambda o: o.start_ns)
    manifest = [o.end_ns for o in mine if o.op == "manifest" and o.end_ns <= first.start_ns]
    return max(manifest, default=first.start_ns), first.start_ns, first.end_ns


def restore_parts(records: Sequence[Record]) -> dict[str, float]:
    """The restore's parts, in seconds: the slowest manifest read, the last rank's setup
    and first byte, then the rest of the phase's span (the first op's start to the last
    rank's end)."""
    ops = [r for r in records if isinstance(r, OpRecord)]
    ranks = [r for r in records if isinstance(r, RankRecord)]
    if not ranks:
        return {}
    start = min([r.start_ns for r in ranks] + [o.start_ns for o in ops])
    end = max(r.end_ns for r in ranks)
    metadata = max([(o.end_ns - o.start_ns) / 1e9 for o in ops if o.op == "manifest"] + [0.0])
    span = (end - start) / 1e9
    last = max(ranks, key=lambda r: r.end_ns)
    times = first_read(ops, last.rank)
    setup, first_byte = (0.0, 0.0) if times is None else (
        (times[1] - times[0]) / 1e9, (times[2] - times[1]) / 1e9)
    setup = min(max(setup, 0.0), max(span - metadata, 0.0))
    first_byte = min(max(first_byte, 0.0), max(span - metadata - setup, 0.0))
    return {"metadata": metadata, "setup": setup, "first_byte": first_byte,
            "data": max(span - metadata - setup - first_byte, 0.0)}
