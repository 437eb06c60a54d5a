"""Backend tests: one conformance suite (conformance.py), subclassed per backend."""

from pathlib import Path

TINY = Path(__file__).resolve().parents[2] / "workloads" / "tiny.toml"
