"""ckptbench.testing, what ships for testing a backend: importable from an installed
ckptbench (no repository files, no service harness), its tiny workload the repository's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ckptbench.spec import load_workload
from ckptbench.testing.conformance import tiny_workload

ROOT = Path(__file__).resolve().parent.parent


def test_tiny_workload_is_the_repository_one() -> None:
    shipped, repo = tiny_workload(), load_workload(ROOT / "workloads" / "tiny.toml")
    assert (shipped.model, shipped.state, shipped.parallel, shipped.checkpoint) == (
        repo.model, repo.state, repo.parallel, repo.checkpoint)


def test_imports_without_the_repository(tmp_path: Path) -> None:
    """From a directory outside the checkout, with only the package on the path: the
    suite and the fault wrappers load, and the harness is not reachable."""
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "ckptbench").symlink_to(ROOT / "ckptbench")
    code = ("import ckptbench.testing.conformance, ckptbench.testing.faults, importlib.util;"
            "print(importlib.util.find_spec('harness') is None)")
    out = subprocess.run([sys.executable, "-s", "-c", code], cwd=tmp_path, text=True,
                         capture_output=True, env={"PYTHONPATH": str(pkg)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
