"""Training state as DCP flattens it: which state-dict keys a parameter contributes.

``model.<fqn>`` in the weight dtype; with AdamW ``optim.state.<fqn>.step`` (a float32
scalar every holder of the parameter has), ``exp_avg`` and ``exp_avg_sq`` shaped like
the parameter; an optional fp32 master copy ``optim.state.<fqn>.master_param``.
Model keys come first, then optimizer keys parameter by parameter, as DCP flattens
``{"model": ..., "optim": ...}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.models import TensorDef
from ckptbench.spec import StateSpec

# Non-tensor entries DCP saves for an AdamW param group (pickled, tiny).
PARAM_GROUP_ITEMS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach",
                     "capturable", "differentiable", "fused", "decoupled_weight_decay", "params")


@dataclass(frozen=True)
class StateEntry:
    name: str
    dtype: str
    scalar: bool  # a 0-d tensor that every holder of the parameter holds


def model_entry(t: TensorDef, s: StateSpec) -> StateEntry:
    return StateEntry(f"model.{t.fqn}", s.param_dtype, False)


def optimizer_entries(t: TensorDef, s: StateSpec) -> list[StateEntry]:
    out: list[StateEntry] = []
    if s.optimizer == "adamw":
        base = f"optim.state.{t.fqn}"
        out += [
            StateEntry(f"{base}.step", "float32", True),
            StateEntry(f"{base}.exp_avg", s.optimizer_dtype, False),
            StateEntry(f"{base}.exp_avg_sq", s.optimizer_dtype, False),
        ]
    if s.master_dtype != "none":
        out.append(StateEntry(f"optim.state.{t.fqn}.master_param", s.master_dtype, False))
    return out
