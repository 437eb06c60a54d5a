"""The measurement schema: JSON Lines, one object per line, versioned.

Record types (``type``):

* ``run``: once, first: schema, run id, workload, options, environment.
* ``op``: one I/O call: iteration, phase (save/restore), rank, thread, op
  (open/write/fsync/close/read/manifest/commit; formats add write_meta, encode,
  write_shard, read_shard, dcp_save, dcp_load with stored_bytes), file, bytes,
  start_ns, end_ns.
* ``clock``: under MPI, each node's clock offset to rank 0 (before and after the run).
* ``rank``: one rank's phase: bytes, start_ns, end_ns and seconds spent per op kind.
* ``phase``: what the coordinator saw: commit time, cache-avoidance method, verified.
* ``error``: an iteration that failed, and why.
* ``summary``: added by the report step (statistics are not this module's business).

Clocks are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC): comparable between processes of
one host. Records never carry credentials: options pass through :func:`redact`.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from ckptbench import __version__

SCHEMA = "ckptbench.results/1"
_SECRET = re.compile(r"secret|password|token|credential|access_key|session", re.IGNORECASE)
PACKAGES = ("numpy", "fsspec", "zarr", "numcodecs", "boto3", "botocore", "xxhash", "mpi4py",
            "torch", "s3fs")


def redact(value: Any) -> Any:
    """Drop values whose key names a secret, recursively."""
    if isinstance(value, dict):
        return {k: ("<redacted>" if _SECRET.search(str(k)) else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


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


class ResultsWriter:
    """Appends records to a JSONL file that did not exist before (never overwrites)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f: IO[str] | None = None

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
            self._f = open(self.path, "x")  # noqa: SIM115 - lives as long as the writer
        except FileExistsError:
            raise CkptbenchError(f"{self.path}: results file exists (never overwritten); "
                                 "choose another --results path") from None
        except OSError as exc:
            raise CkptbenchError(f"{self.path}: cannot write results ({exc.strerror})") from None

    def write(self, record: dict[str, Any]) -> None:
        assert self._f is not None
        self._f.write(json.dumps(redact(record), separators=(",", ":")) + "\n")

    def write_all(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            self.write(r)
        self.flush()

    def flush(self) -> None:
        if self._f:
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f:
            self._f.close()
            self._f = None


_JSON_KINDS = {list: "a JSON array", type(None): "null", str: "a JSON string", bool: "a boolean",
               int: "a number", float: "a number"}


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a results file; a line that is not UTF-8 JSON holding an object
    is one error naming the file and line (garbage, `[1,2]` and `null` included)."""
    from ckptbench.errors import CkptbenchError

    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise CkptbenchError(f"{path}: cannot read results ({exc.strerror})") from None
    first = True
    with f:
        for n, raw in enumerate(f, 1):
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
            yield record
