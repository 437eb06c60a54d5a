"""`ckptbench clean TARGET`: what ckptbench left on a target, found by its own records, and
its removal by name.

Each run directory is judged by its intent (runner.cleanup): a --keep run's record names
its kept checkpoints and every file in them; a run whose intent says "running" is debris
once provably dead (its process gone on this host, its lease expired elsewhere) and is
left alone while it may be alive (:func:`live_reason`, which `ckptbench relaunch` asks
too); a run directory with nothing in it (named as ckptbench names runs) is removed.
Anything else on the target (a directory or file without a record, a link) is someone
else's: listed as left alone, never touched. Removal is remove_run's: the recorded names
only, in the recorded directories, never through a link.

The debris of a killed --keep run is what the run's own end would have removed: its
committed checkpoints (their manifest there and whole) stay, recorded as kept, as
--clean-debris leaves them; the debris listed is only the checkpoints the run made. On a
file system, a recorded name owned by another uid than the one running `clean` is never
deleted (it is named, with its owner), and a run directory whose own records (its intent,
lease) another uid owns is another user's run: left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ckptbench.backends import Backend
from ckptbench.backends.base import TARGET_MARKER
from ckptbench.errors import BackendError, CkptbenchError, SpecError, VerificationError
from ckptbench.formats.manifest import Manifest
from ckptbench.runner.cleanup import (
    INTENT,
    KEPT,
    LEASE,
    LEASE_TIMEOUT_S,
    SHOWN,
    RunNames,
    is_live,
    names_of,
    read_intent,
    remove_checkpoint,
    remove_keeping,
    remove_run,
)

RUN_ID = re.compile(r"run-\d{8}-\d{6}-\d+(-\d+)?")  # runner.options.new_run_id, claim's -N

# What a run directory holds, as `clean` lists it.
KINDS = {"kept": "kept checkpoints", "debris": "debris of an interrupted run",
         "empty": "empty run directory", "live": "a run in progress: left alone",
         "foreign": "holds no record of a ckptbench run: left alone",
         "other_user": "another user's run: left alone"}
REMOVABLE = ("kept", "debris", "empty")


# --- a run in progress: the one rule, for `clean` and `relaunch` ---
def live_reason(backend: Backend, run_dir: str, intent: dict[str, Any]) -> str | None:
    """Why the run that wrote `intent` (in `run_dir`) is taken for a run in progress, or
    None when it is not: its intent says it ended (kept), or it is provably dead
    (runner.cleanup.is_live: on this host its process is gone or exited, not yet reaped;
    elsewhere its lease is older than its timeout). A live run is left alone by `clean`
    and refused by `relaunch`: this is the one rule."""
    if intent.get("state") != "running" or not is_live(backend, run_dir, intent):
        return None
    host, pid = str(intent.get("host", "?")), intent.get("pid")
    if host != socket.gethostname():
        age = _lease_age(backend, run_dir)
        renewed = (f"its lease renewed {age:.0f} s ago" if age is not None
                   else "started less than its lease's timeout ago")
        return (f"started on host {host}, {renewed}; a run elsewhere is taken for dead once "
                f"its lease is {LEASE_TIMEOUT_S:.0f} s old")
    return f"its process {pid} on host {host} is running"


def in_progress(backend: Backend, run_dir: str) -> str | None:
    """Why the run in `run_dir` on `backend` is taken for a run in progress
    (:func:`live_reason`), or None: its intent is not there (the run ended, or never
    started there) or says it ended, or the run is dead. An intent there that cannot be
    read as one is one line (BackendError): whether that run is alive cannot be told."""
    intent = read_intent(backend, run_dir)
    if intent is None:
        key = f"{run_dir}/{INTENT}"
        if backend.exists(key):  # a store that does not answer raises here
            raise BackendError(f"{backend.target.rstrip('/')}/{key}: not a run's intent "
                               "ckptbench can read, so whether run "
                               f"{run_dir} is still running cannot be told; allowed: once it "
                               "is known to have ended, remove that file")
        return None
    return live_reason(backend, run_dir, intent)


def _lease_age(backend: Backend, run_dir: str) -> float | None:
    """Seconds since the run's lease was renewed (None: no lease readable), for the line."""
    with contextlib.suppress(FileNotFoundError, OSError, ValueError, TypeError, KeyError,
                             BackendError):
        return max(0.0, time.time() - float(json.loads(backend.get(f"{run_dir}/{LEASE}"))
                                           ["renewed"]))
    return None


