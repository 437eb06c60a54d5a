"""The zarr and torch-dcp formats on S3 (the session's real MinIO server)."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path
from typing import Any

import pytest

from .conftest import ckptbench, records, summaries

pytestmark = pytest.mark.s3


def list_keys(minio: Any, prefix: str) -> list[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=minio.endpoint_url, region_name="us-east-1",
                          aws_access_key_id=minio.access_key, aws_secret_access_key=minio.secret_key)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=minio.bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


@pytest.mark.parametrize("codec", ["none", "zstd", "blosc:shuffle=bit,inner_chunks=2"])
def test_zarr_round_trip_on_minio(codec: str, minio: Any, s3_env: dict[str, str],
                                  bf16_workload: Path, tmp_path: Path) -> None:
    prefix = f"formats-{uuid.uuid4().hex[:8]}"
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(bf16_workload), "--target", f"s3://{minio.bucket}/{prefix}",
                  "--endpoint-url", minio.endpoint_url, "--format", "zarr", "--codec", codec,
                  "--payload", "realistic", "--iterations", "2", "--keep", "--results",
                  str(results), env=s3_env)
    assert r.returncode == 0, r.stderr
    phases = [x for x in records(results) if x["type"] == "phase" and x["phase"] == "restore"]
    assert len(phases) == 2 and all(p["verified"] for p in phases)
    s = summaries(results)
    assert s["save"]["stored_bytes"] > 0 and s["restore"]["stored_bytes"] == s["save"]["stored_bytes"]
    keys = list_keys(minio, prefix + "/")
    assert any(k.endswith("/model.tok_embeddings.weight/zarr.json") for k in keys)
    assert any("/model.tok_embeddings.weight/c/0/0" in k for k in keys)
    assert any(k.endswith("/.metadata") for k in keys)  # ckptbench's manifest
    assert minio.secret_key not in r.stdout + r.stderr + results.read_text()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
@pytest.mark.skipif(importlib.util.find_spec("s3fs") is None, reason="s3fs not installed")
def test_torch_dcp_round_trip_on_minio(minio: Any, s3_env: dict[str, str], bf16_workload: Path,
                                       tmp_path: Path) -> None:
    prefix = f"formats-{uuid.uuid4().hex[:8]}"
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(bf16_workload), "--target", f"s3://{minio.bucket}/{prefix}",
                  "--endpoint-url", minio.endpoint_url, "--format", "torch-dcp",
                  "--keep", "--results", str(results), env=s3_env)
    assert r.returncode == 0, r.stderr
    phases = [x for x in records(results) if x["type"] == "phase" and x["phase"] == "restore"]
    assert phases and all(p["verified"] for p in phases)
    keys = list_keys(minio, prefix + "/")
    assert any(k.endswith("/dcp/.metadata") for k in keys)
    assert any(k.endswith("/dcp/__0_0.distcp") for k in keys)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
@pytest.mark.skipif(importlib.util.find_spec("s3torchconnector") is None,
                    reason="s3torchconnector not installed")
def test_torch_dcp_through_s3torchconnector_on_minio(minio: Any, s3_env: dict[str, str],
                                                     bf16_workload: Path, tmp_path: Path) -> None:
    """The path PyTorch users run on S3: DCP's S3StorageWriter/Reader from s3torchconnector
    (Mountpoint's client), at the run's endpoint; every chunk verified after the load, the
    transport recorded, no secret in the output."""
    prefix = f"formats-{uuid.uuid4().hex[:8]}"
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(bf16_workload), "--target", f"s3://{minio.bucket}/{prefix}",
                  "--endpoint-url", minio.endpoint_url, "--format", "torch-dcp",
                  "--s3-transport", "s3torchconnector", "--iterations", "2", "--keep",
                  "--results", str(results), env=s3_env)
    assert r.returncode == 0, r.stderr
    recs = records(results)
    phases = [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]
    assert len(phases) == 2 and all(p["verified"] and p["mismatched_chunks"] == 0 for p in phases)
    run = next(x for x in recs if x["type"] == "run")
    assert '"transport": "s3torchconnector"' in str(run).replace("'", '"')
    keys = list_keys(minio, prefix + "/")
    assert any(k.endswith("/dcp/.metadata") for k in keys)
    assert any(k.endswith("/dcp/__0_0.distcp") for k in keys)
    assert minio.secret_key not in r.stdout + r.stderr + results.read_text()


def test_s3torchconnector_with_a_format_of_ckptbenchs_own_is_one_line(
        minio: Any, s3_env: dict[str, str], bf16_workload: Path, tmp_path: Path) -> None:
    """s3torchconnector is DCP's storage layer: the raw and zarr formats, which move their
    bytes through the backend, are refused before anything is created."""
    prefix = f"formats-{uuid.uuid4().hex[:8]}"
    for fmt in ("raw", "zarr"):
        r = ckptbench("run", str(bf16_workload), "--target", f"s3://{minio.bucket}/{prefix}",
                      "--endpoint-url", minio.endpoint_url, "--format", fmt,
                      "--s3-transport", "s3torchconnector", env=s3_env)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "--s3-transport s3torchconnector" in lines[0]
        assert "--format torch-dcp" in lines[0] and "Traceback" not in r.stderr
    assert list_keys(minio, prefix + "/") == []
