"""`ckptbench run` whose checkpoint is damaged on disk between save and restore, or whose
storage stops answering (tests only).

    python tests/adversarial/sabotage_run.py ACTION -- RUN ARGS...

The real CLI in a real process, on a real local target: the backend the CLI opens is
wrapped so that, when the runner evicts the checkpoint from caches (after the manifest is
committed, before the restore starts), the first process to get there applies ACTION to
the checkpoint's files. ACTION is NAME[:ARG] from :data:`ACTIONS`; or ``hang:SUBSTRING``:
a write to a key containing SUBSTRING, after its first block, never returns (a mount that
stopped answering).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ckptbench.cli import main, run_cmd
from ckptbench.formats.manifest import encode_manifest, parse_manifest


def _manifest(ckpt: Path) -> Path:
    return ckpt / ".metadata"


def _edit_manifest(edit: Callable[[Any], Any]) -> Callable[[Path, str], None]:
    def act(ckpt: Path, _arg: str) -> None:
        path = _manifest(ckpt)
        data = path.read_bytes()  # JSON, a newline, then padding to DCP's .metadata size
        edited = edit(parse_manifest(data))
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
}


class _Hanging:
    """A write handle whose writes after the first block never return."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._blocks = 0

    def write(self, data: memoryview) -> None:
        self._blocks += 1
        if self._blocks > 1:
            threading.Event().wait()
        self._inner.write(data)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)


def install(action: str, once: Path) -> None:
    name, _, arg = action.partition(":")
    act = ACTIONS.get(name, _unlink)
    open_backend = run_cmd.open_backend

    class Sabotaged:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, attr: str) -> Any:
            return getattr(self._inner, attr)

        def drop_cache(self, keys: list[str]) -> str:
            if name == "hang":
                return str(self._inner.drop_cache(keys))
            try:  # the first process to get here damages the checkpoint, once
                os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                ckpts = sorted(Path(self._inner.root).glob("run-*/checkpoint-*"))
                act(ckpts[-1], arg)
            return str(self._inner.drop_cache(keys))

        def open_write(self, key: str, size: int) -> Any:
            handle = self._inner.open_write(key, size)
            return _Hanging(handle) if name == "hang" and arg in key else handle

    def sabotaged(*args: Any, **kwargs: Any) -> Any:
        return Sabotaged(open_backend(*args, **kwargs))

    run_cmd.open_backend = sabotaged  # type: ignore[assignment]


if __name__ == "__main__":
    action, rest = sys.argv[1], sys.argv[2:]
    rest = rest[1:] if rest[:1] == ["--"] else rest
    results = rest[rest.index("--results") + 1]
    install(action, Path(results + ".sabotaged"))
    sys.exit(main(["run", *rest]))
