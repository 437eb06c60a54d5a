"""The measurement schema: JSON Lines, one object per line, versioned.

Record types (``type``):

* ``run``: once, first: schema, run id, workload, options, environment, and the intra-op
  threads the rank processes run (``intra_op_threads``: value, source, why).
* ``op``: one I/O call: iteration, phase (save/restore), rank, thread, op
  (open/write/fsync/close/read/manifest/commit, the coordinator's gather and
  coordinator; formats add write_meta, encode,
  write_shard, read_shard, dcp_save, dcp_load with stored_bytes), file, bytes,
  start_ns, end_ns.
* ``clock``: under MPI, each node's clock offset to rank 0 (before and after the run).
* ``rank``: one rank's phase: bytes, start_ns, end_ns and seconds spent per op kind; the
  intra-op threads its process ran with (``intra_op_threads``, runner.threads) and, where
  its format times them (torch-dcp's load), its own ``parts``.
* ``phase``: what the coordinator saw: commit time, cache-avoidance method, verified,
  and ``parts``: the phase's seconds by name (save: data, gather, coordinator, metadata,
  commit; restore: metadata, data), adding up to the phase's span.
* ``error``: an iteration that failed, and why.
* ``summary``: added by the report step (statistics are not this module's business).
* ``--mode async`` adds ``loop`` (a process's training loop: state, staging, copy
  bandwidth, calibrated step), ``steps`` (each step's start and length, for the baseline
  loop and the checkpointing one) and ``checkpoint`` (per checkpoint and process: the
  blocking and persist times, when the loop resumed and when the checkpoint was
  durable); the report step adds ``async_summary`` (with the steps before, during and
  after each persist).

Clocks are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC): comparable between processes of
one host. Records never carry credentials: every record passes through
:func:`ckptbench.redact.redact` (the rule the backends' descriptions use too).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any, Protocol

from ckptbench import __version__
from ckptbench.redact import redact

SCHEMA = "ckptbench.results/1"
PACKAGES = ("numpy", "fsspec", "zarr", "numcodecs", "boto3", "botocore", "xxhash", "mpi4py",
            "torch", "s3fs")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _mem_total() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def environment(target_info: dict[str, Any]) -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "host": socket.gethostname(),
        "kernel": platform.release(),
        "os": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_bytes": _mem_total(),
        "python": sys.version.split()[0],
        "ckptbench": __version__,
        "packages": versions,
        "target": redact(target_info),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


@dataclass(slots=True)
class OpRecord:
    """One timed call (``op``), on process 0's clock."""

    iteration: int
    phase: str
    rank: int
    thread: int
    op: str
    file: str
    bytes: int
    start_ns: int
    end_ns: int
    process: int | None = None  # set for ops of a process rather than a rank (manifest)
    extra: dict[str, Any] | None = None  # format-specific fields (stored_bytes, object, ...)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "op", "iteration": self.iteration, "phase": self.phase,
                               "rank": self.rank}
        if self.process is not None:
            out["process"] = self.process
        out.update(thread=self.thread, op=self.op, file=self.file, bytes=self.bytes,
                   start_ns=self.start_ns, end_ns=self.end_ns)
        if self.extra:
            out.update(self.extra)
        return out


@dataclass(slots=True)
class RankRecord:
    """One rank's phase: bytes, span and seconds spent per op kind (``<op>_s``)."""

    iteration: int
    phase: str
    rank: int
    process: int
    host: str
    bytes: int = 0
    start_ns: int = 0
    end_ns: int = 0
    ops: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    stored_bytes: int | None = None
    backend: dict[str, int] | None = None  # backend counters (retries, ...)
    intra_op_threads: int | None = None  # the threads its process ran with (runner.threads)
    parts: dict[str, float] | None = None  # a format's named parts of its ops (DCP's load)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "rank", "iteration": self.iteration, "phase": self.phase, "rank": self.rank,
            "process": self.process, "host": self.host, "bytes": self.bytes,
            "start_ns": self.start_ns, "end_ns": self.end_ns, "ops": self.ops,
            **{f"{k}_s": v for k, v in self.seconds.items()}}
        if self.stored_bytes is not None:
            out["stored_bytes"] = self.stored_bytes
        if self.backend:
            out["backend"] = self.backend
        if self.intra_op_threads is not None:
            out["intra_op_threads"] = self.intra_op_threads
        if self.parts is not None:
            out["parts"] = self.parts
        return out


