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

Deleting follows no link: every directory the run creates is created exclusively and its
identity (device and inode) recorded in the intent, and a cleanup deletes recorded names
only inside the very directories recorded (Backend.remove_recorded), so a checkpoint
directory swapped for a link to someone else's files, or for a planted directory, loses
nothing. Debris is only what is provably dead: a run on this host whose process is gone, or
a run elsewhere whose lease (``.ckptbench-lease``, renewed every LEASE_RENEW_S by the live
run) is older than LEASE_TIMEOUT_S (hosts' clocks are assumed to agree within that); a
--keep run's committed checkpoints are kept, never debris.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ckptbench import __version__
from ckptbench.backends import Backend
from ckptbench.backends.base import Identity, NameTaken, UnfinishedUploads, atomic_tmp
from ckptbench.errors import BackendError
from ckptbench.formats import format_class
from ckptbench.formats.fill_ins import fill_in_dir, fill_in_names
from ckptbench.plan import Plan

if TYPE_CHECKING:
    from ckptbench.runner.options import RunOptions

INTENT = ".ckptbench-run"
LEASE = ".ckptbench-lease"
LEASE_RENEW_S = 30.0  # how often a live run renews its lease
LEASE_TIMEOUT_S = 300.0  # a lease not renewed for this long: the run is dead
LEASE_JOIN_S = 2.0  # how long the end of a run waits for a renewal in flight
PROBE = ".ckptbench-probe"
KEPT = "kept"  # the intent's state once a --keep run ended: its checkpoints, by name
RUN_DIR = "."  # the run directory's entry in RunNames.ids
SHOWN = 10  # leftovers named in a report
UPLOADS_LEFT = "unfinished upload(s)"  # in a cleanup's leftovers: aborts that did not happen
CLAIM_TRIES = 100


@dataclass(frozen=True)
class RunNames:
    """Every name a run writes: its checkpoints, and the files in each (relative)."""

    run_id: str
    checkpoints: tuple[str, ...]
    files: tuple[str, ...]  # in each checkpoint, the manifest included
    manifest: str = ""
    ids: dict[str, Identity] = field(default_factory=dict)  # directory -> as created
    keep: bool = False  # --keep: committed checkpoints stay

    @property
    def run_files(self) -> tuple[str, ...]:
        """The run directory's own files; the intent last (removed once all else is)."""
        return (PROBE, atomic_tmp(PROBE), LEASE, atomic_tmp(LEASE), atomic_tmp(INTENT), INTENT)

    def made(self, directory: str, ident: Identity | None) -> RunNames:
        """These names, with `directory` (RUN_DIR or a checkpoint) recorded as created."""
        return self if ident is None else replace(self, ids={**self.ids, directory: ident})

    def chain(self, checkpoint: str | None = None) -> list[tuple[str, Identity | None]]:
        """The way to the run directory (or a checkpoint in it), with recorded identities."""
        out = [(self.run_id, self.ids.get(RUN_DIR))]
        return [*out, (checkpoint, self.ids.get(checkpoint))] if checkpoint else out

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
                    tuple(dict.fromkeys(files)), plan.manifest, keep=options.keep)


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
    first, when a writer may have been killed), then its directories if left empty; only
    in the directory the run created (never one it did not, nor through a link)."""
    if uploads and isinstance(backend, UnfinishedUploads):
        backend.abort_uploads(names.keys(checkpoint))
    backend.remove_recorded(names.chain(checkpoint), names.files, _dirs(names.files))


def remove_run(backend: Backend, names: RunNames, uploads: bool = False,
               checkpoints: bool = True) -> list[str]:
    """Everything the run wrote, by name, and its directories if that leaves them empty
    (`checkpoints=False`: they were removed already, iteration by iteration). Unfinished
    uploads that cannot be aborted (or listed) keep the intent, so that a later
    --clean-debris finds them. Returns what is left there (someone else's), at most SHOWN
    names."""
    pending: int | None = 0
    if uploads and isinstance(backend, UnfinishedUploads):  # a store that cannot list
        # them now cannot abort them either: not tried
        pending = backend.pending_uploads(names.all_keys())
        if pending:
            backend.abort_uploads(names.all_keys())
            pending = backend.pending_uploads(names.all_keys())
    for checkpoint in names.checkpoints if checkpoints else ():
        remove_checkpoint(backend, names, checkpoint)
    run_files = names.run_files if pending == 0 else (PROBE, atomic_tmp(PROBE))
    backend.remove_recorded(names.chain(), run_files, ())
    left = backend.left_behind(names.run_id, SHOWN)
    if pending != 0:
        left.append(f"{'maybe some' if pending is None else pending} {UPLOADS_LEFT} (the store "
                    f"did not answer; the run's intent {names.run_id}/{INTENT} is kept)")
    return left


def keep_run(backend: Backend, names: RunNames, clean: bool) -> list[str]:
    """--keep: the committed checkpoints stay (after a failure or a stop, not those without
    a manifest), recorded as kept (KEPT) so that `ckptbench clean` removes them by name
    later; a run that kept none (a restore) leaves nothing. Returns what is left besides
    the kept checkpoints."""
    if clean:
        kept = _committed(backend, names)
        if not kept:
            return remove_run(backend, names)
        backend.remove_recorded(names.chain(), names.run_files[:-1], ())
        _record_kept(backend, names, kept)
        return []
    return remove_keeping(backend, names)


def _committed(backend: Backend, names: RunNames) -> list[str]:
    """The checkpoints of a --keep run that carry their manifest (committed)."""
    return ([c for c in names.checkpoints
             if backend.exists(f"{names.run_id}/{c}/{names.manifest}")]
            if names.keep and names.manifest else [])


def _record_kept(backend: Backend, names: RunNames, kept: list[str],
                 record: dict[str, Any] | None = None) -> None:
    """Write the intent (`record`, else the one there) as the record of the kept
    checkpoints (state KEPT: never debris), with the identities of their directories."""
    with contextlib.suppress(FileNotFoundError, OSError, ValueError, BackendError):
        record = record or json.loads(backend.get(f"{names.run_id}/{INTENT}"))
        ids = record.get("ids")
        ids = ids if isinstance(ids, dict) else {}
        record.update(state=KEPT, checkpoints=kept,
                      ids={k: v for k, v in ids.items() if k == RUN_DIR or k in kept})
        backend.put_atomic(f"{names.run_id}/{INTENT}", json.dumps(record).encode())


def remove_keeping(backend: Backend, names: RunNames) -> list[str]:
    """remove_run (unfinished uploads aborted), but the committed checkpoints of a --keep
    run stay (those with a manifest), recorded as kept; what is left besides them."""
    kept = _committed(backend, names)
    gone = replace(names, checkpoints=tuple(c for c in names.checkpoints if c not in kept))
    record = read_intent(backend, names.run_id) if kept else None
    left = remove_run(backend, gone, uploads=True)
    if kept and record is not None and not any(UPLOADS_LEFT in n for n in left):
        _record_kept(backend, names, kept, record)
    return [n for n in left
            if not any(n.startswith(f"{names.run_id}/{c}/") for c in kept)
            and n != f"{names.run_id}/{INTENT}"]


# --- the claim and the intent ---
def claim(backend: Backend, run_id: str) -> tuple[str, Identity | None]:
    """Create the run's directory exclusively: `run_id`, or the first free `run_id-N`;
    its name and identity."""
    for n in range(1, CLAIM_TRIES + 1):
        name = run_id if n == 1 else f"{run_id}-{n}"
        try:
            return name, backend.create_dir(name)
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
    """Record the run's names before its first write, and its lease. Every end of the run
    removes them last, so a run directory holding an intent is a run in progress, or
    debris."""
    record = {"created_by": "ckptbench", "version": __version__, "run_id": names.run_id,
              "state": "running", "host": socket.gethostname(), "pid": os.getpid(),
              "pid_start": _process_start(os.getpid()),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "keep": names.keep, "manifest": names.manifest,
              "checkpoints": list(names.checkpoints), "files": list(names.files),
              "ids": {k: list(v) for k, v in names.ids.items()}}
    backend.put_atomic(f"{names.run_id}/{INTENT}", json.dumps(record).encode())
    renew_lease(backend, names.run_id)


def record_dir(backend: Backend, names: RunNames) -> None:
    """Rewrite the intent with the directories created so far (names.ids): the process
    that created a checkpoint's directory records it before writing in it."""
    record = json.loads(backend.get(f"{names.run_id}/{INTENT}"))
    record["ids"] = {k: list(v) for k, v in names.ids.items()}
    backend.put_atomic(f"{names.run_id}/{INTENT}", json.dumps(record).encode())


def renew_lease(backend: Backend, run_id: str) -> None:
    record = {"renewed": time.time(), "timeout_s": LEASE_TIMEOUT_S, "host": socket.gethostname()}
    backend.put_atomic(f"{run_id}/{LEASE}", json.dumps(record).encode())


class Lease:
    """The live run's heartbeat: renews its lease every LEASE_RENEW_S until stopped (the
    first renewal after that long, once the run's processes are started)."""

    def __init__(self, backend: Backend, run_id: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, args=(backend, run_id),
                                        name="ckptbench-lease", daemon=True)
        self._thread.start()

    def _renew(self, backend: Backend, run_id: str) -> None:
        while not self._stop.wait(LEASE_RENEW_S):
            with contextlib.suppress(Exception):  # a store down now: the run sees it
                renew_lease(backend, run_id)

    def stop(self) -> None:
        """Stop renewing, before the cleanup removes the lease. A renewal in flight on a
        store that stopped answering is not waited for beyond LEASE_JOIN_S (the cleanup's
        own bounded requests come first; the intent then stays with its lease anyway)."""
        self._stop.set()
        self._thread.join(LEASE_JOIN_S)


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


def recorded_ids(intent: dict[str, Any]) -> dict[str, Identity]:
    """The directories an intent records as created, with their identities."""
    ids = intent.get("ids")
    out: dict[str, Identity] = {}
    for k, v in (ids.items() if isinstance(ids, dict) else ()):
        if (isinstance(v, list) and len(v) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in v)):
            out[str(k)] = (v[0], v[1])
    return out


