"""Helpers of the adversarial suite for whole runs: the real CLI as a real process (started,
watched and signalled mid-run), what is left on a target, and which processes remain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "workloads"
TINY = WORKLOADS / "tiny.toml"
# The reproduction: 1.4 GiB per checkpoint on two ranks, a save of several seconds.
BIG = WORKLOADS / "llama3-8b-fsdp2-8.toml"
BIG_ARGS = ("--scale", "4", "--ranks", "0-1")

T = TypeVar("T")


def env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI process importing this checkout."""
    return {**(base if base is not None else os.environ), "PYTHONPATH": str(ROOT)}


def start(*args: str, cwd: Path, environ: dict[str, str] | None = None,
          prefix: tuple[str, ...] = (), new_session: bool = False) -> subprocess.Popen[str]:
    """`[prefix...] python -m ckptbench ARGS` started in the background."""
    return subprocess.Popen([*prefix, sys.executable, "-m", "ckptbench", *args], cwd=cwd,
                            env=environ or env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=new_session)


def run(*args: str, cwd: Path, environ: dict[str, str] | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], cwd=cwd,
                          env=environ or env(), capture_output=True, text=True, timeout=timeout,
                          check=False)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 120,
             proc: subprocess.Popen[str] | None = None, every: float = 0.02) -> T:
    """Poll `probe` until it returns something true; fail naming `what` (and the process's
    output when it ended first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            _out, err = proc.communicate()
            raise AssertionError(f"the run ended (rc {proc.returncode}) before {what}:\n{err[-3000:]}")
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def saving(target: Path, min_bytes: int = 1 << 20) -> Callable[[], Path | None]:
    """A probe: the run's checkpoint-1 directory once one of its files has `min_bytes`
    (the save is under way)."""
    def probe() -> Path | None:
        for ckpt in target.glob("run-*/checkpoint-1"):
            try:
                if any(p.is_file() and p.stat().st_size >= min_bytes for p in ckpt.rglob("*")):
                    return ckpt
            except FileNotFoundError:
                continue
        return None
    return probe


def tree(root: Path) -> list[str]:
    """Everything under `root`: files as relative paths, directories with a trailing '/'."""
    if not root.exists():
        return []
    out = []
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out.append(rel + "/" if p.is_dir() else rel)
    return out


def processes_mentioning(text: str) -> list[int]:
    """Live processes (not zombies) whose command line contains `text`: the ranks of a run
    are forks of the CLI process and carry its command line (and its unique target)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def children_of(pid: int) -> list[int]:
    """The direct children of `pid` (all its threads')."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids of `pids` still alive (not zombies) after waiting up to `seconds`."""
    deadline = time.monotonic() + seconds
    alive = pids
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def messages(text: str) -> list[str]:
    """ckptbench's own lines on stderr (errors and notes), not the banner or progress."""
    return [line for line in text.splitlines() if line.startswith("ckptbench:")]
