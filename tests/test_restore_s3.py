"""Restores onto another layout on S3 (a real MinIO): the DCP restore plan's ranged GETs,
verified chunk by chunk, and `ckptbench restore` of a checkpoint kept in a bucket."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import pytest

from harness import MinioServer
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


def _kept_checkpoint(server: MinioServer, tmp_path: Path) -> tuple[str, str]:
    """A tiny checkpoint saved and kept in the bucket: (its target URL, its key prefix)."""
    prefix = f"kept/{uuid.uuid4().hex[:8]}"
    target = f"s3://{server.bucket}/{prefix}"
    r = ckptbench("run", str(TINY), "--target", target, "--endpoint-url", server.endpoint,
                  "--keep", "--no-restore", "--results", str(tmp_path / "save.jsonl"),
                  env=server.env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_id = load(tmp_path / "save.jsonl")[0]["run_id"]
    return f"{target}/{run_id}/checkpoint-1", f"{prefix}/{run_id}/checkpoint-1"


def test_restore_command_on_a_checkpoint_kept_in_a_bucket(minio_server: MinioServer,
                                                          tmp_path: Path) -> None:
    url, prefix = _kept_checkpoint(minio_server, tmp_path)
    results = tmp_path / "again.jsonl"
    r = ckptbench("restore", url, "--endpoint-url",
                  minio_server.endpoint, "--restore-layout", "world_size=2,tp=1",
                  "--results", str(results), env=minio_server.env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    recs = load(results)
    (phase,) = [x for x in recs if x["type"] == "phase"]
    assert phase["phase"] == "restore" and phase["verified"]
    assert measured_reads(recs) == planned_reads({"world_size": 2, "tp": 1})
    keys = minio_server.list_keys(minio_server.bucket, prefix + "/")
    assert f"{prefix}/.metadata" in keys  # still kept


def test_each_reader_starts_its_next_files_gets_before_it_finishes_a_file(
        minio_server: MinioServer, tmp_path: Path) -> None:
    """Read-ahead across files: the next file a restore rank reads is opened before it
    is done with the current one, so its GETs start as the current file's leave room (no
    bandwidth drained at each file's end); every byte is still the plan's and verified."""
    url, _ = _kept_checkpoint(minio_server, tmp_path)
    results = tmp_path / "restore.jsonl"
    r = ckptbench("restore", url, "--endpoint-url", minio_server.endpoint, "--restore-layout",
                  "world_size=2,tp=1", "--results", str(results), env=minio_server.env(),
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    recs = load(results)
    (phase,) = [x for x in recs if x["type"] == "phase"]
    assert phase["verified"] and phase["mismatched_chunks"] == 0
    assert measured_reads(recs) == planned_reads({"world_size": 2, "tp": 1})
    early = 0
    for rank in (0, 1):
        ops = [x for x in recs if x["type"] == "op" and x["rank"] == rank
               and x["op"] in ("open", "close")]
        files = [x["file"] for x in ops if x["op"] == "open"]
        assert len(files) >= 2  # each restore rank reads chunks of several saved files
        for before, after in itertools.pairwise(files):
            closed = next(x["start_ns"] for x in ops if x["op"] == "close" and x["file"] == before)
            opened = next(x["end_ns"] for x in ops if x["op"] == "open" and x["file"] == after)
            early += opened <= closed
    assert early >= 2


def test_bytes_changed_in_the_bucket_fail_verification_read_in_place(
        minio_server: MinioServer, tmp_path: Path) -> None:
    """The planned restore verifies chunks in the read-ahead's own buffers (no copy): a
    byte changed in a stored object after the save is still a mismatched chunk, named."""
    url, prefix = _kept_checkpoint(minio_server, tmp_path)
    client = minio_server.client()
    key = f"{prefix}/__0_0.distcp"
    data = bytearray(client.get_object(Bucket=minio_server.bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF
    client.put_object(Bucket=minio_server.bucket, Key=key, Body=bytes(data))
    results = tmp_path / "restore.jsonl"
    r = ckptbench("restore", url, "--endpoint-url", minio_server.endpoint, "--restore-layout",
                  "world_size=2,tp=1", "--results", str(results), env=minio_server.env(),
                  cwd=tmp_path)
    assert r.returncode != 0
    assert "__0_0.distcp" in r.stderr and "Traceback" not in r.stderr
    (phase,) = [x for x in load(results) if x["type"] == "phase"]
    assert not phase["ok"] and phase["mismatched_chunks"] == 1


def test_a_subset_kept_in_a_bucket_restores_its_whole_plan(minio_server: MinioServer,
                                                           tmp_path: Path) -> None:
    """Ranks 0-1 saved and kept; restored onto 2 ranks they read ranks 2-3's chunks too,
    from fill-ins written as objects beside (never in) the kept checkpoint, then removed."""
    root = f"subset/{uuid.uuid4().hex[:8]}"
    target = f"s3://{minio_server.bucket}/{root}"
    r = ckptbench("run", str(TINY), "--target", target, "--endpoint-url", minio_server.endpoint,
                  "--ranks", "0-1", "--keep", "--no-restore", "--results",
                  str(tmp_path / "save.jsonl"), env=minio_server.env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_id = load(tmp_path / "save.jsonl")[0]["run_id"]
    before = minio_server.list_keys(minio_server.bucket, root + "/")
    results = tmp_path / "again.jsonl"
    r = ckptbench("restore", f"{target}/{run_id}/checkpoint-1", "--endpoint-url",
                  minio_server.endpoint, "--restore-world-size", "2", "--restore-layout", "tp=1",
                  "--results", str(results), env=minio_server.env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    recs = load(results)
    (phase,) = [x for x in recs if x["type"] == "phase"]
    assert phase["verified"] and phase["fill_in_files"] == ["__2_0.distcp", "__3_0.distcp"]
    assert measured_reads(recs) == planned_reads({"world_size": 2, "tp": 1})
    assert minio_server.list_keys(minio_server.bucket, root + "/") == before
