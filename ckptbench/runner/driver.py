"""The iteration loop every process runs collectively, and the records it leaves.

Process 0 is the coordinator: it commits each checkpoint's manifest, writes the records,
decides together with the others whether an iteration failed, and cleans up.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ckptbench.backends import Backend
from ckptbench.errors import CkptbenchError, VerificationError
from ckptbench.formats import engine_class
from ckptbench.plan import Plan
from ckptbench.records import ResultsWriter
from ckptbench.runner.comm import Comm
from ckptbench.runner.engine import (
    MANIFEST_SCHEMA,
    FileJob,
    RunOptions,
    ThreadResult,
    describe_error,
    file_jobs,
    first_error,
    manifest_files,
    now,
)

OP_KINDS = ("open", "write", "fsync", "close", "read")


class RunFailed(CkptbenchError):
    """An iteration failed on some process; the message says where and why."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.exit_code = 2 if kind == "backend" else 1


def _restore_ranks(my_ranks: list[int], all_ranks: list[int], shift: int) -> list[int]:
    pos = {r: k for k, r in enumerate(all_ranks)}
    return [all_ranks[(pos[r] + shift) % len(all_ranks)] for r in my_ranks]


def _thread_payload(results: list[ThreadResult], jobs: list[FileJob], comm: Comm,
                    error: BaseException | None, backend_stats: dict[str, int]) -> dict[str, Any]:
    job_rank = {j.index: j.rank for j in jobs}
    offset = comm.clock_offset_ns()
    ops = [(op, f, job_rank[f], t, n, a + offset, b + offset, *extra)
           for t, r in enumerate(results) for op, f, n, a, b, *extra in r.ops]
    return {
        "ops": ops,
        "digests": {f: d for r in results for f, d in r.digests.items()},
        "mismatches": [m for r in results for m in r.mismatches],
        "error": describe_error(error) if error else None,
        "host": comm.host(),
        "backend_stats": backend_stats,
    }


