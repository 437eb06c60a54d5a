"""Fixtures of the format tests: workloads written on the fly, runs, and MinIO."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ckptbench.records import read_records

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "workloads" / "tiny.toml"


def ckptbench(*args: str, env: dict[str, str] | None = None, timeout: int = 600
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def summaries(path: Path) -> dict[str, dict[str, Any]]:
    return {r["phase"]: r for r in read_records(path) if r["type"] == "summary"}


def records(path: Path) -> list[dict[str, Any]]:
    return list(read_records(path))


def write_workload(path: Path, name: str, *, param_dtype: str = "float32", world_size: int = 4,
                   tp: int = 2, dim: int = 256, vocab: int = 1000, ffn: int = 688,
                   layers: int = 2, extra: str = "") -> Path:
    path.write_text(f"""
[workload]
name = "{name}"
[model]
name = "custom"
layers = {layers}
dim = {dim}
heads = 8
kv_heads = 4
ffn_dim = {ffn}
vocab_size = {vocab}
[state]
param_dtype = "{param_dtype}"
optimizer = "adamw"
optimizer_dtype = "float32"
[parallel]
world_size = {world_size}
layout = "fsdp2"
tp = {tp}
{extra}
""")
    return path


@pytest.fixture
def bf16_workload(tmp_path: Path) -> Path:
    """tiny, with bfloat16 weights (fp32 AdamW moments)."""
    return write_workload(tmp_path / "tiny-bf16.toml", "tiny-bf16", param_dtype="bfloat16")


@pytest.fixture(scope="session")
def minio(request: pytest.FixtureRequest) -> Any:
    """The session's MinIO as .endpoint_url, .bucket, .access_key, .secret_key.

    Adapter over tests/conftest.py's ``minio_server`` (S3 backend work in progress); remove
    it once a session fixture named ``minio`` with these attributes exists."""
    try:
        server = request.getfixturevalue("minio_server")
    except pytest.FixtureLookupError:
        pytest.skip("MinIO session fixture (tests/conftest.py: minio / minio_server) not "
                    "available yet: S3 round trips of the formats skipped")
    return SimpleNamespace(endpoint_url=server.endpoint, bucket=server.bucket,
                           access_key=server.access_key, secret_key=server.secret_key)


@pytest.fixture
def s3_env(minio: Any) -> dict[str, str]:
    """An environment whose boto3/s3fs standard chain reaches the MinIO (for subprocesses)."""
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                        "AWS_ENDPOINT_URL_S3")}
    env.update(AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key,
               AWS_DEFAULT_REGION="us-east-1")
    return env
