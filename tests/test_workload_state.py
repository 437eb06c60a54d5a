"""Every workload file says which training state it saves and why, and the bytes per
parameter its dtypes give are the README's: torchtitan's FSDP2 default (fp32 params +
fp32 AdamW, 12) for the FSDP2 files, Megatron-DeepSpeed as DLIO writes it (fp16 params +
fp32 master, momentum, variance, 14) for the MLPerf ones (issue 19)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptbench.spec import DTYPE_BYTES, Workload, load_workload

WORKLOADS = Path(__file__).resolve().parent.parent / "workloads"
FILES = sorted(WORKLOADS.glob("*.toml"))


def bytes_per_parameter(w: Workload) -> int:
    s = w.state
    moments = 2 if s.optimizer == "adamw" else 0
    if w.parallel.layout == "megatron-deepspeed":  # DLIO's optimizer file: master + 2 moments
        return DTYPE_BYTES[s.param_dtype] + 3 * DTYPE_BYTES[s.optimizer_dtype]
    master = 0 if s.master_dtype == "none" else DTYPE_BYTES[s.master_dtype]
    return DTYPE_BYTES[s.param_dtype] + master + moments * DTYPE_BYTES[s.optimizer_dtype]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_each_workload_states_its_state_and_why(path: Path) -> None:
    w = load_workload(path)
    expected = 14 if w.parallel.layout == "megatron-deepspeed" else 12
    assert bytes_per_parameter(w) == expected
    text = path.read_text()
    assert "# State: " in text and f"{expected} B/param" in text


def test_the_405b_job_saves_what_torchtitan_saves() -> None:
    """fp32 params + fp32 AdamW (was bf16 weights + fp32 moments, 10 B/param, which no
    common recipe saves): 12 B/param."""
    w = load_workload(WORKLOADS / "llama3.1-405b-tp8-pp16-fsdp-16384.toml")
    assert (w.state.param_dtype, w.state.master_dtype, w.state.optimizer_dtype) == \
        ("float32", "none", "float32")