# --- who owns what (a file system's uids) ---
def _owner(backend: Backend, key: str) -> int | None:
    """The uid owning `key` on a local file system (the entry itself, never a link's
    target); None where the store has no owners or `key` is not there."""
    root = backend.local_dir
    if root is None:
        return None
    try:
        return os.lstat(root / key).st_uid
    except OSError:
        return None


def _theirs(backend: Backend, keys: list[str]) -> list[tuple[str, int]]:
    """Those of `keys` another uid owns than the one running `clean`, with that uid."""
    me = os.geteuid()
    return [(k, uid) for k in keys if (uid := _owner(backend, k)) is not None and uid != me]


def _own_files(names: RunNames, checkpoint: str, theirs: set[str]) -> RunNames:
    """`names` with the files of `checkpoint` another uid owns left out (never deleted)."""
    keep = [f for f in names.files if f"{names.run_id}/{checkpoint}/{f}" not in theirs]
    return names if len(keep) == len(names.files) else replace(names, files=tuple(keep))


# --- what a run directory holds ---
@dataclass(frozen=True)
class Found:
    """One entry at the top of the target and what `clean` makes of it."""

    name: str
    kind: str  # a key of KINDS
    checkpoints: tuple[str, ...] = ()  # kept; of debris, those the run made
    names: RunNames | None = None
    host: str = ""
    committed: tuple[str, ...] = ()  # debris of a --keep run: its committed checkpoints
    theirs: tuple[tuple[str, int], ...] = ()  # recorded names another uid owns: left
    why: str = ""  # a run in progress: why it is taken for one; another user's: the uid

    def line(self) -> str:
        what = KINDS[self.kind]
        if self.checkpoints:
            what += f" ({', '.join(self.checkpoints)})"
        if self.why:
            what += f" ({self.why})"
        if self.host and self.host != socket.gethostname() and self.kind != "live":
            what += f", started on {self.host}"
        if self.committed:
            what += (f"; kept: {', '.join(self.committed)} (committed by this --keep run: "
                     "recorded as its kept checkpoints)")
        return f"{self.name}: {what}"

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "checkpoints": list(self.checkpoints),
                "committed": list(self.committed),
                "not_owned": [{"name": k, "uid": uid} for k, uid in self.theirs]}


@dataclass
class Survey:
    """What is on the target; after `remove`, what was removed and what is left there."""

    target: str
    found: list[Found]
    removed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)

    @property
    def removable(self) -> list[Found]:
        return [f for f in self.found if f.kind in REMOVABLE]

    @property
    def not_owned(self) -> list[tuple[str, int]]:
        """Recorded names of the removable entries that another uid owns: never deleted."""
        return [t for f in self.removable for t in f.theirs]

    def record(self) -> dict[str, Any]:
        return {"target": self.target, "found": [f.record() for f in self.found],
                "removed": self.removed, "left": self.left,
                "not_owned": [{"name": k, "uid": uid} for k, uid in self.not_owned]}


def _made(backend: Backend, names: RunNames, checkpoint: str) -> bool:
    """The run made `checkpoint`: objects under its prefix are there, or, on a file
    system, its directory (empty or not)."""
    key = f"{names.run_id}/{checkpoint}"
    return bool(backend.list_names(key, 1)) or (backend.local_dir is not None
                                                and backend.exists(key))


