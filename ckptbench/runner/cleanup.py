"""What a run made, by name: its directory, its intent record, its removal, and the debris
of runs that were killed before they could remove theirs.

A run claims a directory of its own, created exclusively (a name that exists is never
reused: the run takes the next free one), and before its first write records there, in
its intent (``.ckptbench-run``), every name it will write: its checkpoints and, in each,
the format's files and the manifest. Cleanup deletes exactly those names, then the
directories they were in if that leaves them empty; anything else (a user's file) is left
in place and reported. A run killed before its cleanup leaves its intent behind: a later
run on the target finds it (debris), reports it, and with --clean-debris removes it by
the same names, unfinished multipart uploads included.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ckptbench import __version__
from ckptbench.backends import Backend
from ckptbench.backends.base import NameTaken, atomic_tmp
from ckptbench.errors import BackendError
from ckptbench.formats import format_class
from ckptbench.formats.fill_ins import fill_in_dir, fill_in_names
from ckptbench.plan import Plan

if TYPE_CHECKING:
    from ckptbench.runner.options import RunOptions

INTENT = ".ckptbench-run"
PROBE = ".ckptbench-probe"
SHOWN = 10  # leftovers named in a report
CLAIM_TRIES = 100


@dataclass(frozen=True)
class RunNames:
    """Every name a run writes: its checkpoints, and the files in each (relative)."""

    run_id: str
    checkpoints: tuple[str, ...]
    files: tuple[str, ...]  # in each checkpoint, the manifest included
    manifest: str = ""

    @property
    def run_files(self) -> tuple[str, ...]:
        """The run directory's own files; the intent last (removed once all else is)."""
        return (PROBE, atomic_tmp(PROBE), atomic_tmp(INTENT), INTENT)

    def keys(self, checkpoint: str) -> list[str]:
        return [f"{self.run_id}/{checkpoint}/{f}" for f in self.files]

    def all_keys(self) -> list[str]:
        return [k for c in self.checkpoints for k in self.keys(c)]


def run_names(plan: Plan, options: RunOptions, groups: list[list[int]]) -> RunNames:
    """The names a run of `plan` writes, its processes running plan ranks `groups`."""
    fmt = format_class(options.format)
    its = range(1, options.iterations + 1)
    fill = fill_in_names(plan, groups) if options.uses_restore_plan else []  # runner.fill_in
    files = [*fmt.written_names(plan, groups, options.format_options()), plan.manifest,
             atomic_tmp(plan.manifest), *fill]
    return RunNames(options.run_id,
                    tuple([plan.checkpoint_name(i) for i in its]
                          + [fill_in_dir(plan, i) for i in its if fill]),
                    tuple(dict.fromkeys(files)), plan.manifest)


def _dirs(files: Sequence[str]) -> list[str]:
    """The directories inside a checkpoint that `files` are in, deepest first."""
    found: set[str] = set()
    for f in files:
        parts = f.split("/")[:-1]
        found.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(found, key=lambda d: (-d.count("/"), d))


def remove_checkpoint(backend: Backend, names: RunNames, checkpoint: str,
                      uploads: bool = False) -> None:
    """Delete one checkpoint's files by name (`uploads`: abort unfinished uploads of them
    first, when a writer may have been killed), then its directories if left empty."""
    keys = names.keys(checkpoint)
    if uploads:
        backend.abort_uploads(keys)
    backend.delete(keys)
    base = f"{names.run_id}/{checkpoint}"
    for d in _dirs(names.files):
        backend.remove_dir(f"{base}/{d}")
    backend.remove_dir(base)


def remove_run(backend: Backend, names: RunNames, uploads: bool = False,
               checkpoints: bool = True) -> list[str]:
    """Everything the run wrote, by name, and its directories if that leaves them empty
    (`checkpoints=False`: they were removed already, iteration by iteration). Returns what
    is left there (someone else's), at most SHOWN names."""
    for checkpoint in names.checkpoints if checkpoints else ():
        remove_checkpoint(backend, names, checkpoint, uploads)
    backend.delete([f"{names.run_id}/{f}" for f in names.run_files])
    backend.remove_dir(names.run_id)
    return backend.list_names(names.run_id, SHOWN)


def keep_run(backend: Backend, names: RunNames, clean: bool) -> None:
    """--keep: the checkpoints stay, except (after a failure or a stop) those without a
    manifest; the intent goes, as at every end of a run: only debris carries one."""
    if not clean:
        for checkpoint in names.checkpoints:
            if not backend.exists(f"{names.run_id}/{checkpoint}/{names.manifest}"):
                remove_checkpoint(backend, names, checkpoint, uploads=True)
    backend.delete([f"{names.run_id}/{f}" for f in names.run_files])


