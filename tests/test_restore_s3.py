"""Restores onto another layout on S3 (a real MinIO): the DCP restore plan's ranged GETs,
verified chunk by chunk, and `ckptbench restore` of a checkpoint kept in a bucket."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ckptbench.testing import MinioServer
from tests.runner.test_restore_run import measured_reads, planned_reads
from tests.test_s3_run import TINY, assert_no_secrets, ckptbench, load

pytestmark = pytest.mark.s3


def test_tiny_restored_onto_fsdp2_and_hsdp_on_minio(minio_server: MinioServer,
                                                     tmp_path: Path) -> None:
    prefix = f"restore/{uuid.uuid4().hex[:8]}"
    target = f"s3://{minio_server.bucket}/{prefix}"
    for layout, overrides in (("world_size=2,tp=1", {"world_size": 2, "tp": 1}),
                              ("world_size=8,dp_replicate=2", {"world_size": 8, "dp_replicate": 2})):
        results = tmp_path / f"{overrides['world_size']}.jsonl"
        r = ckptbench("run", str(TINY), "--target", target, "--endpoint-url",
                      minio_server.endpoint, "--results", str(results), "--restore-layout",
                      layout, env=minio_server.env(), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert_no_secrets(minio_server, r.stdout, r.stderr, results.read_text())
        recs = load(results)
        (phase,) = [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]
        assert phase["verified"] and phase["mismatched_chunks"] == 0
        assert measured_reads(recs) == planned_reads(overrides)
    assert minio_server.list_keys(minio_server.bucket, prefix + "/") == []


def test_restore_command_on_a_checkpoint_kept_in_a_bucket(minio_server: MinioServer,
                                                          tmp_path: Path) -> None:
    prefix = f"kept/{uuid.uuid4().hex[:8]}"
    target = f"s3://{minio_server.bucket}/{prefix}"
    r = ckptbench("run", str(TINY), "--target", target, "--endpoint-url", minio_server.endpoint,
                  "--keep", "--no-restore", "--results", str(tmp_path / "save.jsonl"),
                  env=minio_server.env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_id = load(tmp_path / "save.jsonl")[0]["run_id"]
    results = tmp_path / "again.jsonl"
    r = ckptbench("restore", f"{target}/{run_id}/checkpoint-1", "--endpoint-url",
                  minio_server.endpoint, "--restore-layout", "world_size=2,tp=1",
                  "--results", str(results), env=minio_server.env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    recs = load(results)
    (phase,) = [x for x in recs if x["type"] == "phase"]
    assert phase["phase"] == "restore" and phase["verified"]
    assert measured_reads(recs) == planned_reads({"world_size": 2, "tp": 1})
    keys = minio_server.list_keys(minio_server.bucket, prefix + "/")
    assert any(k.endswith(f"{run_id}/checkpoint-1/.metadata") for k in keys)  # still kept
