"""`ckptbench clean TARGET`: what ckptbench left on a target, found by its own records, and
its removal by name.

Each run directory is judged by its intent (runner.cleanup): a --keep run's record names
its kept checkpoints and every file in them; a run whose intent says "running" is debris
once provably dead (its process gone on this host, its lease expired elsewhere) and is
left alone while it may be alive; a run directory with nothing in it (named as ckptbench
names runs) is removed. Anything else on the target (a directory or file without a record,
a link) is someone else's: listed as left alone, never touched. Removal is remove_run's:
the recorded names only, in the recorded directories, never through a link.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from typing import Any

from ckptbench.backends import Backend
from ckptbench.backends.base import TARGET_MARKER
from ckptbench.errors import SpecError
from ckptbench.runner.cleanup import (
    INTENT,
    KEPT,
    SHOWN,
    RunNames,
    is_live,
    names_of,
    read_intent,
    remove_run,
)

RUN_ID = re.compile(r"run-\d{8}-\d{6}-\d+(-\d+)?")  # runner.options.new_run_id, claim's -N

# What a run directory holds, as `clean` lists it.
KINDS = {"kept": "kept checkpoints", "debris": "debris of an interrupted run",
         "empty": "empty run directory", "live": "a run in progress: left alone",
         "foreign": "holds no record of a ckptbench run: left alone"}
REMOVABLE = ("kept", "debris", "empty")


@dataclass(frozen=True)
class Found:
    """One entry at the top of the target and what `clean` makes of it."""

    name: str
    kind: str  # a key of KINDS
    checkpoints: tuple[str, ...] = ()
    names: RunNames | None = None
    host: str = ""

    def line(self) -> str:
        what = KINDS[self.kind]
        if self.checkpoints:
            what += f" ({', '.join(self.checkpoints)})"
        if self.host and self.host != socket.gethostname():
            what += f", started on {self.host}"
        return f"{self.name}: {what}"

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "checkpoints": list(self.checkpoints)}


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

    def record(self) -> dict[str, Any]:
        return {"target": self.target, "found": [f.record() for f in self.found],
                "removed": self.removed, "left": self.left}


def _judge(backend: Backend, run_dir: str) -> Found:
    intent = read_intent(backend, run_dir)
    if intent is None:
        empty = RUN_ID.fullmatch(run_dir) and not backend.list_names(run_dir, 1)
        return Found(run_dir, "empty" if empty else "foreign")
    names = names_of(intent)
    host = str(intent.get("host", ""))
    state = intent.get("state")
    if state == KEPT:
        return Found(run_dir, "kept", names.checkpoints, names, host)
    if state != "running" or is_live(backend, run_dir, intent):
        return Found(run_dir, "live" if state == "running" else "foreign", (), None, host)
    return Found(run_dir, "debris", names.checkpoints, names, host)


def survey(backend: Backend) -> Survey:
    """What ckptbench left on the target (which must carry ckptbench's marker: nothing is
    looked at, let alone removed, elsewhere)."""
    if not backend.exists(TARGET_MARKER):
        raise SpecError(f"target {backend.target}: no {TARGET_MARKER} marker; allowed: a "
                        "target ckptbench has written to (clean removes only what it wrote)")
    return Survey(backend.target, [_judge(backend, d) for d in backend.run_dirs()])


def remove(backend: Backend, found: Survey) -> Survey:
    """Remove what the survey found removable, by the names each run recorded; note what is
    left there (someone else's files, unfinished uploads the store kept)."""
    for entry in found.removable:
        if entry.names is not None:
            left = remove_run(backend, entry.names, uploads=entry.kind == "debris")
        else:  # an empty run directory
            backend.remove_dir(entry.name)
            left = backend.list_names(entry.name, SHOWN)
        found.removed.append(entry.name)
        found.left += [n for n in left if n != f"{entry.name}/{INTENT}"][:SHOWN]
    return found
