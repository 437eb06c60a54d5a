"""The catalogue: exact parameter counts and torchtitan names."""

from __future__ import annotations

import pytest

from ckptbench.models import Role, model_tensors, parameter_count
from ckptbench.spec import parse_workload


def model(name: str, **kv):
    return parse_workload({"model": {"name": name, **kv}}).model


@pytest.mark.parametrize(
    ("name", "count"),
    [("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496),
     ("llama3.1-405b", 405_853_388_800)],
)
def test_llama3_parameter_counts_are_exact(name, count):
    assert parameter_count(model(name)) == count


def test_llama3_tensor_names_and_count():
    tensors = model_tensors(model("llama3-8b"))
    assert len(tensors) == 9 * 32 + 3
    names = [t.fqn for t in tensors]
    assert names[:3] == ["tok_embeddings.weight", "layers.0.attention.wq.weight",
                         "layers.0.attention.wk.weight"]
    assert names[-2:] == ["norm.weight", "output.weight"]
    shapes = {t.fqn: t.shape for t in tensors}
    assert shapes["layers.0.attention.wk.weight"] == (1024, 4096)
    assert shapes["layers.0.feed_forward.w2.weight"] == (4096, 14336)


def test_llama4_moe_layers_and_totals():
    scout = model("llama4-scout")
    maverick = model("llama4-maverick")
    # Text weights: ~107.8B (Scout, every layer MoE) and ~400B (Maverick, every 2nd layer).
    assert abs(parameter_count(scout) / 1e9 - 107.8) < 0.1
    assert abs(parameter_count(maverick) / 1e9 - 400.7) < 0.1
    mav = {t.fqn: t for t in model_tensors(maverick)}
    assert "layers.1.moe.experts.w1" in mav and "layers.0.feed_forward.w1.weight" in mav
    assert mav["layers.1.moe.experts.w1"].shape == (128, 5120, 8192)
    assert mav["layers.1.moe.experts.w2"].shape == (128, 8192, 5120)
    assert mav["layers.1.moe.router.gate.weight"].role is Role.REPLICATE
    assert mav["layers.1.moe.shared_experts.w2.weight"].role is Role.ROWWISE
