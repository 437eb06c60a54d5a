"""Restores without verification (RunOptions.verify=False, a diagnostic of the read path's
own ceiling) read every byte the restore plan reads, and their phase records say they are
unverified."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptbench.measure import build_request, measure

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("verify", [True, False])
def test_restore_phase_records_whether_it_verified(tmp_path: Path, verify: bool) -> None:
    req = build_request(ROOT / "workloads" / "tiny.toml", str(tmp_path / "t"), iterations=1,
                        verify=verify)
    results = tmp_path / "r.jsonl"
    measure(req, results)
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    phase = next(r for r in recs if r.get("type") == "phase" and r["phase"] == "restore")
    assert phase["ok"] is True and phase["verified"] is verify
    ranks = [r for r in recs if r.get("type") == "rank" and r["phase"] == "restore"]
    planned = phase["planned_read_bytes"]  # the DCP restore plan's reads (replicas too)
    assert planned > 0 and sum(r["bytes"] for r in ranks) == planned  # every byte was read


def test_no_verify_restoring_whole_files_reads_every_byte(tmp_path: Path) -> None:
    """`--restore-plan files` takes the same engine: more blocks per thread than its ring
    has buffers, each handed back unread (the whole-file path once stalled here: its
    drain never gave a buffer back)."""
    req = build_request(ROOT / "workloads" / "tiny.toml", str(tmp_path / "t"), iterations=1,
                        verify=False, restore_plan="files", block_size="64KiB",
                        stall_timeout="20s")
    results = tmp_path / "r.jsonl"
    measure(req, results)
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    phase = next(r for r in recs if r.get("type") == "phase" and r["phase"] == "restore")
    assert phase["ok"] is True and phase["verified"] is False
    saved = sum(r["bytes"] for r in recs if r.get("type") == "rank" and r["phase"] == "save")
    restored = [r for r in recs if r.get("type") == "rank" and r["phase"] == "restore"]
    assert saved > 0 and sum(r["bytes"] for r in restored) == saved  # every byte was read


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "ckptbench", "run", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd, check=False)


def test_no_verify_on_the_command_line_says_so_and_records_it(tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    r = _cli(str(ROOT / "workloads" / "tiny.toml"), "--target", str(tmp_path / "t"),
             "--no-verify", "--results", str(results), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "restores NOT verified: --no-verify" in r.stderr
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    phase = next(x for x in recs if x.get("type") == "phase" and x["phase"] == "restore")
    assert phase["verified"] is False and phase["ok"] is True
    assert next(x for x in recs if x.get("type") == "run")["options"]["verify"] is False


def test_no_verify_with_another_format_is_one_line(tmp_path: Path) -> None:
    r = _cli(str(ROOT / "workloads" / "tiny.toml"), "--target", str(tmp_path / "t"),
             "--no-verify", "--format", "zarr", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith(
        "--no-verify needs --format raw (--format zarr always verifies); allowed: drop "
        "--no-verify, or --format raw"), r.stderr
