"""A careless user's shell: ckptbench started with a standard stream closed (`2>&-`,
`>&-`, `<&-`). The exit status must not change, and no file ckptbench opens may take the
closed stream's place (a results file at fd 2 is every rank's stderr)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.adversarial.helpers import ROOT, WORKLOADS

REDIRECTS = {"2>&-": "stderr closed", "2</etc/hostname": "stderr read-only (pyenv's shim, "
             "exec'd after 2>&-, leaves itself open there)", ">&-": "stdout closed",
             "<&-": "stdin closed", "<&- >&- 2>&-": "all three closed"}


def started_with(redirect: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m ckptbench ARGS` as a shell starts it with `redirect` (`2>&-`: fd 2
    closed at exec)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CKPTBENCH_PROGRESS", None)
    command = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "ckptbench", *args))
    return subprocess.run(["bash", "-c", f"exec {command} {redirect}"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("redirect", list(REDIRECTS))
def test_a_closed_stream_changes_neither_the_status_nor_the_results(
        redirect: str, tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    proc = started_with(redirect, "run", str(WORKLOADS / "tiny.toml"), "--target",
                        str(tmp_path / "t"), "--results", str(results), cwd=tmp_path)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    lines = results.read_text().splitlines()
    assert lines and all(json.loads(line) for line in lines)  # nothing but the records
    assert {json.loads(line)["type"] for line in lines} >= {"run", "rank", "phase"}


def test_bad_input_with_stderr_closed_is_still_exit_2(tmp_path: Path) -> None:
    for redirect in ("2>&-", "2</etc/hostname"):
        proc = started_with(redirect, "cadence", "--save-seconds", "x", cwd=tmp_path)
        assert proc.returncode == 2, redirect


def test_no_file_ckptbench_opens_takes_a_closed_streams_place(tmp_path: Path) -> None:
    """The results file opened at fd 2 would be every rank's stderr: after the streams are
    made valid, the first file opened gets a descriptor above 2."""
    probe = ("import os, sys; from ckptbench.cli.streams import ensure_standard_streams; "
             "ensure_standard_streams(); f = open(sys.argv[1], 'w'); "
             "os.write(1, str(f.fileno()).encode())")
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "f")],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=60, check=False, preexec_fn=lambda: os.close(2))
    assert proc.returncode == 0 and int(proc.stdout) > 2, proc
