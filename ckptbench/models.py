"""The model catalogue as named tensors with shapes, in torchtitan's names and order.

Each tensor carries the *role* that decides how tensor parallelism splits it
(torchtitan's Llama plan), the layer it belongs to (for pipeline stages) and whether it
holds routed experts (for expert parallelism). Nothing here knows about sharding.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ckptbench.spec import ModelSpec


class Role(Enum):
    """How tensor parallelism splits a tensor (torchtitan's plan)."""

    COLWISE = "colwise"  # nn.Linear weight [out, in], split on dim 0 (wq, wk, wv, w1, w3, output)
    ROWWISE = "rowwise"  # split on dim 1 (wo, w2)
    VOCAB = "vocab"  # tok_embeddings: RowwiseParallel on the embedding shards dim 0 (vocab)
    REPLICATE = "replicate"  # norms, router gate
    EXPERT_COLWISE = "expert_colwise"  # stacked experts w1/w3 [E, dim, hidden], split on dim 2
    EXPERT_ROWWISE = "expert_rowwise"  # stacked experts w2 [E, hidden, dim], split on dim 1

    @property
    def tp_dim(self) -> int | None:
        return _TP_DIM[self]

    @property
    def routed_experts(self) -> bool:
        return self in (Role.EXPERT_COLWISE, Role.EXPERT_ROWWISE)


_TP_DIM = {
    Role.COLWISE: 0, Role.ROWWISE: 1, Role.VOCAB: 0, Role.REPLICATE: None,
    Role.EXPERT_COLWISE: 2, Role.EXPERT_ROWWISE: 1,
}


@dataclass(frozen=True)
class TensorDef:
    fqn: str
    shape: tuple[int, ...]
    role: Role
    layer: int | None  # None for embeddings, final norm, output
    position: str = "layer"  # "first" (embeddings), "layer", "last" (norm, output)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _ffn(prefix: str, layer: int, dim: int, hidden: int) -> list[TensorDef]:
    return [
        TensorDef(f"{prefix}.w1.weight", (hidden, dim), Role.COLWISE, layer),
        TensorDef(f"{prefix}.w2.weight", (dim, hidden), Role.ROWWISE, layer),
        TensorDef(f"{prefix}.w3.weight", (hidden, dim), Role.COLWISE, layer),
    ]


def model_tensors(m: ModelSpec) -> list[TensorDef]:
    """All parameters of the model, in module registration order (= state-dict order)."""
    hd = m.resolved_head_dim
    q_out, kv_out = m.heads * hd, m.kv_heads * hd
    out: list[TensorDef] = [
        TensorDef("tok_embeddings.weight", (m.vocab_size, m.dim), Role.VOCAB, None, "first")
    ]
    for i in range(m.layers):
        p = f"layers.{i}"
        out += [
            TensorDef(f"{p}.attention.wq.weight", (q_out, m.dim), Role.COLWISE, i),
            TensorDef(f"{p}.attention.wk.weight", (kv_out, m.dim), Role.COLWISE, i),
            TensorDef(f"{p}.attention.wv.weight", (kv_out, m.dim), Role.COLWISE, i),
            TensorDef(f"{p}.attention.wo.weight", (m.dim, q_out), Role.ROWWISE, i),
        ]
        if m.is_moe_layer(i):
            e, h = m.experts, m.moe_ffn_dim
            out += [
                TensorDef(f"{p}.moe.experts.w1", (e, m.dim, h), Role.EXPERT_COLWISE, i),
                TensorDef(f"{p}.moe.experts.w2", (e, h, m.dim), Role.EXPERT_ROWWISE, i),
                TensorDef(f"{p}.moe.experts.w3", (e, m.dim, h), Role.EXPERT_COLWISE, i),
                TensorDef(f"{p}.moe.router.gate.weight", (e, m.dim), Role.REPLICATE, i),
            ]
            if m.shared_experts:
                out += _ffn(f"{p}.moe.shared_experts", i, m.dim, h * m.shared_experts)
        else:
            out += _ffn(f"{p}.feed_forward", i, m.dim, m.ffn_dim)
        out += [
            TensorDef(f"{p}.attention_norm.weight", (m.dim,), Role.REPLICATE, i),
            TensorDef(f"{p}.ffn_norm.weight", (m.dim,), Role.REPLICATE, i),
        ]
    out += [
        TensorDef("norm.weight", (m.dim,), Role.REPLICATE, None, "last"),
        TensorDef("output.weight", (m.vocab_size, m.dim), Role.COLWISE, None, "last"),
    ]
    return out


def parameter_count(m: ModelSpec) -> int:
    return sum(t.numel for t in model_tensors(m))
