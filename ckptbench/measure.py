"""A measured run end to end, for the CLI and for scripts that call the library in process:
the session, then the summary (the report step) appended to the results file.

Sits above the runner and the report in the data flow: the runner records, the report
summarizes, and this glue hands the caller the summary it computed from the records in
memory (the results file is written once and never read back).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ckptbench import runspec
from ckptbench.backends import Backend, BackendOptions, IOHints, open_backend
from ckptbench.backends.local import LocalBackend
from ckptbench.errors import CkptbenchError, RunFailed, SpecError
from ckptbench.fields import parse_ranks
from ckptbench.formats import check_format
from ckptbench.plan import Plan, build_plan
from ckptbench.plan.restore import restore_plan_of
from ckptbench.progress import Segment, Status
from ckptbench.records import JsonlSink
from ckptbench.report import summarize, summarize_async, view
from ckptbench.report.tiers import summarize_tiers
from ckptbench.runner import Launcher, RunOptions, RunRequest, kept, new_run_id, run_session
from ckptbench.runner.options import PLANNED_RESTORE, LoopOptions
from ckptbench.runner.sequence import steps
from ckptbench.spec import Workload, load_workload, scaled, with_restore_layout
from ckptbench.tierspec import TiersSpec, tiers_with_flags
from ckptbench.units import format_bytes


def build_request(workload: str | Path | Workload, target: str | None = None, *,
                  command: str = "run", backend: Backend | None = None,
                  backend_options: BackendOptions | Mapping[str, Any] | None = None,
                  **options: Any) -> RunRequest:
    """The one place a run request is made (`run`, `restore`, `sweep`, `mlperf`, scripts):
    the workload (a file, full size, or a Workload), `target` (or an opened `backend`) and
    any run option by its declared name (ckptbench.runspec: iterations, scale, ranks ('0-7'
    or a list), block_size, format, mode, step_seconds, ...) or RunOptions field (run_id,
    loop, checkpoint); the rest are `command`'s defaults. Every check the CLI makes happens
    here (one-line errors); the request records the options it was made of."""
    settings, extra = _settings(command, target, options)
    full = workload if isinstance(workload, Workload) else load_workload(workload)
    full = with_restore_layout(full, settings["restore_world_size"], settings["restore_layout"])
    run_workload = scaled(full, settings["scale"])
    plan = build_plan(run_workload)
    ranks = settings["ranks"]
    selected = (parse_ranks(ranks, plan.world_size) if isinstance(ranks, str) else
                list(ranks) if ranks is not None else list(range(plan.world_size)))
    fmt = extra.pop("format", settings["format"])
    settings["format"] = fmt
    codec = check_format(fmt, settings["codec"], plan, selected)
    settings["codec"] = codec.text() if fmt == "zarr" else "none"
    extra["tiers"] = tiers_of(command, full.tiers, settings, extra.pop("tiers_spec", None))
    if extra["tiers"].keep and settings["mode"] == "async":
        raise SpecError("--keep-tiers ([tiers] keep) needs --mode sync (an async run's "
                        "background replication keeps no copies for a relaunch)")
    run_options = _run_options(settings, extra, fmt, run_workload.checkpoint.threads)
    ck = run_workload.checkpoint
    hints = IOHints(block_size=run_options.block_size, threads=run_options.threads,
                    stripe_size=ck.stripe_size, stripe_count=ck.stripe_count,
                    ranks_per_host=len(selected))
    req = RunRequest(workload=full, plan=plan, ranks=selected,
                     backend=backend or open_backend(settings["target"], backend_options, hints),
                     options=run_options, scale=settings["scale"],
                     restore_shift_auto=settings["restore_shift"] is None,
                     command=command, settings=settings)
    try:
        check_disk(req)
    except BaseException:
        if backend is None:
            req.backend.release()
        raise
    return req


def restore_request(checkpoint: str, settings: Mapping[str, Any],
                    backend_options: BackendOptions | Mapping[str, Any] | None = None
                    ) -> RunRequest:
    """`ckptbench restore`: the request to restore CHECKPOINT (TARGET/RUN_ID/CHECKPOINT,
    kept with --keep) as its manifest describes it (workload, ranks, payload, format),
    with the run options of `settings` (the restore command's)."""
    root, prefix = kept.split_checkpoint(checkpoint)
    backend = open_backend(root, backend_options,
                           IOHints(block_size=runspec.option("block_size").parse(
                               settings["block_size"], "--block-size"),
                               threads=settings["threads"] or 1))
    try:
        manifest = kept.read_checkpoint(backend, checkpoint, prefix)
        workload = kept.checkpoint_workload(manifest, prefix)
        plan = build_plan(with_restore_layout(workload, settings["restore_world_size"],
                                              settings["restore_layout"]))
        ranks = kept.written_ranks(plan, manifest, prefix)
        return build_request(workload, root, command="restore", backend=backend, ranks=ranks,
                             **runspec.request_options(settings),
                             format=str(manifest.get("format", "raw")),
                             payload=manifest["payload"], seed=manifest["seed"], keep=True,
                             restore=True, checkpoint=prefix,
                             checkpoint_iteration=manifest["iteration"])
    except BaseException:
        backend.release()
        raise


def _settings(command: str, target: str | None, given: Mapping[str, Any]
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(declared option -> value, every request option; RunOptions fields given that no
    option declares). A RunOptions field an option sets (prefill_bytes, loop) counts as
    that option, so the record says what ran."""
    settings = {o.name: o.parse(o.default_for(command), o.cli_flag) for o in runspec.OPTIONS
                if o.request}
    by_field = {o.field: o for o in runspec.OPTIONS if o.field}
    given = dict(given)
    loop = given.pop("loop", None)
    if isinstance(loop, LoopOptions):
        given.update({f"loop.{k}": v for k, v in loop.__dict__.items()})
    if target is not None:
        given["target"] = target
    if isinstance(given.get("tiers"), TiersSpec):  # the RunOptions field, not the option
        given["tiers_spec"] = given.pop("tiers")
    extra: dict[str, Any] = {}
    for key, value in given.items():
        opt = by_field.get(key) if key not in settings else runspec.option(key)
        if opt is None or not opt.request:
            extra[key] = value
            continue
        settings[opt.name] = opt.parse(value, opt.cli_flag)
    return settings, extra


def _run_options(settings: dict[str, Any], extra: dict[str, Any], fmt: str,
                 workload_threads: int) -> RunOptions:
    """The runner's options from the declared ones (each by its `field`)."""
    check_settings(settings, fmt)
    settings["restore_plan"] = restore_plan(settings, fmt)
    fields: dict[str, Any] = {}
    loop: dict[str, Any] = {}
    for opt in runspec.OPTIONS:
        if opt.field and opt.name in settings:
            name = opt.field.removeprefix("loop.")
            (loop if opt.field.startswith("loop.") else fields)[name] = settings[opt.name]
    threads = settings["intra_op_threads"]  # auto (0) resolved by the session
    fields.update(intra_op_threads=0 if threads == "auto" else int(threads))
    fields.update(threads=settings["threads"] or workload_threads,
                  restore_shift=settings["restore_shift"] or 0,
                  restore_plan=settings["restore_plan"], codec=settings["codec"], format=fmt)
    extra.setdefault("run_id", new_run_id())
    return RunOptions(**fields, loop=LoopOptions(**loop), **extra)


def tiers_of(command: str, base: TiersSpec, settings: Mapping[str, Any],
             spec: TiersSpec | None = None) -> TiersSpec:
    """The recovery tiers of a `run`: the workload's [tiers] (`base`) with the tier options
    given (or a TiersSpec given whole); the other commands have none."""
    if spec is not None:
        return spec
    if command != "run":
        return TiersSpec()
    return tiers_with_flags(base, {key: settings[name] for name, key in runspec.TIER_KEYS.items()})


def check_settings(settings: Mapping[str, Any], fmt: str) -> None:
    """Options that do not go together: one line naming the flag."""
    if not settings["verify"] and fmt != "raw":
        raise SpecError(f"--no-verify needs --format raw (--format {fmt} always verifies); "
                        "allowed: drop --no-verify, or --format raw")
    if settings["mode"] != "async":
        for opt in runspec.OPTIONS:
            if (opt.field.startswith("loop.") and opt.name in settings
                    and settings[opt.name] != opt.parse(opt.default, opt.cli_flag)):
                raise SpecError(f"{opt.cli_flag} needs --mode async (a sync run has no "
                                "training loop)")


def restore_plan(settings: Mapping[str, Any], fmt: str) -> str:
    """The restore plan to run: dcp for the raw and torch-dcp formats unless asked
    otherwise; a restore layout only with it (files restore on the training layout)."""
    asked = settings["restore_plan"]
    if asked == "dcp" and fmt not in PLANNED_RESTORE:
        raise SpecError(f"--restore-plan dcp needs --format {' or '.join(PLANNED_RESTORE)} "
                        f"(--format {fmt} reads back its own files); allowed here: "
                        "--restore-plan files")
    plan = asked or ("dcp" if fmt in PLANNED_RESTORE else "files")
    given = ("--restore-world-size" if settings["restore_world_size"] is not None else
             "--restore-layout" if settings["restore_layout"] is not None else None)
    if plan == "files" and given:
        why = "--restore-plan files" if asked else f"--format {fmt} reads back its own files"
        raise SpecError(f"{given} needs --restore-plan dcp ({why}: each rank reads back the "
                        f"files it wrote, on the training layout); allowed: drop {given}")
    return str(plan)


def restore_bytes(plan: Plan, selected: list[int], restore_plan: str) -> int:
    """Bytes one restore reads: the DCP plan's reads of the ranks that run, or the files."""
    if restore_plan != "dcp":
        return plan.bytes_of_ranks(selected)
    rplan = restore_plan_of(plan)  # built here, before the processes fork: they share it
    if len(selected) == plan.world_size:
        return rplan.total_bytes
    return rplan.bytes_of_ranks([r for r in selected if r < rplan.world_size])


def check_disk(req: RunRequest) -> None:
    """writes-then-reads keeps every checkpoint on the target until its read: a local
    target whose file system cannot hold them all is refused before anything is written."""
    backend = req.backend
    if req.options.sequence != "writes-then-reads" or not isinstance(backend, LocalBackend):
        return
    per = req.plan.bytes_of_ranks(req.ranks)
    need = per * req.options.iterations
    where = next((p for p in (backend.root, *backend.root.parents) if p.exists()), None)
    free = shutil.disk_usage(where).free if where is not None else need
    if need > free:
        raise SpecError(
            f"--iterations {req.options.iterations} x {format_bytes(per)} per checkpoint = "
            f"{format_bytes(need)} on {backend.root} at once (--sequence writes-then-reads "
            f"keeps each checkpoint until its read); its file system has {format_bytes(free)} "
            "free; allowed: fewer --iterations or --ranks, a larger --scale, or "
            "--sequence interleaved")


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
            sink.write_all(summarize(sink.records) + summarize_async(sink.records)
                           + summarize_tiers(sink.records))
            sink.close()
            outcome = view(sink.records, str(results))
        elif sink is not None:
            sink.close()
    if failure is not None:
        raise failure
    return outcome


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


def measure_per_node(launcher: Launcher, k: int, request: Callable[[list[int]], RunRequest],
                     results: Path, command: str) -> None:
    """Collective: a sweep's point. `request(ranks)` is measured on the first `k`
    processes of each of the launcher's nodes (local: `k` local processes; under
    mpirun/srun: `k` MPI ranks on every node, the others waiting without spinning), the
    first k x nodes plan ranks; process 0 writes `results`. Every process returns once
    the point is over everywhere, or raises when it failed (process 0: its error)."""
    point, nodes = launcher.per_node(k)
    error: CkptbenchError | None = None
    if point is not None:
        try:
            req = request(list(range(k * nodes)))
            with run_status(req, f"{command}, {k} rank(s) per node", point) as status:
                measure(req, results, point, on_progress=status)
        except CkptbenchError as exc:
            error = exc
    launcher.idle_barrier()
    if launcher.share(error is not None):  # process 0 measures every point
        raise error or RunFailed(f"{command}: the point of {k} rank(s) per node failed", "run")
