"""What each process sends process 0 after a phase, and the records process 0 makes of it.

Every timed op is moved onto process 0's clock before it travels (the clock offset each
process measured), tagged with the plan rank and thread it was for; process 0 turns the
gathered reports into op records and one rank record per plan rank. Both modes use it:
the sync iteration loop (runner.driver) and the background persists (runner.async_mode).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from ckptbench.backends import Backend
from ckptbench.errors import BackendError, describe_error
from ckptbench.formats.base import FileJob, ThreadResult, TimedOp
from ckptbench.plan import Plan
from ckptbench.records import OpRecord, RankRecord, Record
from ckptbench.runner import threads
from ckptbench.runner.comm import Comm

OP_KINDS = ("open", "write", "fsync", "close", "read")


@dataclass(frozen=True)
class RankOp:
    """A format's timed op, on process 0's clock, with the plan rank and thread it was for."""

    op: TimedOp
    rank: int
    thread: int


@dataclass
class PhaseReport:
    """What one process sends to the coordinator after a phase (picklable)."""

    ops: list[RankOp]
    digests: dict[int, list[int]]
    mismatches: list[str]
    error: tuple[str, str] | None
    host: str
    backend_stats: dict[str, int]
    manifest: tuple[int, int] | None = None  # reading the manifest (restore), clock-shifted
    objects: dict[str, int] | None = None  # metadata objects written and their digests
    entries: bytes | None = None  # a save's manifest entries of this process's files, encoded
    intra_op_threads: int | None = None  # what the process ran with (runner.threads)


def phase_report(results: list[ThreadResult], jobs: list[FileJob], comm: Comm,
            error: BaseException | None, backend_stats: dict[str, int]) -> PhaseReport:
    job_rank = {j.index: j.rank for j in jobs}
    offset = comm.clock_offset_ns()
    ops = [RankOp(replace(o, start_ns=o.start_ns + offset, end_ns=o.end_ns + offset),
                  o.rank if o.rank >= 0 else job_rank[o.file], t)
           for t, r in enumerate(results) for o in r.ops]
    return PhaseReport(ops, {f: d for r in results for f, d in r.digests.items()},
                       [m for r in results for m in r.mismatches],
                       describe_error(error) if error else None, comm.host(), backend_stats,
                       objects={k: d for r in results for k, d in r.objects.items()},
                       intra_op_threads=threads.in_effect())


def phase_records(plan: Plan, iteration: int, phase: str,
             gathered: list[PhaseReport]) -> list[Record]:
    out: list[Record] = []
    per_rank: dict[int, RankRecord] = {}
    for proc, report in enumerate(gathered):
        for rop in report.ops:
            o = rop.op
            a, b = o.start_ns, o.end_ns
            name = plan.manifest if o.op == "manifest" else plan.file_paths[o.file]
            out.append(OpRecord(iteration, phase, rop.rank, rop.thread, o.op, name, o.nbytes,
                                a, b, extra=o.extra))
            rec = per_rank.get(rop.rank)
            if rec is None:
                rec = per_rank[rop.rank] = RankRecord(
                    iteration, phase, rop.rank, proc, report.host, start_ns=a, end_ns=b,
                    seconds=dict.fromkeys(OP_KINDS, 0.0),
                    intra_op_threads=report.intra_op_threads)
            rec.bytes += o.nbytes
            rec.ops += 1
            rec.start_ns = min(rec.start_ns, a)
            rec.end_ns = max(rec.end_ns, b)
            rec.seconds[o.op] = rec.seconds.get(o.op, 0.0) + (b - a) / 1e9
            if o.extra and "stored_bytes" in o.extra:
                rec.stored_bytes = (rec.stored_bytes or 0) + o.extra["stored_bytes"]
            if o.extra and isinstance(o.extra.get("parts"), dict):  # a format's own parts
                rec.parts = rec.parts or {}
                for k, v in o.extra["parts"].items():
                    rec.parts[k] = rec.parts.get(k, 0.0) + v
    for report in gathered:  # backend counters (retries...) go to the process's first rank
        ranks_of_proc = sorted({rop.rank for rop in report.ops})
        if ranks_of_proc and report.backend_stats:
            per_rank[ranks_of_proc[0]].backend = report.backend_stats
    out += [per_rank[r] for r in sorted(per_rank)]
    return out


def measured_facts(gathered: list[PhaseReport]) -> dict[str, Any]:
    """The payload bytes the restore's ops read and, where a format's ops name parts (DCP's
    load: metadata, planning, data, deserialise, sync), the parts of two ranks
    (:func:`rank_parts`): ``parts`` the slowest rank's, ``rank_parts`` the slowest and the
    median rank's with their ids; the bytes its reader read from its files
    (``file_read_bytes``), where recorded."""
    rops = [rop for report in gathered for rop in report.ops]
    out: dict[str, Any] = {"read_bytes": sum(rop.op.nbytes for rop in rops)}
    pulled = [rop.op.extra["file_read_bytes"] for rop in rops
              if rop.op.extra and isinstance(rop.op.extra.get("file_read_bytes"), int)]
    if pulled:
        out["file_read_bytes"] = sum(pulled)
    chosen = rank_parts(rops)
    if chosen:
        out["parts"] = dict(chosen["slowest"]["parts"])
        out["rank_parts"] = chosen
    return out


def rank_parts(rops: list[RankOp]) -> dict[str, dict[str, Any]]:
    """{"slowest": {"rank", "seconds", "parts"}, "median": {...}} of the ops that name
    parts, one per rank (summed where a rank has several). Slowest: the rank whose own
    work (everything but ``sync``, the wait for the others) ended last, the one every
    other rank waited for; median: the rank with the median own-work seconds (the lower
    one of an even count). Not the op that spans longest: with DCP's closing all_gather
    that is the rank that started first, mostly waiting."""
    per: dict[int, dict[str, Any]] = {}
    for rop in rops:
        o = rop.op
        if not (o.extra and isinstance(o.extra.get("parts"), dict)):
            continue
        mine = per.setdefault(rop.rank, {"rank": rop.rank, "seconds": 0.0, "parts": {},
                                         "end_ns": o.end_ns})
        mine["seconds"] += (o.end_ns - o.start_ns) / 1e9
        mine["end_ns"] = max(mine["end_ns"], o.end_ns)
        for k, v in o.extra["parts"].items():
            mine["parts"][k] = mine["parts"].get(k, 0.0) + float(v)
    if not per:
        return {}

    def own(r: dict[str, Any]) -> float:
        return float(r["seconds"] - r["parts"].get("sync", 0.0))

    slowest = max(per.values(), key=lambda r: (r["end_ns"] - r["parts"].get("sync", 0.0) * 1e9,
                                               r["rank"]))
    ordered = sorted(per.values(), key=lambda r: (own(r), r["rank"]))
    median = ordered[(len(ordered) - 1) // 2]
    return {name: {"rank": r["rank"], "seconds": r["seconds"], "parts": r["parts"]}
            for name, r in (("slowest", slowest), ("median", median))}


def fan_in(gathered: list[PhaseReport]) -> dict[str, Any]:
    """Distinct ranks that read each file, as measured (reads of payload bytes)."""
    readers: dict[int, set[int]] = {}
    for report in gathered:
        for rop in report.ops:
            if rop.op.op == "read" and rop.op.nbytes:
                readers.setdefault(rop.op.file, set()).add(rop.rank)
    counts = sorted(len(v) for v in readers.values())
    if not counts:
        return {}
    return {"file_readers_max": counts[-1], "file_readers_median": counts[len(counts) // 2],
            "files_read": len(counts)}


def check_present(backend: Backend, ckpt: str, gathered: list[PhaseReport],
                   files_of: Plan | None) -> None:
    """Before a manifest is committed: every object it names (and, with a plan, every file
    written) is there, so that a checkpoint whose files vanished (removed by another
    process) is never committed as if complete."""
    if not backend.capabilities.restore:  # a backend that keeps nothing (null)
        return
    keys = [f"{ckpt}/{k}" for r in gathered for k in (r.objects or {})]
    if files_of is not None:
        keys += [f"{ckpt}/{files_of.file_paths[f]}" for r in gathered for f in r.digests]
    unique = list(dict.fromkeys(keys))
    with ThreadPoolExecutor(max(1, min(16, len(unique)))) as pool:  # a store: one request each
        there = list(pool.map(backend.exists, unique))
    missing = next((k for k, ok in zip(unique, there, strict=True) if not ok), None)
    if missing is not None:
        raise BackendError(f"{backend.target.rstrip('/')}/{missing}: written in this save but no "
                        "longer there (removed by another process?); the checkpoint is not "
                        "committed")
