"""Shared fixtures: real files, real processes, a real MinIO server."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "workloads"


@pytest.fixture
def tiny_workload() -> Path:
    return WORKLOADS / "tiny.toml"
