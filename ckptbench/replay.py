"""`ckptbench run --replay RESULTS.jsonl`: what a results file says was run, so it can be
run again as it was (its workload, its run options, the target and the backend's options),
and what differs on this machine (host, kernel, versions, the target's file system).

A results file records the options a run was made of (``run_options``, ckptbench.runspec)
beside the runner's; the replay takes those, checked as a ``[run]`` table is, so a field
this ckptbench does not know is one line naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptbench import __version__
from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.fields import open_regular, shown
from ckptbench.records import read_records
from ckptbench.runspec import OPTIONS, option
from ckptbench.spec import Workload, workload_from_dict

# The environment's fields compared, and the target's.
_MACHINE = ("host", "kernel", "os", "cpu", "cpus", "memory_bytes", "python", "ckptbench")
_TARGET = ("backend", "target", "options", "fs_type", "mount_source", "device", "rotational")
REPLAYED = ("run", "sweep", "mlperf")  # commands whose runs `run --replay` runs again
# A run record is a few KiB, its ranks 8 bytes each (9 MB at 1,048,576 ranks): a first
# line longer than this is not one (a replay reads no further to say so).
MAX_RUN_RECORD_BYTES = 64 << 20
_BLOCK = 1 << 20
# Options a results file never records (the results path, the launcher, how output prints).
OUTPUT_OPTIONS = frozenset(o.name for o in OPTIONS if not o.request)


@dataclass(frozen=True)
class Recorded:
    """A results file's run: its full-size workload, its run options (name -> value), the
    backend's options and the environment it ran in."""

    path: Path
    command: str
    workload: Workload
    settings: dict[str, Any]
    backend_options: dict[str, Any]
    environment: dict[str, Any]


def _field(run: Mapping[str, Any], key: str, kind: type, path: Path) -> Any:
    value = run.get(key)
    if not isinstance(value, kind):
        raise CkptbenchError(f"{path}: run record field {key} is {shown(value)}; allowed: "
                             f"what `ckptbench run` records (a results file of ckptbench "
                             f"{__version__} or newer)")
    return value


def read_recorded(path: str | Path) -> Recorded:
    """The run a results file records, or one line naming what is missing."""
    path = Path(path)
    _first_line_bounded(path)
    run = next(read_records(path), None)
    if run is None or run.get("type") != "run":
        raise CkptbenchError(f"{path}: no run record; allowed: a results file of `ckptbench "
                             "run`")
    settings = _field(run, "run_options", dict, path)
    output = sorted(set(settings) & OUTPUT_OPTIONS)
    if output:
        # Never recorded (runspec: request=False): only a forged file holds them, and a
        # replay must not write its results (or anything) where such a file says.
        name = output[0]
        default = (" (default: results/<workload>-<run id>.jsonl under the current "
                   "directory)" if name == "results" else "")
        raise CkptbenchError(f"{path}: run_options {name}: a run never records it (it comes "
                             f"from the command line); allowed: {option(name).cli_flag} on "
                             f"the command line{default}")
    command = _field(run, "command", str, path)
    if command not in REPLAYED:
        raise CkptbenchError(f"{path}: a `ckptbench {shown(command)}` run; allowed: results of "
                             f"{', '.join(f'`ckptbench {c}`' for c in REPLAYED)}")
    environment = _field(run, "environment", dict, path)
    target = environment.get("target")
    if not isinstance(target, dict) or not isinstance(target.get("options"), dict):
        raise CkptbenchError(f"{path}: run record field environment.target.options is "
                             "missing; allowed: a results file of `ckptbench run`")
    try:
        workload = workload_from_dict(_field(run, "workload", dict, path))
    except SpecError as exc:
        raise SpecError(f"{path}: run record field workload: {exc}") from None
    return Recorded(path, command, workload, dict(settings), dict(target["options"]),
                    environment)


def _first_line_bounded(path: Path) -> None:
    """A results file begins with its run record, one line of at most MAX_RUN_RECORD_BYTES:
    a file whose first line runs on past that (a GiB of garbage without a newline) is
    refused after reading that much, never read whole. Anything else is read_records'."""
    rule = ("allowed: a results file of `ckptbench run` (its first line a run record of at "
            f"most {MAX_RUN_RECORD_BYTES:,} bytes)")
    try:
        fd = open_regular(path, rule, error=CkptbenchError)
    except FileNotFoundError:
        return  # read_records says so
    seen = 0
    started = False  # a byte other than blank space was read: the first line began
    with os.fdopen(fd, "rb") as f:
        while seen <= MAX_RUN_RECORD_BYTES:
            block = f.read(_BLOCK)
            if not block:
                return
            seen += len(block)
            if not started:
                stripped = block.lstrip()
                started, block = bool(stripped), stripped
            if started and b"\n" in block:
                return
    raise CkptbenchError(f"{path}: not a ckptbench results file (no line ends in its first "
                         f"{MAX_RUN_RECORD_BYTES:,} bytes); {rule}")


def differences(recorded: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """What differs between the recorded environment and this one, one line each."""
    lines: list[str] = []

    def compare(label: str, old: Any, new: Any) -> None:
        if old != new:
            lines.append(f"{label}: {_text(old)} recorded, {_text(new)} here")

    for key in _MACHINE:
        compare(key, recorded.get(key), here.get(key))
    old_packages, new_packages = recorded.get("packages") or {}, here.get("packages") or {}
    for name in sorted(set(old_packages) | set(new_packages)):
        compare(f"package {name}", old_packages.get(name), new_packages.get(name))
    old_target, new_target = recorded.get("target") or {}, here.get("target") or {}
    for key in _TARGET:
        compare(f"target {key}", old_target.get(key), new_target.get(key))
    return lines


def overridden(recorded: Mapping[str, Any], settings: Mapping[str, Any]) -> list[str]:
    """The run options the command line changed from the recorded ones, one line each."""
    return [f"{name}: {_text(recorded[name])} recorded, {_text(value)} given"
            for name, value in settings.items() if name in recorded and recorded[name] != value]


def _text(value: Any) -> str:
    return "none" if value is None else shown(value) if not isinstance(value, int | float) \
        else str(value)
