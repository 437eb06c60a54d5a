"""Helpers of the adversarial suite's run tests: the real CLI in a real process (importing
this checkout), and what a clean failure looks like: one line on stderr, no traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "workloads" / "tiny.toml"
SABOTAGE = Path(__file__).resolve().parent / "sabotage_run.py"


def env(base: dict[str, str] | None = None) -> dict[str, str]:
    return {**(os.environ if base is None else base), "PYTHONPATH": str(ROOT)}


def ckptbench(*args: str, cwd: Path, timeout: float = 300,
              extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m ckptbench ARGS`."""
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env(extra_env))


def sabotaged(action: str, *args: str, cwd: Path, timeout: float = 300
              ) -> subprocess.CompletedProcess[str]:
    """`ckptbench run ARGS` whose checkpoint is damaged between save and restore
    (sabotage_run.py ACTION)."""
    return subprocess.run([sys.executable, str(SABOTAGE), action, "--", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env())


BANNER = re.compile(r"^\S+: \d+ of \d+ ranks, [0-9.]+ GiB per checkpoint, \d+ iteration")


def one_line(r: subprocess.CompletedProcess[str], rc: int, *needles: str) -> str:
    """The single error line of a failed run (exit status `rc`), holding every needle; the
    run's banner (stderr, before the run starts) is the only other line allowed."""
    lines = [line for line in r.stderr.splitlines()
             if line.strip() and not BANNER.match(line)]
    assert r.returncode == rc, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("ckptbench: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def refused_before_start(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    """`ckptbench run` of the tiny workload with `args` ends in one line holding `needles`
    (exit 2), quickly, and creates neither the target nor the results file."""
    results = tmp_path / "r.jsonl"
    start = time.monotonic()
    r = ckptbench("run", str(TINY), "--target", str(tmp_path / "t"), "--results", str(results),
                  *args, cwd=tmp_path, timeout=120)
    one_line(r, 2, *needles)
    assert time.monotonic() - start < 60
    assert not (tmp_path / "t").exists() and not results.exists()  # nothing was created
