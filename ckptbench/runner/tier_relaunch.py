"""``ckptbench relaunch RESULTS``: the job relaunched after a run with ``--keep-tiers``
ended or died (a node killed), restoring from the copies the run left in the memory and
peer tiers, as Megatron-Core's local checkpointing (NVIDIA's resiliency extension) does.

What the run left, found by name (runner.tier_store's layout) in the run's directory under
--memory-dir that the results record, and only there: its name (random in part) and the
identities of it and its node directories, as made, are in every ``tier_held`` record; a
directory at those names that is not the one made (a link, another directory) is refused
in one line naming it, nothing in it read or deleted. Found: each process's node copy and
the replicas on its holders' nodes. What is held is what the results say: process 0
writes a ``tier_held`` record once every copy and replica of a checkpoint is complete
(runner.tiers), so a checkpoint whose replication was cut off by the kill has none and is
never restored, whatever part of it is on disk.

The relaunch takes the newest held checkpoint every process's shard can be read for: from
its node's copy, or, for the ranks of a replaced node (``replaced``: its memory is gone
with it), from a replica on a surviving node. Every byte is checked against the save's
digests in the record; a changed byte is one line naming the file and the copy. Each
process's record says which tier (and node) served it. Once all are verified, the run's
copies are removed, by the names the run gives them (never another user's file); after a
failure they stay for another relaunch or ``--discard``. A run still in progress is
refused, restore and discard alike (:func:`refuse_live`): its intent on its target is
judged as ``ckptbench clean`` judges it (runner.clean.in_progress), and its copies are
its own. Not done here: shards no tier holds are not read from storage (the relaunch
names them), and the relaunch reads in one process on this host.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ckptbench.backends import Backend, open_backend
from ckptbench.backends.owned_dirs import NotMade
from ckptbench.errors import CkptbenchError, RunFailed, SpecError
from ckptbench.fields import shown
from ckptbench.records import read_records
from ckptbench.runner.clean import RUN_ID, in_progress
from ckptbench.runner.tier_restart import first_mismatch
from ckptbench.runner.tier_store import (
    COPY_NAME,
    Copy,
    HostDirs,
    RunDir,
    copies_on_disk,
    copy_name,
    held_size,
    open_held,
    read_copy,
    recorded_dirs,
    remove_copies,
)


@dataclass(frozen=True)
class Kept:
    """What a results file says a run left in the tiers."""

    results: Path
    run_id: str
    memory_dir: str
    held: tuple[dict[str, Any], ...]  # tier_held records, oldest first
    target: dict[str, Any] = field(default_factory=dict)  # the run record's, as described
    # the run's directory under memory_dir (its name) and every host's identities, as
    # made (runner.tier_store.RunDir.record); None: the run recorded none
    dirs: tuple[str, tuple[HostDirs, ...]] | None = None

    @property
    def nodes(self) -> int:
        return max(self.held[-1]["node_of"]) + 1 if self.held else 0

    def run_dir(self) -> RunDir | None:
        """The run's directory on this host, checked to be the one made; None when there is
        none (nothing held, or nothing left here); one line naming it (RunFailed, exit 2)
        when something else is at its name."""
        if self.dirs is None:
            return None
        try:
            return RunDir.found(self.memory_dir, *self.dirs)
        except OSError as exc:
            raise _refused(exc) from None


def load_kept(results: Path) -> Kept:
    """The run's kept copies per its results file; one line when it kept none or the file
    is not a run's (records.read_records: bounded, one object per line)."""
    recs = list(read_records(results))
    run = next((r for r in recs if r.get("type") == "run"), None)
    if run is None:
        raise SpecError(f"{results}: not a ckptbench results file (no run record)")
    options = run.get("options")
    tiers = options.get("tiers") if isinstance(options, dict) else None
    if not isinstance(tiers, dict) or not RUN_ID.fullmatch(str(run.get("run_id"))) \
            or not isinstance(tiers.get("memory_dir"), str) or not tiers["memory_dir"]:
        # the names to remove by: only a run's own
        raise SpecError(f"{results}: run id {shown(run.get('run_id'))} or its memory "
                        "directory is not one a run records; allowed: a run's results file")
    if not tiers.get("keep"):
        raise SpecError(f"{results}: run {run['run_id']} kept no tier copies; allowed: the "
                        "results of a run with --keep-tiers")
    held = tuple(_checked(r, results) for r in recs if r.get("type") == "tier_held"
                 and r.get("run_id") == run["run_id"])
    # the run's directory under its memory directory, as made: recorded once it was made
    # (tier_dirs) and with every held checkpoint; all alike
    where = [r for r in recs if r.get("type") in ("tier_dirs", "tier_held")
             and r.get("run_id") == run["run_id"]]
    dirs = recorded_dirs(where[-1], run["run_id"]) if where else None
    if where and (dirs is None or any(recorded_dirs(r, run["run_id"]) != dirs for r in where)):
        raise SpecError(f"{results}: {where[-1]['type']} record memory_run_dir = "
                        f"{shown(where[-1].get('memory_run_dir'))}: allowed: the run's "
                        "directory under its memory directory and its identities, as the run "
                        "recorded them (an altered results file)")
    environment = run.get("environment")
    target = environment.get("target") if isinstance(environment, dict) else None
    if not isinstance(target, dict) or not isinstance(target.get("target"), str) \
            or not isinstance(target.get("options"), dict):
        raise SpecError(f"{results}: run record field environment.target is "
                        f"{shown(target)}; allowed: the target a run records (an altered "
                        "results file)")
    return Kept(results, run["run_id"], tiers["memory_dir"], held, target, dirs)