@dataclass(slots=True)
class SavePhaseRecord:
    """What the coordinator saw of a save: the commit, whether it succeeded, and the
    phase's seconds in named parts (runner.parts: data, gather, coordinator, metadata,
    commit; a committed save only)."""

    iteration: int
    ok: bool
    checkpoint: str
    processes: int
    commit_ns: list[int] | None
    parts: dict[str, float] | None = None
    # seconds spent after the save, off its clock: ckptbench's manifest of a format that
    # commits itself (torch-dcp), kept for its restores' checks, not part of the save
    off_clock: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"type": "phase", "iteration": self.iteration, "phase": "save", "ok": self.ok,
               "checkpoint": self.checkpoint, "processes": self.processes,
               "commit_ns": self.commit_ns}
        if self.parts is not None:
            out["parts"] = self.parts
        if self.off_clock is not None:
            out["off_clock"] = self.off_clock
        return out


@dataclass(slots=True)
class RestorePhaseRecord:
    """What the coordinator saw of a restore: cache rule, verification, shift."""

    iteration: int
    ok: bool
    cache: str | list[str]
    verified: bool
    mismatched_chunks: int
    restore_shift: int
    # the restore plan: restore_plan (dcp|dlio|files), restore_world_size, restore_layout,
    # amplification, planned_read_bytes; as measured: read_bytes (payload), parts (name ->
    # seconds: torch-dcp's metadata/planning/data/deserialise/sync of its slowest rank,
    # else runner.parts' metadata, setup, first_byte, data), rank_parts (torch-dcp: the
    # slowest and the median rank's, runner.phase_report.rank_parts), file_read_bytes
    # (torch-dcp: what its reader read from its files), file_readers_max/median, ...
    extra: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"type": "phase", "iteration": self.iteration, "phase": "restore", "ok": self.ok,
                "cache": self.cache, "verified": self.verified,
                "mismatched_chunks": self.mismatched_chunks, "restore_shift": self.restore_shift,
                **(self.extra or {})}


@dataclass(slots=True)
class ErrorRecord:
    """An iteration that failed, and why (``removed``: the partial checkpoint deleted)."""

    iteration: int
    phase: str
    kind: str
    message: str
    removed: str | None = None
    threads: str | None = None  # a stalled process's thread dump (runner.thread_dump)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "error", "iteration": self.iteration, "phase": self.phase,
                               "kind": self.kind, "message": self.message}
        if self.removed is not None:
            out["removed"] = self.removed
        if self.threads is not None:
            out["threads"] = self.threads
        return out


@dataclass(slots=True)
class ClockRecord:
    """Under MPI on several nodes: each node's clock offset to rank 0 at the end."""

    when: str
    nodes: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"type": "clock", "when": self.when, "nodes": self.nodes}


@dataclass(slots=True)
class LoopRecord:
    """--mode async: one process's training loop as set up (before any clock ran)."""

    process: int
    ranks: list[int]
    host: str
    device: str  # host | cuda: where the state lives
    bytes: int  # the state's payload bytes (what each snapshot copies)
    staging_bytes: int
    snapshot: str  # full (the state fits staging) | piecewise
    copy_bytes_per_s: float  # one copy of the state into staging (memcpy or device-to-host)
    kernel: str
    schedule: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"type": "loop", "process": self.process, "ranks": self.ranks, "host": self.host,
                "device": self.device, "bytes": self.bytes, "staging_bytes": self.staging_bytes,
                "snapshot": self.snapshot, "copy_bytes_per_s": self.copy_bytes_per_s,
                "kernel": self.kernel, **self.schedule}


@dataclass(slots=True)
class StepsRecord:
    """--mode async: every training step of one loop on one process, on process 0's clock."""

    loop: str  # baseline (no checkpoints) | async
    process: int
    start_ns: list[int]
    seconds: list[float]

    def to_dict(self) -> dict[str, Any]:
        return {"type": "steps", "loop": self.loop, "process": self.process,
                "start_ns": self.start_ns, "seconds": self.seconds}