# --- the claim and the intent ---
def claim(backend: Backend, run_id: str) -> str:
    """Create the run's directory exclusively: `run_id`, or the first free `run_id-N`."""
    for n in range(1, CLAIM_TRIES + 1):
        name = run_id if n == 1 else f"{run_id}-{n}"
        try:
            backend.create_dir(name)
            return name
        except NameTaken:
            continue
    raise BackendError(f"target {backend.target}: {run_id} and {CLAIM_TRIES - 1} names after it "
                       "exist; allowed: a target without them")


def _process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot): tells a live run from a
    process that took its pid since."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def write_intent(backend: Backend, names: RunNames) -> None:
    """Record the run's names before its first write. Every end of the run removes it
    last, so a run directory holding one is a run in progress, or debris."""
    record = {"created_by": "ckptbench", "version": __version__, "run_id": names.run_id,
              "state": "running", "host": socket.gethostname(), "pid": os.getpid(),
              "pid_start": _process_start(os.getpid()),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "checkpoints": list(names.checkpoints), "files": list(names.files)}
    backend.put_atomic(f"{names.run_id}/{INTENT}", json.dumps(record).encode())


def read_intent(backend: Backend, run_dir: str) -> dict[str, Any] | None:
    """The intent of the run in `run_dir`, or None (none there, or not one of ours)."""
    try:
        record = json.loads(backend.get(f"{run_dir}/{INTENT}"))
    except (FileNotFoundError, OSError, ValueError, BackendError):
        return None
    ok = (isinstance(record, dict) and record.get("created_by") == "ckptbench"
          and record.get("run_id") == run_dir
          and all(isinstance(record.get(k), list) and all(isinstance(x, str) and _safe(x)
                                                          for x in record[k])
                  for k in ("checkpoints", "files")))
    return record if ok else None


def _safe(name: str) -> bool:
    """A relative name that stays inside its directory (an intent is data, not a command)."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _live(intent: dict[str, Any]) -> bool:
    """The run that wrote `intent` may still be running on this host (when unsure: yes,
    it is left alone). Runs started on other hosts cannot be checked from here."""
    pid = intent.get("pid")
    if intent.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user has that pid: compared below
    start, recorded = _process_start(pid), intent.get("pid_start")
    return start is None or recorded is None or start == recorded


# --- debris: what killed runs left ---
@dataclass
class Debris:
    """What interrupted runs left on a target, and what was done about it."""

    runs: list[RunNames]
    hosts: list[str]
    pending_uploads: int = 0
    removed: bool = False
    left: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {"runs": [n.run_id for n in self.runs], "pending_uploads": self.pending_uploads,
                "removed": self.removed, "left": self.left}

    def line(self, target: str) -> str:
        """One line for the user."""
        ids = ", ".join(n.run_id for n in self.runs)
        uploads = (f", {self.pending_uploads} unfinished multipart upload(s)"
                   if self.pending_uploads else "")
        elsewhere = sorted(set(self.hosts) - {socket.gethostname()})
        hosts = f" (started on {', '.join(elsewhere)})" if elsewhere else ""
        if not self.removed:
            return (f"target {target} holds what {len(self.runs)} interrupted run(s) left: "
                    f"{ids}{hosts}{uploads}; remove it with --clean-debris (only the names "
                    "each run recorded are deleted)")
        left = (f"; left in place (not written by ckptbench): {', '.join(self.left)}"
                if self.left else "")
        return f"removed what {len(self.runs)} interrupted run(s) left on {target}: {ids}{uploads}{left}"


def find_debris(backend: Backend) -> Debris | None:
    """Runs on the target whose intent says "running" but that are not (killed)."""
    runs, hosts = [], []
    for run_dir in backend.run_dirs():
        intent = read_intent(backend, run_dir)
        if intent is None or intent.get("state") != "running" or _live(intent):
            continue
        runs.append(RunNames(run_dir, tuple(intent["checkpoints"]), tuple(intent["files"])))
        hosts.append(str(intent.get("host")))
    if not runs:
        return None
    keys = [k for n in runs for k in n.all_keys()]
    return Debris(runs, hosts, backend.pending_uploads(keys))


def clean_debris(backend: Backend, debris: Debris) -> Debris:
    """Remove the debris by the names each run recorded; say what is left."""
    left: list[str] = []
    for names in debris.runs:
        left += remove_run(backend, names, uploads=True)
    return replace(debris, removed=True, left=left[:SHOWN])


def handle_debris(backend: Backend, clean: bool) -> Debris | None:
    """Find the debris of interrupted runs; remove it when asked (--clean-debris)."""
    with contextlib.suppress(BackendError):
        debris = find_debris(backend)
        if debris is not None and clean:
            debris = clean_debris(backend, debris)
        return debris
    return None
