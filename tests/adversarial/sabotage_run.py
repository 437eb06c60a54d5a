"""`ckptbench run` whose checkpoint is damaged on disk between save and restore, or whose
storage stops answering (tests only).

    python tests/adversarial/sabotage_run.py ACTION -- RUN ARGS...

The real CLI in a real process, on a real local target: the backend the CLI opens is
wrapped so that, when the runner evicts the checkpoint from caches (after the manifest is
committed, before the restore starts), the first process to get there applies ACTION to
the checkpoint's files. ACTION is NAME[:ARG] from :data:`ACTIONS`; or ``hang:SUBSTRING``:
a write to a key containing SUBSTRING, after its first block, never returns (a mount that
stopped answering); ``stop:SUBSTRING``: that write stops its process instead (SIGSTOP);
``gil-hang:SUBSTRING``: that write blocks in a C call that holds the GIL (no Python thread
of the process runs, its own stall watch included);
``hang-read:SUBSTRING`` and ``stop-read:SUBSTRING``: the same for the restore's reads
(the first process there writes RESULTS.blocked first, for the test to wait on);
``die-holding-locks``: the first process to evict the checkpoint takes every
multiprocessing lock it can reach (as a rank killed inside a collective or a queue's put
would hold them) and kills itself (SIGKILL).

    python tests/adversarial/sabotage_run.py ACTION -- restore RESTORE ARGS...

runs `ckptbench restore` instead, with the same actions on its reads.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import multiprocessing.queues
import multiprocessing.synchronize
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ckptbench import measure
from ckptbench.backends.base import PlannedReads
from ckptbench.cli import main
from ckptbench.formats.manifest import Manifest
from ckptbench.formats.manifest_encoding import encode_manifest


def _manifest(ckpt: Path) -> Path:
    return ckpt / ".metadata"


def _edit_manifest(edit: Callable[[Any], Any]) -> Callable[[Path, str], None]:
    def act(ckpt: Path, _arg: str) -> None:
        path = _manifest(ckpt)
        data = path.read_bytes()  # JSON, a newline, then padding to DCP's .metadata size
        edited = edit(Manifest.decode(data).fields)
        path.write_bytes(encode_manifest(edited, len(data)) if isinstance(edited, dict)
                         else json.dumps(edited).encode())
    return act


def _first_entry(m: dict[str, Any]) -> dict[str, Any]:
    return m["files"][sorted(m["files"])[0]]


def _drop_digests(m: dict[str, Any]) -> dict[str, Any]:
    del _first_entry(m)["digests"]
    return m


def _short_digests(m: dict[str, Any]) -> dict[str, Any]:
    _first_entry(m)["digests"].pop()
    return m


def _wrong_digest(m: dict[str, Any]) -> dict[str, Any]:
    _first_entry(m)["digests"][0] ^= 1
    return m


def _set_field(ckpt: Path, arg: str) -> None:
    """Rewrite one field of a JSON object file (ARG = 'path:field=json value'), e.g. an
    array's data_type in its zarr.json."""
    rel, _, assignment = arg.partition(":")
    name, _, value = assignment.partition("=")
    path = ckpt / rel
    doc = json.loads(path.read_text())
    doc[name] = json.loads(value)
    path.write_text(json.dumps(doc))


def _write(rel: str, data: bytes) -> Callable[[Path, str], None]:
    def act(ckpt: Path, arg: str) -> None:
        (ckpt / (arg or rel)).write_bytes(data)
    return act


def _unlink(ckpt: Path, arg: str) -> None:
    (ckpt / arg).unlink()