@dataclass(slots=True)
class CheckpointRecord:
    """--mode async: one checkpoint on one process. blocking = wait (for the previous
    persist) + snapshot + waiting for the other processes' snapshots; persist = snapshot
    start to the manifest's commit; durable_after = the loop resuming to that commit."""

    iteration: int
    process: int
    ranks: list[int]
    ok: bool
    bytes: int
    start_ns: int  # the checkpoint was due
    wait_s: float
    refresh_s: float  # off the clock: the state made the checkpoint's payload
    limit_s: float  # off the clock, just before: one plain copy of the state into staging
    snapshot_s: float
    blocking_s: float
    resume_ns: int  # the loop resumed
    persist_s: float | None
    durable_after_s: float | None
    durable_ns: int | None  # the manifest's commit ended

    def to_dict(self) -> dict[str, Any]:
        return {"type": "checkpoint", "iteration": self.iteration, "process": self.process,
                "ranks": self.ranks, "ok": self.ok, "bytes": self.bytes,
                "start_ns": self.start_ns, "wait_s": self.wait_s, "refresh_s": self.refresh_s,
                "limit_s": self.limit_s, "snapshot_s": self.snapshot_s,
                "blocking_s": self.blocking_s, "resume_ns": self.resume_ns,
                "persist_s": self.persist_s, "durable_after_s": self.durable_after_s,
                "durable_ns": self.durable_ns}


Record = (OpRecord | RankRecord | SavePhaseRecord | RestorePhaseRecord | ErrorRecord | ClockRecord
          | LoopRecord | StepsRecord | CheckpointRecord)


def as_dict(record: Record | dict[str, Any]) -> dict[str, Any]:
    return record if isinstance(record, dict) else record.to_dict()


class RecordSink(Protocol):
    """Where the runner sends records (the coordinator's only)."""

    def write(self, record: Record | dict[str, Any]) -> None: ...

    def write_all(self, records: Iterable[Record | dict[str, Any]]) -> None: ...

    def flush(self) -> None: ...