def _committed(backend: Backend, names: RunNames) -> list[str]:
    """The checkpoints of a --keep run that were committed: their manifest is there and
    whole (the size it was written at). One that cannot be read now (a store that does
    not answer) counts as committed: when unsure, a checkpoint stays."""
    if not (names.keep and names.manifest):
        return []
    out = []
    for c in names.checkpoints:
        try:
            Manifest.load(backend, f"{names.run_id}/{c}/{names.manifest}")
        except FileNotFoundError:
            continue  # never committed
        except (VerificationError, CkptbenchError) as exc:
            if not isinstance(exc, BackendError):
                continue  # not all of it, or not a manifest ckptbench wrote
        except OSError:
            pass  # cannot be read now: it stays
        out.append(c)
    return out


def _judge(backend: Backend, run_dir: str) -> Found:
    intent = read_intent(backend, run_dir)
    if intent is None:
        empty = RUN_ID.fullmatch(run_dir) and not backend.list_names(run_dir, 1)
        if empty and (other := _theirs(backend, [run_dir])):
            return Found(run_dir, "other_user", why=f"its directory is owned by uid {other[0][1]}")
        return Found(run_dir, "empty" if empty else "foreign")
    names = names_of(intent)
    host = str(intent.get("host", ""))
    state = intent.get("state")
    other = _theirs(backend, [f"{run_dir}/{n}" for n in names.run_files])
    if other:  # the run's own records are another user's: so is the run
        return Found(run_dir, "other_user", host=host,
                     why=f"{other[0][0].split('/')[-1]} is owned by uid {other[0][1]}")
    if state == KEPT:
        theirs = _theirs(backend, [k for c in names.checkpoints for k in names.keys(c)])
        return Found(run_dir, "kept", names.checkpoints, names, host, theirs=tuple(theirs))
    if state != "running":
        return Found(run_dir, "foreign", host=host)
    why = live_reason(backend, run_dir, intent)
    if why is not None:
        return Found(run_dir, "live", host=host, why=why)
    committed = _committed(backend, names)
    rest = [c for c in names.checkpoints if c not in committed]
    theirs = _theirs(backend, [k for c in rest for k in names.keys(c)])
    return Found(run_dir, "debris", tuple(c for c in rest if _made(backend, names, c)), names,
                 host, tuple(committed), tuple(theirs))


def survey(backend: Backend) -> Survey:
    """What ckptbench left on the target (which must carry ckptbench's marker: nothing is
    looked at, let alone removed, elsewhere)."""
    if not backend.exists(TARGET_MARKER):
        raise SpecError(f"target {backend.target}: no {TARGET_MARKER} marker; allowed: a "
                        "target ckptbench has written to (clean removes only what it wrote)")
    return Survey(backend.target, [_judge(backend, d) for d in backend.run_dirs()])


def _remove_entry(backend: Backend, entry: Found) -> list[str]:
    """Remove one removable entry by the names its run recorded, never a file another uid
    owns; what is left there."""
    names = entry.names
    if names is None:  # an empty run directory
        backend.remove_dir(entry.name)
        return backend.list_names(entry.name, SHOWN)
    theirs = {k for k, _ in entry.theirs}
    if entry.kind == "kept":
        for c in names.checkpoints:
            remove_checkpoint(backend, _own_files(names, c, theirs), c)
        return remove_run(backend, names, checkpoints=False)
    # debris: all but the committed checkpoints (a killed save's unfinished uploads
    # aborted); those stay, recorded as kept, as --clean-debris leaves them
    rest = tuple(c for c in names.checkpoints if c not in entry.committed)
    for c in rest:
        remove_checkpoint(backend, _own_files(names, c, theirs), c, uploads=True)
    if entry.committed:
        return remove_keeping(backend, replace(names, checkpoints=entry.committed))
    return remove_run(backend, replace(names, checkpoints=rest), uploads=True,
                      checkpoints=False)


def remove(backend: Backend, found: Survey) -> Survey:
    """Remove what the survey found removable, by the names each run recorded; note what is
    left there (someone else's files, unfinished uploads the store kept). A recorded name
    another uid owns is left (Survey.not_owned)."""
    not_owned = {k for k, _ in found.not_owned}
    for entry in found.removable:
        left = _remove_entry(backend, entry)
        found.removed.append(entry.name)
        found.left += [n for n in left if n != f"{entry.name}/{INTENT}"
                       and n not in not_owned][:SHOWN]
    return found
