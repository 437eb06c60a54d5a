"""A restore's first-restore costs as named parts (runner.parts: setup, first_byte) on a
real MinIO: in the phase records, adding up to the phase, the last rank's own; in the
summary, the parts table and the job model's R (charged once per restore, not per byte)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ckptbench import jobmodel
from ckptbench.records import read_records
from ckptbench.report import view
from ckptbench.report.table import parts_grid
from ckptbench.runner.parts import RESTORE_PARTS
from harness import MinioServer

pytestmark = pytest.mark.s3

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "workloads" / "tiny.toml"


@pytest.fixture(scope="module")
def s3_run(minio_server: MinioServer, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("first-restore")
    results = tmp / "r.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "ckptbench", "run", str(TINY), "--target",
         f"s3://{minio_server.bucket}/first/{uuid.uuid4().hex[:8]}", "--endpoint-url",
         minio_server.endpoint, "--iterations", "2", "--results", str(results)],
        capture_output=True, text=True, timeout=300, cwd=tmp, env=minio_server.env())
    assert r.returncode == 0, r.stderr
    return list(read_records(results))


def test_the_restore_is_its_first_restore_parts(s3_run) -> None:
    its = {(i["iteration"], i["phase"]): i for i in view(s3_run, "x")["iterations"]}
    restores = [r for r in s3_run if r["type"] == "phase" and r["phase"] == "restore"]
    assert len(restores) == 2
    for rec in restores:
        parts = rec["parts"]
        assert tuple(parts) == RESTORE_PARTS
        assert all(v >= 0 for v in parts.values())
        assert parts["first_byte"] > 0 and parts["data"] > 0
        assert sum(parts.values()) == pytest.approx(its[(rec["iteration"], "restore")]["seconds"],
                                                    rel=1e-6, abs=1e-6)
        # the last rank's: its manifest read's end, its first data read's start and end
        it = rec["iteration"]
        ranks = [r for r in s3_run if r["type"] == "rank" and r["phase"] == "restore"
                 and r["iteration"] == it]
        last = max(ranks, key=lambda r: r["end_ns"])["rank"]
        ops = [o for o in s3_run if o["type"] == "op" and o["phase"] == "restore"
               and o["iteration"] == it and o["rank"] == last]
        first = min((o for o in ops if o["op"] == "read"), key=lambda o: o["start_ns"])
        manifest = max(o["end_ns"] for o in ops if o["op"] == "manifest")
        assert parts["first_byte"] == pytest.approx((first["end_ns"] - first["start_ns"]) / 1e9)
        assert parts["setup"] == pytest.approx((first["start_ns"] - manifest) / 1e9)


def test_the_first_restore_parts_in_the_summary_and_the_table(s3_run) -> None:
    summary = next(s for s in s3_run if s["type"] == "summary" and s["phase"] == "restore")
    assert tuple(summary["parts"]) == RESTORE_PARTS
    grid = parts_grid([view(s3_run, "x")])
    assert grid is not None
    names = [c.name for c in grid.columns]
    assert {"setup s", "first_byte s"} <= set(names)
    restore = next(r for r in grid.rows if r[0] == "restore")
    assert restore[names.index("first_byte s")] != "-"
    assert "first_byte: restore: the first data read's wait" in grid.notes[0]


def test_the_job_model_charges_the_first_restore_once(s3_run, tmp_path: Path) -> None:
    """R: the node rate from each rank's reads after its first one, plus the manifest,
    setup and first byte once (a job restarting pays them once, whatever its size)."""
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in s3_run))
    m = jobmodel.read_results(path)
    assert m.restore is not None and set(m.restore.parts) == set(RESTORE_PARTS)
    e = jobmodel.estimate(m, jobmodel.uniform("t", 10**9 * 8 * 100, 800, 8),
                          restart_overhead_s=0.0, restart_source="test", force=True)
    assert e.restore is not None
    assert set(e.restore.parts) == {"metadata", "metadata_fan_in", "setup", "first_byte"}
    assert e.restore.parts["first_byte"] == pytest.approx(m.restore.parts["first_byte"])
    assert e.restore.total_s == pytest.approx(e.restore.data_s + sum(e.restore.parts.values()))
