"""A checkpoint kept with --keep, accepted for `ckptbench restore`: its target is
ckptbench's, its manifest is whole and each field a restore uses holds what it may, and
its entries are exactly the files of the ranks it lists (else one line naming the field)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckptbench.backends import Backend
from ckptbench.backends.base import TARGET_MARKER
from ckptbench.errors import CkptbenchError, RunFailed, SpecError, VerificationError
from ckptbench.fields import shown
from ckptbench.formats.manifest import Manifest
from ckptbench.plan import MANIFEST_NAME, Plan
from ckptbench.runner.options import PLANNED_RESTORE
from ckptbench.spec import Workload, workload_from_dict


def split_checkpoint(checkpoint: str) -> tuple[str, str]:
    """TARGET/RUN_ID/CHECKPOINT -> (TARGET, 'RUN_ID/CHECKPOINT')."""
    parts = checkpoint.rstrip("/").rsplit("/", 2)
    if len(parts) != 3 or not all(parts) or parts[0].endswith(":"):
        raise SpecError(f"CHECKPOINT {checkpoint!r}: allowed: TARGET/RUN_ID/CHECKPOINT, the "
                        "directory of a checkpoint kept with --keep (e.g. "
                        "ckptbench-data/run-20250101-120000-1/checkpoint-1)")
    return parts[0], f"{parts[1]}/{parts[2]}"


def read_checkpoint(backend: Backend, checkpoint: str, prefix: str) -> Manifest:
    """The checkpoint's manifest, once it is known to be ckptbench's and each field a
    restore uses holds what it may (else one line naming the field)."""
    if not backend.exists(TARGET_MARKER):
        raise CkptbenchError(f"{checkpoint}: its target has no {TARGET_MARKER} marker; "
                             "ckptbench restores only checkpoints it wrote")
    key = f"{prefix}/{MANIFEST_NAME}"
    try:
        manifest = Manifest.load(backend.for_parent(), key)  # before the ranks fork
    except FileNotFoundError:
        raise CkptbenchError(f"{checkpoint}: no manifest {MANIFEST_NAME}; allowed: a "
                             "checkpoint ckptbench committed and kept with --keep") from None
    except VerificationError as exc:
        raise RunFailed(str(exc), "verification") from None
    manifest.accept(PLANNED_RESTORE)
    return manifest


def checkpoint_workload(manifest: Manifest, prefix: str) -> Workload:
    """The workload the manifest was written for (errors name the manifest)."""
    try:
        return workload_from_dict(manifest["workload_spec"])
    except SpecError as exc:
        raise SpecError(f"{prefix}/{MANIFEST_NAME}: workload_spec: {exc}") from None


def written_ranks(plan: Plan, manifest: Manifest, prefix: str) -> list[int]:
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
    for name, entry in manifest.files.items():
        if not isinstance(entry, dict):
            raise CkptbenchError(f"{where}: entry {shown(name)} is {shown(entry)}; allowed: an "
                                 "object with its rank, chunks and digests (altered manifest)")
        path, rank = entry.get("path", name), entry.get("rank")
        if isinstance(path, str) and path not in names:
            _renamed(path, prefix, plan.file_paths, where)
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


def _renamed(path: str, prefix: str, file_paths: Sequence[str], where: str) -> None:
    """A manifest names the files by the checkpoint's own directory: an entry that is a
    file of the plan under another directory means the checkpoint was renamed or moved
    since it was written, not that its manifest was altered."""
    for file in file_paths:
        if path.endswith("/" + file) and path != f"{prefix}/{file}":
            raise CkptbenchError(
                f"{where}: it names its files under {shown(path[:-len(file) - 1])}, not "
                f"{shown(prefix)}: the checkpoint was renamed or moved after it was written; "
                "allowed: restore it under the name it was written with (its manifest's "
                "digests and names cover that directory)")