def _refused(exc: OSError) -> RunFailed:
    """A directory of the run's that is not the one made: one line naming it (exit 2)."""
    return RunFailed(str(exc) if isinstance(exc, NotMade) else
                     f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), "backend")


def _target_backend(kept: Kept) -> Backend:
    """The run's target as its run record describes it (a directory by its absolute path)."""
    where = kept.target.get("path") if kept.target.get("backend") == "local" else None
    target = where if isinstance(where, str) and where else kept.target["target"]
    try:
        return open_backend(target, kept.target["options"])
    except CkptbenchError as exc:
        raise SpecError(f"{kept.results}: whether run {kept.run_id} is still running cannot "
                        f"be told: its target {target} does not open ({exc}); allowed: a "
                        "relaunch where the run's target can be read") from None


def refuse_live(kept: Kept) -> None:
    """One line when the run is still in progress, as `ckptbench clean` tells (its intent
    on its target says running, and on this host its process is there, elsewhere its
    lease is fresh): a relaunch or a discard would remove the copies it is writing."""
    backend = _target_backend(kept)
    try:
        why = in_progress(backend, kept.run_id)
    except CkptbenchError as exc:
        raise SpecError(f"run {kept.run_id}: {exc}") from None
    if why is not None:
        raise SpecError(f"run {kept.run_id} is still running ({why}): its tier copies in "
                        f"{kept.memory_dir} are in use, and a relaunch or --discard would "
                        "remove them under it; allowed: wait for it to end, or kill it "
                        "first, then relaunch")


def _counts(value: object, below: int | None = None) -> bool:
    """A list of integers >= 0 (and < `below`)."""
    return isinstance(value, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0
        and (below is None or x < below) for x in value)


def _checked(rec: dict[str, Any], results: Path) -> dict[str, Any]:
    """A ``tier_held`` record with the fields runner.tier_restart.held_record writes, one
    per process where it has one; else one line naming the field (an altered file)."""
    node_of = rec.get("node_of")
    n = len(node_of) if isinstance(node_of, list) else 0

    def each(value: object, fits: Callable[[Any], bool]) -> bool:
        return isinstance(value, list) and len(value) == n and all(fits(v) for v in value)

    fields: tuple[tuple[str, bool, str], ...] = (
        ("iteration", _counts([rec.get("iteration")]), "an integer >= 0"),
        ("node_of", n > 0 and _counts(node_of), "a non-empty list of node numbers"),
        ("memory", isinstance(rec.get("memory"), bool), "true or false"),
        ("holders", each(rec.get("holders"), lambda h: _counts(h, n)),
         "one list of holder processes per process"),
        ("files", each(rec.get("files"), lambda f: isinstance(f, list) and all(
            isinstance(e, list) and len(e) == 2 and isinstance(e[0], str)
            and _counts(e[1:]) for e in f)), "one list of [name, bytes] per process"),
        ("digests", each(rec.get("digests"), _counts) and [len(d) for d in rec["digests"]]
         == [len(f) for f in rec["files"]], "one list of digests per process, one per file"))
    for name, fits, allowed in fields:
        if not fits:
            raise SpecError(f"{results}: tier_held record {name} = {shown(rec.get(name))}: "
                            f"allowed: {allowed} (an altered results file)")
    return rec


def _candidates(run: RunDir | None, rec: dict[str, Any], proc: int, replaced: set[int]
                ) -> list[tuple[str, int, Copy]]:
    """Where process `proc`'s shard of `rec`'s checkpoint may be: (tier, node, copy), its
    node's copy first, then its replicas; none on a replaced node, nor on a node whose
    directory is not on this host."""
    it, node_of = rec["iteration"], rec["node_of"]
    here = run.nodes if run is not None else {}
    out = []
    if rec["memory"] and node_of[proc] not in replaced and node_of[proc] in here:
        assert run is not None
        out.append(("memory", node_of[proc], run.node(node_of[proc]) / copy_name(proc, it)))
    for h in rec["holders"][proc]:
        if node_of[h] not in replaced and node_of[h] in here:
            assert run is not None
            out.append(("peer", node_of[h],
                        run.node(node_of[h]) / copy_name(proc, it, replica=True)))
    return out


