"""`ckptbench restore CHECKPOINT`: measure the restore of a checkpoint kept with --keep again
(later, after a reboot, from other hosts, onto another restore layout)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ckptbench.backends import Backend, IOHints, open_backend
from ckptbench.backends.base import TARGET_MARKER
from ckptbench.cli.backend_options import backend_options, options_for_target, typed_backend_flags
from ckptbench.cli.plan_cmd import apply_restore_layout, restore_layout_options
from ckptbench.cli.run_cmd import (
    RESTORE_PLANS,
    RestoreChoice,
    parse_stall_timeout,
    quiet_unless_root,
    stall_timeout_option,
    stopped_as,
)
from ckptbench.errors import CkptbenchError, RunFailed, SpecError, VerificationError
from ckptbench.fields import shown
from ckptbench.formats import check_format
from ckptbench.formats.base import MANIFEST_SCHEMA
from ckptbench.formats.manifest import load_manifest
from ckptbench.measure import measure, run_status
from ckptbench.payload import MODES as PAYLOAD_MODES
from ckptbench.plan import MANIFEST_NAME, Plan, build_plan
from ckptbench.report import table
from ckptbench.runner import Launcher, RunOptions, RunRequest, new_run_id, open_launcher
from ckptbench.runner.options import PLANNED_RESTORE
from ckptbench.runner.signals import stop_on_signals
from ckptbench.spec import Workload, workload_from_dict
from ckptbench.units import parse_size


def split_checkpoint(checkpoint: str) -> tuple[str, str]:
    """TARGET/RUN_ID/CHECKPOINT -> (TARGET, 'RUN_ID/CHECKPOINT')."""
    parts = checkpoint.rstrip("/").rsplit("/", 2)
    if len(parts) != 3 or not all(parts) or parts[0].endswith(":"):
        raise SpecError(f"CHECKPOINT {checkpoint!r}: allowed: TARGET/RUN_ID/CHECKPOINT, the "
                        "directory of a checkpoint kept with --keep (e.g. "
                        "ckptbench-data/run-20250101-120000-1/checkpoint-1)")
    return parts[0], f"{parts[1]}/{parts[2]}"


def read_checkpoint(backend: Backend, checkpoint: str, prefix: str) -> dict[str, Any]:
    """The checkpoint's manifest, once it is known to be ckptbench's and each field a
    restore uses holds what it may (else one line naming the field)."""
    if not backend.exists(TARGET_MARKER):
        raise CkptbenchError(f"{checkpoint}: its target has no {TARGET_MARKER} marker; "
                             "ckptbench restores only checkpoints it wrote")
    key = f"{prefix}/{MANIFEST_NAME}"
    try:
        manifest, _ = load_manifest(backend.for_parent(), key)  # before the ranks fork
    except FileNotFoundError:
        raise CkptbenchError(f"{checkpoint}: no manifest {MANIFEST_NAME}; allowed: a "
                             "checkpoint ckptbench committed and kept with --keep") from None
    except VerificationError as exc:
        raise RunFailed(str(exc), "verification") from None
    if manifest.get("schema") != MANIFEST_SCHEMA:
        raise CkptbenchError(f"{key}: schema {shown(manifest.get('schema'))} is not "
                             f"{MANIFEST_SCHEMA!r}; ckptbench restores only checkpoints it wrote")
    if manifest.get("format", "raw") not in PLANNED_RESTORE:
        raise CkptbenchError(f"{key}: written as --format {shown(manifest.get('format'))}; "
                             f"allowed: checkpoints written with --format "
                             f"{' or '.join(PLANNED_RESTORE)}")
    if not isinstance(manifest.get("workload_spec"), dict):
        raise CkptbenchError(f"{key}: no workload_spec (written by an older ckptbench); "
                             "allowed: checkpoints of this version")
    for field, fits, rule in _FIELDS:
        if field not in manifest or not fits(manifest[field]):
            value = shown(manifest[field]) if field in manifest else "missing"
            raise CkptbenchError(f"{key}: {field} is {value}; allowed: {rule} (an altered or "
                                 "older manifest); the checkpoint is not restored")
    return manifest


def _is_int(value: Any, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


# The manifest fields a restore uses: (field, check, what is allowed).
_FIELDS: list[tuple[str, Callable[[Any], bool], str]] = [
    ("files", lambda v: isinstance(v, dict), "an object of file entries"),
    ("ranks", lambda v: isinstance(v, list) and bool(v) and all(_is_int(r) for r in v),
     "a non-empty list of the ranks that wrote (integers >= 0)"),
    ("payload", lambda v: v in PAYLOAD_MODES, ", ".join(PAYLOAD_MODES)),
    ("seed", _is_int, "an integer >= 0"),
    ("iteration", lambda v: _is_int(v, 1), "an integer >= 1"),
]


def checkpoint_workload(manifest: dict[str, Any], prefix: str) -> Workload:
    """The workload the manifest was written for (errors name the manifest)."""
    try:
        return workload_from_dict(manifest["workload_spec"])
    except SpecError as exc:
        raise SpecError(f"{prefix}/{MANIFEST_NAME}: workload_spec: {exc}") from None


def written_ranks(plan: Plan, manifest: dict[str, Any], prefix: str) -> list[int]:
    """The ranks that wrote (the manifest's 'ranks'); every file of each must have an
    entry, and every entry must be a file of one of them: a manifest that lost an entry
    would otherwise restore fewer ranks and call that verified."""
    where = f"{prefix}/{MANIFEST_NAME}"
    ranks = sorted(set(manifest["ranks"]))
    if ranks[-1] >= plan.world_size:
        raise CkptbenchError(f"{where}: rank {ranks[-1]} is not a rank of its workload's plan "
                             f"(world_size {plan.world_size}; an altered manifest)")
    names = {f"{prefix}/{p}" for p in plan.file_paths}
    listed: set[tuple[str, Any]] = set()
    for name, entry in manifest["files"].items():
        if not isinstance(entry, dict):
            raise CkptbenchError(f"{where}: entry {shown(name)} is {shown(entry)}; allowed: an "
                                 "object with its rank, chunks and digests (altered manifest)")
        path, rank = entry.get("path", name), entry.get("rank")
        if not isinstance(path, str) or path not in names or rank not in ranks:
            raise CkptbenchError(f"{where}: entry {shown(name)} is not a file of its "
                                 "workload's plan written by one of its ranks (altered manifest)")
        listed.add((path, rank))
    for r in ranks:
        for f in plan.files_of_rank(r):
            path = f"{prefix}/{plan.file_paths[f]}"
            if (path, int(plan.file_rank[f])) not in listed:
                raise CkptbenchError(f"{where}: no entry for {path}, a file of rank {r} (the "
                                     "manifest lists that rank as written; an altered manifest);"
                                     " the checkpoint is not restored")
    return ranks


@click.command("restore")
@click.argument("checkpoint")
@click.option("--iterations", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="I/O threads per rank [default: the workload's checkpoint.threads].")
@click.option("--block-size", default="8MiB", show_default=True, help="Bytes per read call.")
@click.option("--cache", type=click.Choice(["auto", "none"]), default="auto", show_default=True,
              help="auto: evict the checkpoint from caches before each restore.")
@click.option("--restore-shift", type=int, default=None,
              help="Shift the restore ranks by N positions (IOR -C) [default: as for run].")
@click.option("--restore-plan", type=click.Choice(RESTORE_PLANS), default="dcp", show_default=True,
              help="dcp: DCP's load planner's reads for the restore layout; files: each rank "
                   "reads back the files it wrote.")
@restore_layout_options
@click.option("--results", type=click.Path(dir_okay=False), default=None,
              help="Results file [default: results/<workload>-restore-<run id>.jsonl].")
@click.option("--launcher", type=click.Choice(["auto", "local", "mpi"]), default="auto",
              show_default=True)
@stall_timeout_option
@backend_options
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def restore_command(checkpoint: str, iterations: int, threads: int | None, block_size: str,
                    cache: str, restore_shift: int | None, restore_plan: str,
                    restore_world_size: int | None, restore_layout: str | None,
                    results: str | None, launcher: str, stall_timeout: str, as_json: bool,
                    **_backend_values: Any) -> None:
    """Restore CHECKPOINT (TARGET/RUN_ID/CHECKPOINT, kept with --keep), measured and
    verified chunk by chunk, onto its restore layout or the one given."""
    backend_flags = typed_backend_flags(click.get_current_context())
    RestoreChoice(restore_plan, restore_world_size, restore_layout).resolve("raw")
    root, prefix = split_checkpoint(checkpoint)
    backend_options_ = options_for_target(root, backend_flags)
    launch = open_launcher(launcher)
    stall = parse_stall_timeout(stall_timeout)
    # Local restores stop on SIGTERM/SIGHUP as on Ctrl-C; MPI ranks leave that to mpirun/srun.
    with quiet_unless_root(launch), stop_on_signals(launch.kind == "local"):
        block = parse_size(block_size, "--block-size")
        backend = open_backend(root, backend_options_, IOHints(block_size=block,
                                                                 threads=threads or 1))
        try:
            manifest = read_checkpoint(backend, checkpoint, prefix)
            workload = apply_restore_layout(checkpoint_workload(manifest, prefix),
                                            restore_world_size, restore_layout)
            plan = build_plan(workload)
            ranks = written_ranks(plan, manifest, prefix)
        except BaseException:
            backend.release()
            raise
        fmt = str(manifest.get("format", "raw"))
        check_format(fmt, "none", plan, ranks)
        options = RunOptions(
            iterations=iterations, threads=threads or workload.checkpoint.threads,
            block_size=block, payload=manifest["payload"], seed=manifest["seed"], keep=True,
            restore=True, cache=cache,
            run_id=new_run_id(), restore_shift=restore_shift or 0, format=fmt,
            restore_plan=restore_plan, checkpoint=prefix,
            checkpoint_iteration=manifest["iteration"], stall_timeout=stall)
        req = RunRequest(workload=workload, plan=plan, ranks=ranks, backend=backend,
                         options=options, restore_shift_auto=restore_shift is None)
        path = Path(results) if results else \
            Path("results") / f"{workload.name}-restore-{options.run_id}.jsonl"
        _measure(launch, req, path, checkpoint, as_json)


def _measure(launch: Launcher, req: RunRequest, path: Path, checkpoint: str,
             as_json: bool) -> None:
    with run_status(req, "restore", launch) as status, \
            stopped_as(f"the restore of {checkpoint}", path):
        outcome = measure(req, path, launch, on_progress=status,
                          on_start=None if as_json else  # --json: the JSON alone on stdout
                          lambda: click.echo(f"restoring {checkpoint}"))
    if outcome is None:
        return
    if as_json:
        click.echo(json.dumps({"results": str(path), "summary": outcome["summary"]}, indent=2))
    else:
        width = table.output_width(False, None)
        table.render_summary(table.console_for(width), [outcome], width)
        click.echo(f"results: {path}")


COMMANDS = [restore_command]
