"""A measured run end to end, for the CLI and for scripts that call the library in process:
the session, then the summary (the report step) appended to the results file.

Sits above the runner and the report in the data flow: the runner records, the report
summarizes, and this glue hands the caller the summary it computed from the records in
memory (the results file is written once and never read back).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ckptbench.backends import BackendOptions, IOHints, open_backend
from ckptbench.fields import parse_ranks
from ckptbench.formats import check_format
from ckptbench.plan import Plan, build_plan
from ckptbench.plan.restore import restore_plan_of
from ckptbench.progress import Segment, Status
from ckptbench.records import JsonlSink
from ckptbench.report import summarize, summarize_async, view
from ckptbench.runner import Launcher, RunOptions, RunRequest, new_run_id, run_session
from ckptbench.runner.sequence import steps
from ckptbench.spec import load_workload, scaled


def build_request(workload: str | Path, target: str, *, scale: int = 1,
                  ranks: str | list[int] | None = None,
                  backend_options: BackendOptions | Mapping[str, Any] | None = None,
                  restore_shift: int | None = None, **options: Any) -> RunRequest:
    """A run request as `ckptbench run` builds it: the workload file (full size), scaled by
    `scale`, the plan ranks to run ('0-7' or a list; default all), the target's backend with
    its options (typed, or option names -> values) and the runner's I/O hints, and any
    RunOptions field (iterations, threads, block_size, format, codec, ...). Every check the
    CLI makes happens here (one-line errors). --mode async: mode="async" and
    loop=LoopOptions(...)."""
    full = load_workload(workload)
    run_workload = scaled(full, scale)
    plan = build_plan(run_workload)
    if isinstance(ranks, str):
        selected = parse_ranks(ranks, plan.world_size)
    else:
        selected = list(ranks) if ranks is not None else list(range(plan.world_size))
    fmt = options.get("format", "raw")
    codec = check_format(fmt, options.get("codec", "none"), plan, selected)
    options.update(codec=codec.text() if fmt == "zarr" else "none")
    options.setdefault("threads", run_workload.checkpoint.threads)
    options.setdefault("run_id", new_run_id())
    run_options = RunOptions(restore_shift=restore_shift or 0, **options)
    ck = run_workload.checkpoint
    hints = IOHints(block_size=run_options.block_size, threads=run_options.threads,
                    stripe_size=ck.stripe_size, stripe_count=ck.stripe_count,
                    ranks_per_host=len(selected))
    return RunRequest(workload=full, plan=plan, ranks=selected,
                      backend=open_backend(target, backend_options, hints),
                      options=run_options, scale=scale,
                      restore_shift_auto=restore_shift is None)


def measure(req: RunRequest, results: str | Path, launcher: Launcher | None = None,
            on_progress: Callable[[int], None] | None = None,
            on_start: Callable[[], None] | None = None,
            on_notice: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """Run `req`, write its records and summary to `results` (a new file); return the run
    as :func:`ckptbench.report.view` gives it (None on MPI ranks other than 0). Raises
    RunFailed after the summary of what did run is written. `on_notice` gets one-line
    notes for the user (what interrupted runs left, files left in place)."""
    if launcher is None:
        from ckptbench.runner.launch_local import LocalLauncher

        launcher = LocalLauncher()
    sink = JsonlSink(results) if launcher.root else None
    outcome = None
    try:
        failure = run_session(req, launcher, sink, on_progress, on_start, on_notice)
    finally:
        if sink is not None and sink.is_open:  # also when interrupted: what ran is summarized
            sink.write_all(summarize(sink.records) + summarize_async(sink.records))
            sink.close()
            outcome = view(sink.records, str(results))
        elif sink is not None:
            sink.close()
    if failure is not None:
        raise failure
    return outcome


def restore_bytes(plan: Plan, selected: list[int], restore_plan: str) -> int:
    """Bytes one restore reads: the DCP plan's reads of the ranks that run, or the files."""
    if restore_plan != "dcp":
        return plan.bytes_of_ranks(selected)
    rplan = restore_plan_of(plan)  # built here, before the processes fork: they share it
    if len(selected) == plan.world_size:
        return rplan.total_bytes
    return rplan.bytes_of_ranks([r for r in selected if r < rplan.world_size])


def progress_segments(req: RunRequest) -> list[Segment]:
    """The stretches of `req`'s bytes in the order the ranks move them (behind barriers):
    each checkpoint's save (an async run's persist) and restore, in the run's sequence."""
    o = req.options
    n = o.iterations
    saves = 0 if o.checkpoint else req.plan.bytes_of_ranks(req.ranks)
    reads = restore_bytes(req.plan, req.ranks, o.restore_plan) if o.restore else 0
    save = "persist" if o.mode == "async" else "save"
    order = steps("writes-then-reads" if o.mode == "async" else o.sequence, n)
    out: list[Segment] = []
    for step in order:
        if step.save and saves:
            out.append(Segment(f"{save} checkpoint {step.iteration}/{n}", saves))
        if step.read and reads:
            out.append(Segment(f"restore checkpoint {step.iteration}/{n}", reads))
    return out or [Segment("run", 0)]


def run_status(req: RunRequest, command: str, launcher: Launcher | None = None) -> Status:
    """The progress of `req` on stderr (ckptbench.progress), on process 0 alone: pass its
    advance (or the status itself: local processes then show the slowest rank) as
    `measure`'s on_progress and its note as on_notice."""
    status = Status(command, progress_segments(req), enabled=launcher is None or launcher.root)
    status.rank_names, status.rank_totals = list(req.ranks), rank_totals(req)
    return status


def rank_totals(req: RunRequest) -> list[int]:
    """Bytes each rank of `req` moves over the run: its saves and the reads of its place
    in the restore layout (or its own files read back)."""
    o = req.options
    saves = req.plan.rank_bytes()
    reads = saves
    if o.restore and o.uses_restore_plan:
        reads = restore_plan_of(req.plan).rank_bytes()
    out = []
    for r in req.ranks:
        read = int(reads[r]) if o.restore and r < len(reads) else 0
        out.append(o.iterations * (read + (0 if o.checkpoint else int(saves[r]))))
    return out