def names_of(intent: dict[str, Any]) -> RunNames:
    """What a run recorded. Directories recorded on another host keep their inode only
    (a network file system numbers its devices per client)."""
    manifest = intent.get("manifest")
    ids = recorded_ids(intent)
    if intent.get("host") != socket.gethostname():
        ids = {k: (-1, ino) for k, (_dev, ino) in ids.items()}
    return RunNames(str(intent["run_id"]), tuple(intent["checkpoints"]), tuple(intent["files"]),
                    manifest if isinstance(manifest, str) and _safe(manifest) else "",
                    ids, intent.get("keep") is True)


def _lease_expired(backend: Backend, run_dir: str, intent: dict[str, Any]) -> bool:
    """The run's lease (or, before its first renewal, its start) is older than its timeout."""
    renewed, timeout = 0.0, LEASE_TIMEOUT_S
    with contextlib.suppress(FileNotFoundError, OSError, ValueError, BackendError,
                             AttributeError, TypeError):
        lease = json.loads(backend.get(f"{run_dir}/{LEASE}"))
        renewed, timeout = float(lease["renewed"]), max(timeout, float(lease["timeout_s"]))
    with contextlib.suppress(ValueError, TypeError):
        started = calendar.timegm(time.strptime(str(intent.get("started")), "%Y-%m-%dT%H:%M:%SZ"))
        renewed = max(renewed, started)
    return time.time() - renewed > timeout


