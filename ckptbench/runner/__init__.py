"""Executing a plan: local processes by default, MPI ranks under mpirun/srun."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptbench.backends import Backend
from ckptbench.plan import Plan
from ckptbench.plan.export import summary as plan_summary
from ckptbench.records import SCHEMA, ResultsWriter, environment
from ckptbench.report import summarize
from ckptbench.runner.engine import RunOptions
from ckptbench.spec import Workload

__all__ = ["RunOptions", "RunRequest", "execute", "new_run_id"]


def new_run_id() -> str:
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


@dataclass(frozen=True)
class RunRequest:
    workload: Workload  # as written in the workload file (full size)
    plan: Plan  # of the workload as run (after --scale)
    ranks: list[int]
    backend: Backend
    options: RunOptions
    results: Path
    scale: int = 1


def run_record(req: RunRequest, launcher: str) -> dict[str, Any]:
    return {
        "type": "run",
        "schema": SCHEMA,
        "run_id": req.options.run_id,
        "launcher": launcher,
        "workload": req.workload.to_dict(),
        "scale": req.scale,
        "run_workload": req.plan.workload.to_dict(),
        "plan": plan_summary(req.plan),
        "ranks": req.ranks,
        "bytes_per_iteration": int(sum(int(req.plan.rank_bytes()[r]) for r in req.ranks)),
        "options": req.options.to_dict(),
        "environment": environment(req.backend.describe()),
    }


def execute(req: RunRequest, on_progress: Callable[[int], None] | None = None,
            on_start: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Run locally (one process per plan rank); return the summary records written.

    `on_start` is called once the target and the results file are known to be usable.
    """
    from ckptbench.records import read_records
    from ckptbench.runner.local import run_local

    writer = ResultsWriter(req.results)
    writer.open()
    try:
        req.backend.prepare()
    except BaseException:
        writer.close()
        req.results.unlink()
        raise
    if on_start:
        on_start()
    try:
        writer.write(run_record(req, "local"))
        writer.flush()
        try:
            run_local(req.plan, req.ranks, req.backend, req.options, writer, on_progress)
        finally:
            writer.flush()
            summary = summarize(list(read_records(req.results)))
            writer.write_all(summary)
    finally:
        writer.close()
        if not req.options.keep:
            req.backend.remove_tree(req.options.run_id)
        req.backend.release()
    return summary