def _records(plan: Plan, iteration: int, phase: str,
             gathered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    per_rank: dict[int, dict[str, Any]] = {}
    for proc, payload in enumerate(gathered):
        for op, f, rank, thread, n, a, b, *extra in payload["ops"]:
            out.append({"type": "op", "iteration": iteration, "phase": phase, "rank": rank,
                        "thread": thread, "op": op, "file": plan.file_paths[f], "bytes": n,
                        "start_ns": a, "end_ns": b, **(extra[0] if extra else {})})
            rec = per_rank.setdefault(rank, {
                "type": "rank", "iteration": iteration, "phase": phase, "rank": rank,
                "process": proc, "host": payload["host"], "bytes": 0, "start_ns": a,
                "end_ns": b, "ops": 0, **{f"{k}_s": 0.0 for k in OP_KINDS}})
            rec["bytes"] += n
            rec["ops"] += 1
            rec["start_ns"] = min(rec["start_ns"], a)
            rec["end_ns"] = max(rec["end_ns"], b)
            rec[f"{op}_s"] = rec.get(f"{op}_s", 0.0) + (b - a) / 1e9
            if extra and "stored_bytes" in extra[0]:
                rec["stored_bytes"] = rec.get("stored_bytes", 0) + extra[0]["stored_bytes"]
    for payload in gathered:  # backend counters (retries...) go to the process's first rank
        ranks_of_proc = sorted({op[2] for op in payload["ops"]})
        if ranks_of_proc and payload.get("backend_stats"):
            per_rank[ranks_of_proc[0]]["backend"] = payload["backend_stats"]
    out += [per_rank[r] for r in sorted(per_rank)]
    return out


def run_iterations(plan: Plan, my_ranks: list[int], all_ranks: list[int], backend: Backend,
                   comm: Comm, options: RunOptions, writer: ResultsWriter | None,
                   progress: Callable[[int], None] | None = None) -> None:
    """Run every iteration; raise RunFailed (on every process) when one fails."""
    engine = engine_class(options.format)(plan, my_ranks, backend, comm, options, progress)
    coordinator = comm.rank == 0
    manifest_name = plan.manifest
    for it in range(1, options.iterations + 1):
        ckpt = f"{options.run_id}/{plan.checkpoint_name(it)}"
        manifest_key = f"{ckpt}/{manifest_name}"
        jobs = file_jobs(plan, my_ranks, ckpt, it, options.seed)

        # --- save ---
        try:
            results = engine.save(jobs)
            err = first_error(results)
        except BaseException as exc:  # noqa: BLE001 - decided together below
            results, err = [], exc
        gathered = comm.gather(_thread_payload(results, jobs, comm, err, backend.stats()))
        decision: dict[str, Any] = {"ok": True}
        if coordinator:
            assert gathered is not None
            decision = _commit(plan, backend, ckpt, manifest_key, it, options, gathered, writer)
        decision = comm.bcast(decision)
        if not decision["ok"]:
            raise RunFailed(decision["message"], decision["kind"])

        # --- cache ---
        method = "none"
        if options.restore and options.cache == "auto":
            method = backend.drop_cache(engine.cache_keys(jobs))
        comm.barrier()
        dropped = False
        if coordinator and options.restore and options.cache == "auto" and method == "fadvise":
            dropped = backend.drop_host_caches()
        if comm.bcast(dropped):
            method = f"{method}+drop_caches"
        methods = comm.gather(method)

        # --- restore ---
        if options.restore:
            read_ranks = _restore_ranks(my_ranks, all_ranks, options.restore_shift)
            rjobs = file_jobs(plan, read_ranks, ckpt, it, options.seed)
            manifest_t: tuple[int, int] | None = None
            try:
                rresults, manifest_t = engine.restore(rjobs, manifest_key)
                rerr = first_error(rresults)
            except BaseException as exc:  # noqa: BLE001
                rresults, rerr = [], exc
            payload = _thread_payload(rresults, rjobs, comm, rerr, backend.stats())
            if manifest_t is not None:
                off = comm.clock_offset_ns()
                payload["manifest"] = (manifest_t[0] + off, manifest_t[1] + off)
            rgathered = comm.gather(payload)
            if coordinator:
                assert rgathered is not None and methods is not None
                decision = _finish_restore(plan, it, rgathered, methods, options, writer)
                if not decision["ok"] and not options.keep:
                    backend.remove_tree(ckpt)
            decision = comm.bcast(decision)
            if not decision["ok"]:
                raise RunFailed(decision["message"], decision["kind"])

        # --- cleanup ---
        comm.barrier()
        if coordinator and not options.keep:
            backend.remove_tree(ckpt)
    if coordinator and not options.keep:
        backend.remove_tree(options.run_id)


def _fail(gathered: list[dict[str, Any]]) -> tuple[str, str] | None:
    for payload in gathered:
        if payload["error"]:
            return payload["error"]
    return None


def _commit(plan: Plan, backend: Backend, ckpt: str, manifest_key: str, it: int,
            options: RunOptions, gathered: list[dict[str, Any]],
            writer: ResultsWriter | None) -> dict[str, Any]:
    records = _records(plan, it, "save", gathered)
    failure = _fail(gathered)
    commit: tuple[int, int] | None = None
    if failure is None:
        digests: dict[int, list[int]] = {}
        for payload in gathered:
            digests.update(payload["digests"])
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "run_id": options.run_id,
            "iteration": it,
            "workload": plan.workload.name,
            "payload": options.payload,
            "seed": options.seed,
            "format": options.format,
            "codec": options.codec,
            "files": manifest_files(plan, ckpt, digests),
        }
        try:
            t0 = now()
            backend.put_atomic(manifest_key, json.dumps(manifest).encode())
            commit = (t0, now())
        except BaseException as exc:  # noqa: BLE001
            failure = describe_error(exc)
    if commit:
        records.append({"type": "op", "iteration": it, "phase": "save", "rank": 0, "thread": -1,
                        "op": "commit", "file": manifest_key.rsplit("/", 1)[-1], "bytes": 0,
                        "start_ns": commit[0], "end_ns": commit[1]})
    records.append({"type": "phase", "iteration": it, "phase": "save", "ok": failure is None,
                    "checkpoint": ckpt, "processes": len(gathered),
                    "commit_ns": [commit[0], commit[1]] if commit else None})
    if failure is not None:
        backend.remove_tree(ckpt)
        records.append({"type": "error", "iteration": it, "phase": "save", "kind": failure[0],
                        "message": failure[1], "removed": ckpt})
    if writer:
        writer.write_all(records)
    if failure is not None:
        return {"ok": False, "kind": failure[0], "message": failure[1]}
    return {"ok": True}


def _finish_restore(plan: Plan, it: int, gathered: list[dict[str, Any]], methods: list[str],
                    options: RunOptions, writer: ResultsWriter | None) -> dict[str, Any]:
    records = _records(plan, it, "restore", gathered)
    for proc, payload in enumerate(gathered):
        if "manifest" in payload:
            a, b = payload["manifest"]
            records.append({"type": "op", "iteration": it, "phase": "restore", "rank": -1,
                            "process": proc, "thread": -1, "op": "manifest", "file": plan.manifest,
                            "bytes": 0, "start_ns": a, "end_ns": b})
    mismatches = [m for p in gathered for m in p["mismatches"]]
    failure = _fail(gathered)
    if failure is None and mismatches:
        failure = ("verification", mismatches[0] + (f" (and {len(mismatches) - 1} more chunks)"
                                                    if len(mismatches) > 1 else ""))
    unique_methods = sorted(set(methods))
    records.append({"type": "phase", "iteration": it, "phase": "restore", "ok": failure is None,
                    "cache": unique_methods[0] if len(unique_methods) == 1 else unique_methods,
                    "verified": failure is None, "mismatched_chunks": len(mismatches),
                    "restore_shift": options.restore_shift})
    if failure is not None:
        records.append({"type": "error", "iteration": it, "phase": "restore", "kind": failure[0],
                        "message": failure[1]})
    if writer:
        writer.write_all(records)
    if failure is not None:
        return {"ok": False, "kind": failure[0], "message": failure[1]}
    return {"ok": True}


__all__ = ["RunFailed", "VerificationError", "run_iterations"]
