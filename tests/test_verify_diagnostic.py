"""Restores without verification (RunOptions.verify=False, a diagnostic of the read path's
own ceiling) read every byte the restore plan reads, and their phase records say they are
unverified."""

from __future__ import annotations

import json
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