class JsonlSink:
    """Appends records to a JSONL file that did not exist before (never overwrites), and
    keeps what it wrote in memory, so the caller summarizes without reading the file back.
    A write that fails (a full file system) removes the file it created: no empty or
    cut-off file is left looking like results."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f: IO[str] | None = None
        self.records: list[dict[str, Any]] = []
        self.broken = False  # a write failed: nothing more is written
        # A stall notice is recorded from a thread of its own (runner.watch_mpi) while the
        # main thread may be writing: one record, one whole line.
        self._lock = threading.Lock()

    def open(self) -> None:
        from ckptbench.errors import CkptbenchError

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # e.g. ./results is a regular file
            raise CkptbenchError(f"{self.path.parent}: not a directory (results files go in it); "
                                 "allowed: a directory, or choose another --results path") from None
        except OSError as exc:
            raise CkptbenchError(f"{self.path.parent}: cannot create the results directory "
                                 f"({exc.strerror})") from None
        try:
            self._f = open(self.path, "x")  # noqa: SIM115 - lives as long as the sink
        except FileExistsError:
            raise CkptbenchError(f"{self.path}: results file exists (never overwritten); "
                                 "choose another --results path") from None
        except OSError as exc:
            raise CkptbenchError(f"{self.path}: cannot write results ({exc.strerror})") from None

    @property
    def is_open(self) -> bool:
        return self._f is not None and not self.broken

    def write(self, record: Record | dict[str, Any]) -> None:
        if self.broken:  # the failure was raised once; cleanup's records have nowhere to go
            return
        data = redact(as_dict(record))
        line = json.dumps(data, separators=(",", ":")) + "\n"
        with self._lock:
            if self.broken:  # another thread's write failed meanwhile (the file is gone)
                return
            assert self._f is not None
            self.records.append(data)
            try:
                self._f.write(line)
            except OSError as exc:
                raise self._failed(exc) from None

    def write_all(self, records: Iterable[Record | dict[str, Any]]) -> None:
        for r in records:
            self.write(r)
        self.flush()

    def flush(self) -> None:
        with self._lock:
            if self._f and not self.broken:
                try:
                    self._f.flush()
                    os.fsync(self._f.fileno())
                except OSError as exc:
                    raise self._failed(exc) from None

    def close(self) -> None:
        if self._f:
            f, self._f = self._f, None
            with contextlib.suppress(OSError):  # a write that failed was reported then
                f.close()

    def _failed(self, exc: OSError) -> Exception:
        """A write or flush failed (ENOSPC, EIO, EDQUOT): nothing more is written, and the
        file this sink created is removed, so no empty or cut-off file looks like results."""
        from ckptbench.errors import CkptbenchError

        self.broken = True
        removed = self._remove_own_file()
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        return CkptbenchError(f"{self.path}: cannot write results ({exc.strerror}): errno "
                              f"{code}; the run was stopped and "
                              + ("its partial results file removed" if removed else
                                 "its partial results file left (it is not whole)")
                              + "; allowed: a results path with room (--results)")

    def _remove_own_file(self) -> bool:
        """Close and unlink the file open() created, if the path is still that file (never
        one that replaced it); True when it is gone."""
        f, self._f = self._f, None
        if f is None:
            return False
        try:
            mine = os.fstat(f.fileno())
            there = os.stat(self.path, follow_symlinks=False)
            if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                self.path.unlink()
                return True
            return False
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):  # the buffered tail cannot be written either
                f.close()


_JSON_KINDS = {list: "a JSON array", type(None): "null", str: "a JSON string", bool: "a boolean",
               int: "a number", float: "a number"}


# A results file is read whole into memory (report, cadence): larger is not one of ours.
MAX_RESULTS_BYTES = 1 << 30
MAX_LINE_BYTES = 64 << 20  # a record is far smaller: longer is garbage, refused unread
# A JSON line with a control character in a string holds it escaped (\u001b) or as DEL or
# a C1 control (U+007F-U+009F: UTF-8 \x7f, or \xc2 then \x80-\x9f); other lines skip the scan.
_MAYBE_CONTROL = (b"\\u00", b"\x7f", b"\xc2")


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a results file; a line that is not UTF-8 JSON holding an object
    is one error naming the file and line (garbage, `[1,2]` and `null` included). Only
    a regular file of at most MAX_RESULTS_BYTES is read (never a FIFO or a device), and
    control characters in its strings come back escaped (they are printed)."""
    from ckptbench.errors import CkptbenchError
    from ckptbench.fields import open_regular, printable_tree

    rule = ("allowed: a results file of `ckptbench run` (a regular file of at most "
            f"{MAX_RESULTS_BYTES:,} bytes)")
    try:
        f = os.fdopen(open_regular(path, rule, error=CkptbenchError), "rb")
    except FileNotFoundError:
        raise CkptbenchError(f"{path}: no such file; {rule}") from None
    first = True
    left = MAX_RESULTS_BYTES
    with f:
        if os.fstat(f.fileno()).st_size > left:  # refused before a byte is read
            raise CkptbenchError(f"{path}: larger than {MAX_RESULTS_BYTES:,} bytes; {rule}")
        for n in itertools.count(1):
            raw = f.readline(min(left, MAX_LINE_BYTES) + 1)
            if not raw:
                break
            left -= len(raw)
            if left < 0:
                raise CkptbenchError(f"{path}: larger than {MAX_RESULTS_BYTES:,} bytes; {rule}")
            if len(raw) > MAX_LINE_BYTES:  # read no further: one line is never this long
                raise CkptbenchError(f"{path}:{n}: a line longer than {MAX_LINE_BYTES:,} bytes"
                                     f" (not a ckptbench results file); {rule}")
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise CkptbenchError(f"{path}:{n}: not UTF-8 text (not a ckptbench results file)") from None
            except (json.JSONDecodeError, RecursionError):  # nesting too deep is garbage too
                raise CkptbenchError(f"{path}:{n}: not a JSON line") from None
            if not isinstance(record, dict):
                kind = _JSON_KINDS.get(type(record), "a value")
                raise CkptbenchError(f"{path}:{n}: {kind}, not a record; allowed: one JSON object per line")
            if first and record.get("schema") != SCHEMA:
                raise CkptbenchError(f"{path}: not a ckptbench results file (schema {SCHEMA} expected)")
            first = False
            yield printable_tree(record) if any(c in raw for c in _MAYBE_CONTROL) else record