def _truncate(ckpt: Path, arg: str) -> None:
    """Cut a file to half its size (a copy or upload that stopped part way)."""
    path = ckpt / arg
    os.truncate(path, path.stat().st_size // 2)


def _die_holding_locks(_ckpt: Path, _arg: str) -> None:
    for obj in gc.get_objects():
        lock = None
        if isinstance(obj, multiprocessing.synchronize.Condition):
            lock = obj  # a Barrier's
        elif isinstance(obj, multiprocessing.queues.Queue):
            lock = obj._wlock  # type: ignore[attr-defined]
        if lock is not None:
            lock.acquire(False)
    os.kill(os.getpid(), signal.SIGKILL)


ACTIONS: dict[str, Callable[[Path, str], None]] = {
    "manifest-garbage": _write(".metadata", b"\x00\xffnot json{"),
    "manifest-list": _write(".metadata", b"[1, 2]"),
    "manifest-no-files": _edit_manifest(lambda m: {k: v for k, v in m.items() if k != "files"}),
    "manifest-no-digests": _edit_manifest(_drop_digests),
    "manifest-short-digests": _edit_manifest(_short_digests),
    "manifest-wrong-digest": _edit_manifest(_wrong_digest),
    "set-field": _set_field,
    "write": _write("", b"garbage{"),
    "unlink": _unlink,
    "truncate": _truncate,
    "die-holding-locks": _die_holding_locks,
}
IO_ACTIONS = ("hang", "stop", "gil-hang", "hang-read", "stop-read")


def _block(name: str, flag: Path) -> None:
    """A call that never returns (hang) or stops its process (stop); the first one says so
    in `flag`."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    if name.startswith("stop"):
        os.kill(os.getpid(), signal.SIGSTOP)
    if name.startswith("gil"):
        ctypes.PyDLL(None).sleep(3600)  # libc's sleep(3), the GIL held throughout
    threading.Event().wait()


class _Blocking:
    """A read handle whose reads after the first block never return (or stop)."""

    def __init__(self, inner: Any, name: str, flag: Path) -> None:
        self._inner, self._name, self._flag = inner, name, flag
        self._reads = 0

    def readinto(self, *args: Any) -> Any:
        self._reads += 1
        if self._reads > 1:
            _block(self._name, self._flag)
        return self._inner.readinto(*args)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)


class _Hanging:
    """A write handle whose writes after the first block never return (or stop)."""

    def __init__(self, inner: Any, name: str, flag: Path) -> None:
        self._inner, self._name, self._flag = inner, name, flag
        self._blocks = 0

    def write(self, data: memoryview) -> None:
        self._blocks += 1
        if self._blocks > 1:
            _block(self._name, self._flag)
        self._inner.write(data)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)


def _damage_once(root: Path, once: Path, name: str, act: Callable[[Path, str], None],
                 arg: str) -> None:
    """The first process to get here damages the newest checkpoint; the others wait until
    that is done, so none reads before it (on a loaded machine the first one can be
    descheduled between claiming the damage and doing it)."""
    done = once.with_name(once.name + ".done")
    try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return
    if name == "die-holding-locks":
        done.touch()  # the process dies in it: nothing for the others to wait for
    act(sorted(root.glob("run-*/checkpoint-*"))[-1], arg)
    done.touch()


def install(action: str, once: Path, flag: Path) -> None:
    name, _, arg = action.partition(":")
    act = ACTIONS.get(name, _unlink)
    open_backend = measure.open_backend

    class Sabotaged:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, attr: str) -> Any:
            return getattr(self._inner, attr)

        def drop_cache(self, keys: list[str]) -> str:
            if name in IO_ACTIONS:
                return str(self._inner.drop_cache(keys))
            _damage_once(Path(self._inner.root), once, name, act, arg)
            return str(self._inner.drop_cache(keys))

        def open_write(self, key: str, size: int) -> Any:
            handle = self._inner.open_write(key, size)
            if name in ("hang", "stop", "gil-hang") and arg in key:
                return _Hanging(handle, name, flag)
            return handle

        def open_read(self, key: str) -> Any:
            return self._reading(key, self._inner.open_read(key))

        def open_read_planned(self, key: str, spans: Any) -> Any:
            if isinstance(self._inner, PlannedReads):
                return self._reading(key, self._inner.open_read_planned(key, spans))
            return self._reading(key, self._inner.open_read(key))

        def _reading(self, key: str, handle: Any) -> Any:
            if name in ("hang-read", "stop-read") and arg in key:
                return _Blocking(handle, name, flag)
            return handle

    def sabotaged(*args: Any, **kwargs: Any) -> Any:
        return Sabotaged(open_backend(*args, **kwargs))

    measure.open_backend = sabotaged  # type: ignore[assignment]  # run's and restore's


if __name__ == "__main__":
    action, rest = sys.argv[1], sys.argv[2:]
    rest = rest[1:] if rest[:1] == ["--"] else rest
    command = "restore" if rest[:1] == ["restore"] else "run"
    rest = rest[1:] if command == "restore" else rest
    results = rest[rest.index("--results") + 1]
    install(action, Path(results + ".sabotaged"), Path(results + ".blocked"))
    sys.exit(main([command, *rest]))
