"""Fixtures of the adversarial suite."""

from __future__ import annotations

import pytest

from .helpers import WORKLOADS


@pytest.fixture
def tiny_text() -> str:
    """The shipped tiny workload's text, for variations on it."""
    return (WORKLOADS / "tiny.toml").read_text()
