"""Starting and ending the external tools of the harness (minio, warp, fio, ckptbench).

Every process started here dies with the harness: it runs in a process group of its own
(so ending it ends whatever it forked, and a Ctrl-C at the terminal reaches the harness
only, which then ends the group), and on Linux it gets SIGKILL when the thread that
started it exits (PR_SET_PDEATHSIG), so even a harness killed with SIGKILL leaves no
server behind. Only groups this module started are ever signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ckptbench.errors import CkptbenchError

_PR_SET_PDEATHSIG = 1


class ToolError(CkptbenchError):
    """An external tool of the harness is missing or failed (one line, names the tool)."""


def go_bin_dir() -> Path:
    """`$(go env GOPATH)/bin` (without running go when GOPATH is set or go is missing)."""
    gopath = os.environ.get("GOPATH")
    if not gopath and shutil.which("go"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            gopath = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True,
                                    timeout=30, check=False).stdout.strip()
    return Path(gopath or Path.home() / "go").expanduser() / "bin"


def find_binary(name: str) -> str | None:
    """`name` on PATH, else in the Go bin directory (where .ci/setup builds minio and
    warp); None if neither has it."""
    found = shutil.which(name)
    if found:
        return found
    candidate = go_bin_dir() / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def require_binary(name: str) -> str:
    """find_binary, or a one-line ToolError saying how to get it."""
    found = find_binary(name)
    if not found:
        raise ToolError(f"no `{name}` binary on PATH or in $(go env GOPATH)/bin; "
                        "`bash .ci/setup` installs it")
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _death_signal() -> Callable[[], None] | None:
    """A preexec_fn asking the kernel to SIGKILL the child when its parent thread exits.

    PR_SET_PDEATHSIG follows the thread that forked, not the process, so it is only set
    from the main thread (a server started from a worker thread would otherwise die with
    that thread). prctl is looked up before the fork: the child only calls it.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def start(cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
          cwd: str | Path | None = None, stdout: int | IO[Any] | None = subprocess.PIPE,
          stderr: int | IO[Any] | None = subprocess.PIPE) -> subprocess.Popen[str]:
    """Popen in a new process group, with the death signal armed (see the module)."""
    return subprocess.Popen(
        list(cmd), env=None if env is None else dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
        stdout=stdout, stderr=stderr, text=True, start_new_session=True,
        preexec_fn=_death_signal())  # noqa: PLW1509 - prctl only, resolved before the fork


def stop(proc: subprocess.Popen[str], timeout: float = 15.0) -> None:
    """SIGTERM to the process's group, SIGKILL after `timeout` s; then reap it.

    The group is signalled only while its leader is not yet reaped, so its id cannot
    belong to anyone else.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    if proc.poll() is None:  # not even SIGKILL: do not return with it unreaped
        proc.wait()


@dataclass(frozen=True)
class Finished:
    """A tool run to its end: exit status, output, and the CPU seconds it used (user +
    system, with everything it forked and waited for)."""

    returncode: int
    stdout: str
    stderr: str
    cpu_seconds: float

    def tail(self, chars: int = 400) -> str:
        """The end of stderr (or stdout when stderr is empty), for a one-line error."""
        return " ".join((self.stderr.strip() or self.stdout.strip() or "no output")[-chars:].split())


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None, timeout: float | None = None) -> Finished:
    """Run a tool to its end and capture its output. If the harness is interrupted
    (Ctrl-C, SIGTERM turned into SystemExit, a timeout), the tool's group is ended first.

    The CPU figure is the growth of this process's waited-for children's usage, so it is
    exact when one tool runs at a time, as the side-by-side benchmarks run them.
    """
    cpu0 = _children_cpu()
    proc = start(cmd, env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop(proc, timeout=5.0)
        raise
    return Finished(proc.returncode, out, err, _children_cpu() - cpu0)


def sweep_dir_argument(prog: str, doc: str | None, argv: list[str] | None) -> Path:
    """The DIR of a harness's sweep command line (`python -m harness.X DIR`): an existing
    directory, or a usage error."""
    import argparse

    ap = argparse.ArgumentParser(prog=prog, description=doc)
    ap.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    if not args.dir.is_dir():
        ap.error(f"dir: {args.dir} is not a directory")
    directory: Path = args.dir
    return directory
