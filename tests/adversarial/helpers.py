"""The adversarial suite's helpers: the real CLI in a real process, and what a clean
refusal looks like (one line on stderr naming the field or path, exit 2, no traceback)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "workloads"


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str


def ckptbench(*args: str, cwd: Path | None = None, timeout: float = 60,
              memory_limit: int | None = None) -> Result:
    """`python -m ckptbench ARGS` in a fresh process importing this checkout; with
    `memory_limit`, its address space is capped (a runaway read fails, not the machine)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def limit() -> None:
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    proc = subprocess.run([sys.executable, "-m", "ckptbench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          preexec_fn=limit)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_refused(result: Result, *needles: str) -> str:
    """Exit 2, exactly one line on stderr, no traceback, and every needle in that line."""
    lines = result.err.strip().splitlines()
    assert result.rc == 2, f"rc {result.rc}, stderr: {result.err[-2000:]}"
    assert "Traceback" not in result.err
    assert len(lines) == 1, result.err
    line = lines[0]
    assert line.startswith("ckptbench: error: "), line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line
