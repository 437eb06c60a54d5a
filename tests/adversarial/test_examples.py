"""The shipped job scripts as a careless (or hostile) user's environment drives them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.adversarial.helpers import ROOT

SCRIPT = ROOT / "examples" / "slurm" / "local-nvme.sbatch"


@pytest.mark.parametrize("value", ["a[$(touch PWNED)]", "0", "-1", "2 + 2", "99999"])
def test_local_nvme_checks_ranks_per_node_before_any_arithmetic(value: str,
                                                                tmp_path: Path) -> None:
    """RANKS_PER_NODE reaches $((...)), which evaluates a subscripted name's command
    substitution: the script refuses anything but an integer before that, in one line."""
    env = {**os.environ, "RANKS_PER_NODE": value, "TARGET": str(tmp_path / "t"),
           "RESULTS": str(tmp_path / "r"), "SLURM_NODEID": "0", "PATH": os.environ["PATH"]}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc
    assert "RANKS_PER_NODE" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "r").exists()
