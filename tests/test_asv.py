"""The README's asv command works on a fresh checkout and a fresh machine (no
~/.asv-machine.json), and asv collects only the benchmarks, no helper function."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def readme_asv_command() -> str:
    """The asv line of the README's Benchmarks section, its comment left out."""
    text = (ROOT / "README.md").read_text()
    return next(line for line in text.splitlines() if line.startswith("asv ")).split("#")[0].strip()


def fresh_checkout(dest: Path) -> Path:
    """The working tree's files (tracked and new, ignored ones left out) in a new git
    repository: what a clone of this tree would hold."""
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "checkout"]):
        subprocess.run(git + cmd, cwd=dest, check=True, capture_output=True)
    return dest


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("asv") is None, reason="asv is a test extra: pip install -e .[test]")
def test_readme_asv_command_runs_on_a_fresh_checkout_and_collects_no_helper(tmp_path: Path) -> None:
    command = readme_asv_command()
    assert command.startswith("asv machine --yes && asv run --python=same")
    src = fresh_checkout(tmp_path / "src")
    home = tmp_path / "home"  # a machine asv has never seen
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(src)}
    # One quick benchmark keeps the test short; discovery still imports every module.
    done = subprocess.run(["bash", "-c", f"{command} --bench Payload"], cwd=src, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Payload.track_generate_gbps" in done.stdout and "failed" not in done.stdout
    collected = set(json.loads((src / ".asv" / "results" / "benchmarks.json").read_text())) - {"version"}
    assert "bench_ckptbench.SaveRestore.track_save" in collected
    assert {n for n in collected if not n.startswith("bench_ckptbench.")} == set()