def _safe(name: str) -> bool:
    """A relative name that stays inside its directory (an intent is data, not a command)."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def is_live(backend: Backend, run_dir: str, intent: dict[str, Any]) -> bool:
    """The run that wrote `intent` may still be running (when unsure: yes, it is left
    alone). On this host: its process is there. Elsewhere: its lease has not expired."""
    pid = intent.get("pid")
    if intent.get("host") != socket.gethostname():
        return not _lease_expired(backend, run_dir, intent)
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user has that pid: compared below
    if _exited(pid):
        return False
    start, recorded = _process_start(pid), intent.get("pid_start")
    return start is None or recorded is None or start == recorded


def _exited(pid: int) -> bool:
    """Process `pid` has exited and waits to be reaped (a zombie: signal 0 still reaches
    it, as when mpirun ended before the init process reaped its orphaned ranks)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


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
        if intent is None or intent.get("state") != "running" or is_live(backend, run_dir, intent):
            continue
        runs.append(names_of(intent))
        hosts.append(str(intent.get("host")))
    if not runs:
        return None
    keys = [k for n in runs for k in n.all_keys()]
    pending = backend.pending_uploads(keys) if isinstance(backend, UnfinishedUploads) else 0
    return Debris(runs, hosts, pending or 0)


def clean_debris(backend: Backend, debris: Debris) -> Debris:
    """Remove the debris by the names each run recorded (a --keep run's committed
    checkpoints stay, as its own end would have left them); say what is left."""
    left = [n for names in debris.runs for n in remove_keeping(backend, names)]
    return replace(debris, removed=True, left=left[:SHOWN])


def handle_debris(backend: Backend, clean: bool) -> Debris | None:
    """Find the debris of interrupted runs; remove it when asked (--clean-debris)."""
    with contextlib.suppress(BackendError):
        debris = find_debris(backend)
        if debris is not None and clean:
            debris = clean_debris(backend, debris)
        return debris
    return None
