"""`ckptbench run` with a hostile neighbour acting at a known point of the run (tests only).

    python tests/adversarial/hooked_run.py ACTION:ARG -- RUN ARGS...

The real CLI in a real process, on a real local target. The backend the CLI opens is
wrapped so that ACTION happens at a point of the run's lifecycle, not after a sleep:

plant:VICTIM      when the run creates checkpoint-1's directory, checkpoint-2 is planted as
                  a symbolic link to VICTIM (before the run makes it)
swap:VICTIM       after the commit of the last checkpoint, before its restore: that
                  directory is moved aside and a symbolic link to VICTIM put in its place
plain:-           the same, but a plain directory holding files of the same names is put
                  in its place
kill:N            after the commit of checkpoint-N: the run is SIGKILLed (debris is left)
pause:DIR         after the commit of checkpoint-1: DIR/paused is made, and the run waits
                  until DIR/go exists
vanish:NAME       as soon as checkpoint-1's file NAME is written and closed, it is deleted
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ckptbench import measure
from ckptbench.cli import main

AT_COMMIT = ("swap", "plain", "kill", "pause")


def _last_checkpoint(root: Path) -> Path:
    found = [p for p in root.glob("run-*/checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return max(found, key=lambda p: int(p.name.split("-")[-1]))


def _once(flag: Path) -> bool:
    """True for the first process of the run to get here."""
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _at_commit(name: str, arg: str, root: Path) -> None:
    ckpt = _last_checkpoint(root)
    if name == "kill":
        if ckpt.name == f"checkpoint-{arg}":
            os.kill(os.getppid(), signal.SIGKILL)  # the CLI process; its ranks die with it
            time.sleep(60)
        return
    if name == "pause":
        Path(arg, "paused").touch()
        deadline = time.monotonic() + 300
        while not Path(arg, "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return
    moved = ckpt.with_name(ckpt.name + ".moved")
    ckpt.rename(moved)
    if name == "swap":
        ckpt.symlink_to(arg, target_is_directory=True)
    else:
        ckpt.mkdir()
        for f in moved.iterdir():
            (ckpt / f.name).write_bytes(b"planted: not the run's")


class _Vanishing:
    """A write handle whose file is deleted (by someone else) as soon as it is closed."""

    def __init__(self, inner: Any, path: Path) -> None:
        self._inner, self._path = inner, path

    def close(self) -> None:
        self._inner.close()
        self._path.unlink()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)


def install(action: str, results: str) -> None:
    name, _, arg = action.partition(":")
    open_backend = measure.open_backend

    class Hooked:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, attr: str) -> Any:
            return getattr(self._inner, attr)

        def create_dir(self, key: str) -> Any:
            ident = self._inner.create_dir(key)
            if name == "plant" and key.endswith("/checkpoint-1"):
                (Path(self._inner.root) / key).with_name("checkpoint-2").symlink_to(
                    arg, target_is_directory=True)
            return ident

        def open_write(self, key: str, size: int) -> Any:
            handle = self._inner.open_write(key, size)
            if name == "vanish" and key.endswith(f"checkpoint-1/{arg}"):
                return _Vanishing(handle, Path(self._inner.root) / key)
            return handle

        def drop_cache(self, keys: list[str]) -> str:
            root = Path(self._inner.root)
            if name in AT_COMMIT:
                ckpt = _last_checkpoint(root)
                if _once(Path(f"{results}.hook-{ckpt.name}")):
                    _at_commit(name, arg, root)
            return str(self._inner.drop_cache(keys))

    def hooked(*args: Any, **kwargs: Any) -> Any:
        return Hooked(open_backend(*args, **kwargs))

    measure.open_backend = hooked  # type: ignore[assignment]


if __name__ == "__main__":
    action, rest = sys.argv[1], sys.argv[2:]
    rest = rest[1:] if rest[:1] == ["--"] else rest
    install(action, rest[rest.index("--results") + 1])
    sys.exit(main(["run", *rest]))