def _is_held(copy: Copy) -> bool:
    fd = open_held(copy)
    if fd is not None:
        os.close(fd)
    return fd is not None


def choose(kept: Kept, replaced: set[int], run: RunDir | None = None
           ) -> tuple[dict[str, Any], list[tuple[str, int, Copy]], list[str]]:
    """The newest held checkpoint every shard has a copy of (in `run`, the run's
    directory on this host), where each is read from, and why each newer held one was
    passed over."""
    passed: list[str] = []
    for rec in reversed(kept.held):
        sources: list[tuple[str, int, Copy]] = []
        for proc in range(len(rec["node_of"])):
            candidates = _candidates(run, rec, proc, replaced)
            found = [c for c in candidates if _is_held(c[2])]
            if not found:
                tried = ", ".join(str(c[2]) for c in candidates)
                passed.append(f"checkpoint {rec['iteration']}: no copy of process {proc}'s "
                              f"shard is left (tried: {tried or 'none outside the replaced nodes'})")
                break
            sources.append(found[0])
        else:
            return rec, sources, passed
    if not kept.held:
        raise RunFailed(f"{kept.results}: run {kept.run_id} held no checkpoint in its tiers",
                        "missing")
    raise RunFailed(passed[0], "missing")


def on_disk(run: RunDir | None) -> list[int]:
    """The checkpoints any copy or part of is in the run's directories (by name)."""
    names = copies_on_disk(run) if run is not None else []
    return sorted({int(m.group(1)) for f in names if (m := COPY_NAME.fullmatch(f))})


def relaunch(kept: Kept, replaced: set[int]) -> list[dict[str, Any]]:
    """Restore every process's shard from the tiers and verify it; the records (one per
    process). The copies stay: the caller removes them (:func:`discard`) once the records
    are written."""
    if kept.held and not replaced <= set(range(kept.nodes)):
        raise SpecError(f"--replaced-node {sorted(replaced - set(range(kept.nodes)))[0]}: "
                        f"allowed: a node of the run, 0-{kept.nodes - 1}")
    run = kept.run_dir()
    try:
        rec, sources, passed = choose(kept, replaced, run)
        on_disk_now = on_disk(run)
    except NotMade as exc:
        raise _refused(exc) from None
    it = rec["iteration"]
    held = {r["iteration"] for r in kept.held}
    not_held = [i for i in on_disk_now if i not in held]
    out: list[dict[str, Any]] = []
    for proc, (tier, node, path) in enumerate(sources):
        files = [(name, size) for name, size in rec["files"][proc]]
        nbytes = sum(size for _, size in files)
        try:
            size = held_size(path)  # the memory taken: at most the copy's (a record
            if size != nbytes:  # may be altered)
                raise OSError(f"{path}: {size} bytes, the shard has {nbytes}")
            data = np.empty(nbytes, dtype=np.uint8)
            t0 = time.perf_counter()
            read_copy(path, data)
        except NotMade as exc:
            raise _refused(exc) from None
        except OSError as exc:
            raise RunFailed(f"checkpoint {it}: process {proc}'s shard: {exc}", "missing") from None
        seconds = time.perf_counter() - t0
        bad = first_mismatch(data, files, rec["digests"][proc])
        if bad is not None:
            raise RunFailed(f"checkpoint {it}: process {proc}'s shard: file {bad} in {path} "
                            "differs from the save's digest", "verify")
        out.append({"type": "tier_relaunch", "run_id": kept.run_id, "iteration": it,
                    "process": proc, "node": rec["node_of"][proc], "tier": tier,
                    "from_node": node, "copy": str(path), "bytes": int(data.nbytes),
                    "seconds": seconds, "verified": True, "replaced_nodes": sorted(replaced),
                    "not_held": not_held, "passed_over": passed})
    return out


def discard(kept: Kept) -> None:
    """The run's copies removed by name, only in the directories it made (nothing else in
    them, no file another user owns); a directory at a node's name that is not the one
    made is left alone, and named in one line (RunFailed, exit 2) once the rest is gone."""
    run = kept.run_dir()
    if run is None:
        return
    try:
        refused = remove_copies(run)
    except OSError as exc:
        raise _refused(exc) from None
    if refused:
        raise RunFailed(refused[0], "backend")
