"""Workload files: the schema, its defaults and its validation.

A workload says *what* is checkpointed (model, training state) and *how it is laid
out* (parallel layout, file grouping). It knows nothing of backends, bytes on disk,
processes or clocks. Every validation error names the TOML key and what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptbench import tierspec
from ckptbench.errors import SpecError
from ckptbench.fields import allowed, choice_field, int_field, read_toml, shown

DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}

LAYOUTS = ("fsdp2", "megatron-deepspeed")
FILE_GROUPINGS = ("dcp", "per-chunk", "per-rank", "shared", "megatron")
STRIPE_ALIGN = 4096  # stripe_size must be a multiple: shared-file regions stay O_DIRECT-aligned
OPTIMIZERS = ("adamw", "none")
RESTORE_KEYS = ("world_size", "tp", "pp", "dp_replicate", "ep")

# A workload name becomes part of a file name (results/<name>-<run id>.jsonl): a plain
# file-name-safe word, never a path.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
NAME_ALLOWED = "1-128 letters, digits, '.', '_', '+' or '-', starting with a letter or digit"
# Workload files are small TOML tables; anything bigger (or not a regular file: a FIFO,
# /dev/zero) is a mistake that must not block or fill memory.
MAX_WORKLOAD_FILE_BYTES = 1 << 20
# Upper bounds that keep planning to seconds (the Llama 3 cluster is 16,384 ranks and the
# largest real models have ~130 layers); ckptbench.plan.bounds bounds their product.
MAX_WORLD_SIZE = 1 << 20
MAX_LAYERS = 4096
MAX_FILE_THREADS = 1024


@dataclass(frozen=True)
class ModelSpec:
    """Dimensions of a decoder-only transformer (dense or mixture-of-experts)."""

    name: str
    layers: int
    dim: int
    heads: int
    kv_heads: int
    ffn_dim: int
    vocab_size: int
    head_dim: int = 0  # 0: dim // heads
    experts: int = 0  # routed experts per MoE layer; 0 = dense model
    moe_ffn_dim: int = 0
    shared_experts: int = 0
    moe_every: int = 1  # every n-th layer is MoE (layers n-1, 2n-1, ...)

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.dim // self.heads

    def is_moe_layer(self, layer: int) -> bool:
        return self.experts > 0 and layer % self.moe_every == self.moe_every - 1


@dataclass(frozen=True)
class StateSpec:
    """What the training state holds per parameter, and in which dtypes."""

    param_dtype: str = "float32"
    master_dtype: str = "none"  # an fp32 master copy beside low-precision weights
    optimizer: str = "adamw"
    optimizer_dtype: str = "float32"


@dataclass(frozen=True)
class ParallelSpec:
    """The parallel layout: how many ranks and how the mesh is split."""

    world_size: int = 1
    layout: str = "fsdp2"
    tp: int = 1
    pp: int = 1
    dp_replicate: int = 1
    ep: int = 1
    zero_stage: int = 3  # megatron-deepspeed only

    @property
    def dp_shard(self) -> int:
        """The FSDP shard degree: what remains of the world after tp, pp and replicas."""
        return self.world_size // (self.tp * self.pp * self.dp_replicate)

    @property
    def dp(self) -> int:
        """Data-parallel degree (replicas x shards)."""
        return self.world_size // (self.tp * self.pp)

    @property
    def label(self) -> str:
        """The layout as --restore-layout takes it: world_size and the degrees above 1."""
        parts = [f"world_size={self.world_size}"]
        parts += [f"{k}={getattr(self, k)}" for k in ("tp", "pp", "dp_replicate", "ep")
                  if getattr(self, k) != 1]
        return ",".join(parts)


@dataclass(frozen=True)
class CheckpointSpec:
    """How the chunks become files or objects."""

    files: str = "dcp"  # dcp | per-chunk | per-rank | shared | megatron
    threads: int = 1  # DCP writer threads: data files per rank
    # shared (N-1): each rank's region starts at a multiple of stripe_size; on Lustre and
    # BeeGFS also the stripe (chunk) size set when stripe_count != 0.
    stripe_size: int = 1 << 20
    stripe_count: int = 0  # 0: leave the file system's layout alone; -1: all targets


@dataclass(frozen=True)
class Workload:
    name: str
    model: ModelSpec
    state: StateSpec = field(default_factory=StateSpec)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    description: str = ""
    # The layout the job restarts with; None: the training layout (``parallel``).
    restore: ParallelSpec | None = None
    tiers: tierspec.TiersSpec = field(default_factory=tierspec.TiersSpec)  # [tiers]

    @property
    def restore_parallel(self) -> ParallelSpec:
        """The restore layout, resolved (the training layout when none was given)."""
        return self.restore or self.parallel

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- the catalogue of real models (dimensions from the model cards and reference code) ---

_LLAMA3_COMMON = dict(head_dim=128, kv_heads=8, vocab_size=128_256)
PRESETS: dict[str, dict[str, Any]] = {
    "llama3-8b": dict(layers=32, dim=4096, heads=32, ffn_dim=14_336, **_LLAMA3_COMMON),
    "llama3-70b": dict(layers=80, dim=8192, heads=64, ffn_dim=28_672, **_LLAMA3_COMMON),
    "llama3.1-405b": dict(layers=126, dim=16_384, heads=128, ffn_dim=53_248, **_LLAMA3_COMMON),
    # Llama 4 (text weights): every layer MoE for Scout, every second for Maverick.
    "llama4-scout": dict(
        layers=48, dim=5120, heads=40, kv_heads=8, head_dim=128, ffn_dim=16_384,
        vocab_size=202_048, experts=16, moe_ffn_dim=8192, shared_experts=1, moe_every=1,
    ),
    "llama4-maverick": dict(
        layers=48, dim=5120, heads=40, kv_heads=8, head_dim=128, ffn_dim=16_384,
        vocab_size=202_048, experts=128, moe_ffn_dim=8192, shared_experts=1, moe_every=2,
    ),
}
ALIASES = {"llama3-405b": "llama3.1-405b", "llama3.1-8b": "llama3-8b", "llama3.1-70b": "llama3-70b"}
MODEL_NAMES = (*PRESETS, "custom")

_MODEL_INT_KEYS = (
    "layers", "dim", "heads", "kv_heads", "ffn_dim", "vocab_size", "head_dim",
    "experts", "moe_ffn_dim", "shared_experts", "moe_every",
)
_CUSTOM_REQUIRED = ("layers", "dim", "heads", "kv_heads", "ffn_dim", "vocab_size")
_SECTIONS: dict[str, tuple[str, ...]] = {
    "workload": ("name", "description"),
    "model": ("name", *_MODEL_INT_KEYS),
    "state": ("param_dtype", "master_dtype", "optimizer", "optimizer_dtype"),
    "parallel": ("world_size", "layout", "tp", "pp", "dp_replicate", "ep", "zero_stage"),
    "checkpoint": ("files", "threads", "stripe_size", "stripe_count"),
    # The layout the job restarts with (DCP reshards onto it); each key defaults to
    # the training layout's value.
    "restore": RESTORE_KEYS,
    "tiers": tierspec.KEYS,
}


def _check_keys(table: Mapping[str, Any], section: str) -> None:
    for key in table:
        if key not in _SECTIONS[section]:
            raise SpecError(
                f"[{section}] unknown key {key!r}; allowed: {allowed(_SECTIONS[section])}"
            )


def _workload_name(meta: Mapping[str, Any], default: str) -> str:
    """[workload] name, or the file's stem: it names the results file, so never a path."""
    if "name" not in meta:
        return default
    value = meta["name"]
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise SpecError(f"[workload] name = {shown(value)} is not allowed; allowed: {NAME_ALLOWED}")
    return value


def _description(meta: Mapping[str, Any]) -> str:
    value = meta.get("description", "")
    if not isinstance(value, str):
        raise SpecError(f"[workload] description = {shown(value)} is not allowed; allowed: a "
                        "string")
    return value


def _model(table: Mapping[str, Any]) -> ModelSpec:
    _check_keys(table, "model")
    name = table.get("name")
    if not isinstance(name, str):
        raise SpecError(f"[model] name is required; allowed: {allowed(MODEL_NAMES)}")
    name = ALIASES.get(name, name)
    if name not in MODEL_NAMES:
        raise SpecError(f"[model] name = {name!r} is not a known model; allowed: {allowed(MODEL_NAMES)}")
    base: dict[str, Any] = dict(PRESETS.get(name, {}))
    if name == "custom":
        for key in _CUSTOM_REQUIRED:
            if key not in table:
                raise SpecError(f"[model] {key} is required for a custom model (an integer >= 1)")
    minimums = {"head_dim": 0, "experts": 0, "moe_ffn_dim": 0, "shared_experts": 0}
    maximums = {"layers": MAX_LAYERS}
    values: dict[str, int] = {}
    for key in _MODEL_INT_KEYS:
        if key in table or key in base:
            source = table if key in table else base
            values[key] = int_field(source, "model", key, minimum=minimums.get(key, 1),
                               maximum=maximums.get(key))
    spec = ModelSpec(name=name, **values)
    if spec.head_dim == 0 and spec.dim % spec.heads:
        raise SpecError(f"[model] heads = {spec.heads} must divide dim = {spec.dim} (or give head_dim)")
    if spec.heads % spec.kv_heads:
        raise SpecError(f"[model] kv_heads = {spec.kv_heads} must divide heads = {spec.heads}")
    if spec.experts and not spec.moe_ffn_dim:
        raise SpecError("[model] moe_ffn_dim is required when experts > 0 (an integer >= 1)")
    return spec


def _parallel(table: Mapping[str, Any], model: ModelSpec) -> ParallelSpec:
    _check_keys(table, "parallel")
    spec = ParallelSpec(
        world_size=int_field(table, "parallel", "world_size", 1, maximum=MAX_WORLD_SIZE),
        layout=choice_field(table, "parallel", "layout", LAYOUTS, "fsdp2"),
        tp=int_field(table, "parallel", "tp", 1),
        pp=int_field(table, "parallel", "pp", 1),
        dp_replicate=int_field(table, "parallel", "dp_replicate", 1),
        ep=int_field(table, "parallel", "ep", 1),
        zero_stage=int_field(table, "parallel", "zero_stage", 3, minimum=0),
    )
    return _check_layout(spec, model, "parallel")


def _restore(table: Mapping[str, Any], model: ModelSpec, training: ParallelSpec,
             section: str = "restore") -> ParallelSpec | None:
    """The [restore] layout: the keys of [parallel], each defaulting to the training
    layout's. None when it equals the training layout."""
    for key in table:
        if key not in RESTORE_KEYS:
            raise SpecError(f"[{section}] unknown key {key!r}; allowed: {allowed(RESTORE_KEYS)}")
    values: dict[str, Any] = {k: int_field(table, section, k, maximum=MAX_WORLD_SIZE)
                              for k in RESTORE_KEYS if k in table}
    spec = replace(training, **values)
    if spec == training:
        return None
    if training.layout == "megatron-deepspeed":
        raise SpecError(f"[{section}] a restore layout other than [parallel]'s needs layout"
                        " = 'fsdp2' (DLIO reads back the files each rank wrote); allowed: the"
                        " training layout")
    return _check_layout(spec, model, section)


def with_restore(workload: Workload, overrides: Mapping[str, int], option: str) -> Workload:
    """The workload with its restore layout's keys overridden (the CLI's options), checked
    like the [restore] table; errors name `option`."""
    if not overrides:
        return workload
    base = workload.restore_parallel
    table = {k: getattr(base, k) for k in RESTORE_KEYS}
    table.update(overrides)
    try:
        restore = _restore(table, workload.model, workload.parallel, section="restore")
    except SpecError as exc:
        raise SpecError(f"{option}: {exc}") from None
    return replace(workload, restore=restore)


def with_restore_layout(workload: Workload, world_size: int | None,
                        layout: str | None) -> Workload:
    """The workload with the restore layout options given applied (checked, one line)."""
    overrides = parse_layout_overrides(layout) if layout else {}
    if world_size is not None:
        overrides["world_size"] = world_size
    return with_restore(workload, overrides, "--restore-layout" if layout else "--restore-world-size")


def parse_layout_overrides(text: str, option: str = "--restore-layout") -> dict[str, int]:
    """'world_size=6,tp=2' -> {'world_size': 6, 'tp': 2} (keys of [restore])."""
    out: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        key = key.strip()
        if not sep or key not in RESTORE_KEYS:
            raise SpecError(f"{option} {text!r}: {part.strip()!r} is not KEY=N; allowed keys: "
                            f"{allowed(RESTORE_KEYS)}")
        if key in out:
            raise SpecError(f"{option} {text!r}: {key} is given twice; allowed: each key once")
        try:
            out[key] = int(value)
        except ValueError:
            raise SpecError(f"{option} {text!r}: {key} = {value.strip()!r} must be an integer"
                            " >= 1") from None
    return out


def _check_layout(spec: ParallelSpec, model: ModelSpec, section: str) -> ParallelSpec:
    """Checks every layout passes, [parallel] or [restore] (errors name `section`)."""
    grid = spec.tp * spec.pp * spec.dp_replicate
    if spec.world_size % grid:
        raise SpecError(
            f"[{section}] world_size = {spec.world_size} must be divisible by tp x pp x dp_replicate"
            f" = {spec.tp} x {spec.pp} x {spec.dp_replicate} = {grid}"
        )
    if model.heads % spec.tp:
        raise SpecError(f"[{section}] tp = {spec.tp} must divide [model] heads = {model.heads}")
    if model.kv_heads % spec.tp:
        raise SpecError(f"[{section}] tp = {spec.tp} must divide [model] kv_heads = {model.kv_heads}")
    if spec.pp > model.layers:
        raise SpecError(
            f"[{section}] pp = {spec.pp} stages is more than [model] layers = {model.layers}"
        )
    if spec.ep > 1:
        if not model.experts:
            raise SpecError(f"[{section}] ep = {spec.ep} needs a mixture-of-experts model ([model] experts > 0)")
        if model.experts % spec.ep:
            raise SpecError(f"[{section}] ep = {spec.ep} must divide [model] experts = {model.experts}")
        if spec.dp_shard % spec.ep:
            raise SpecError(
                f"[{section}] ep = {spec.ep} must divide the shard degree world_size / (tp x pp x"
                f" dp_replicate) = {spec.dp_shard}"
            )
    if spec.layout == "megatron-deepspeed":
        if spec.zero_stage not in (1, 2, 3):
            raise SpecError(f"[{section}] zero_stage = {spec.zero_stage} is not allowed; allowed: 1, 2, 3")
        if spec.dp_replicate != 1 or spec.ep != 1:
            raise SpecError(f"[{section}] dp_replicate and ep must be 1 with layout = 'megatron-deepspeed'")
    return spec


def parse_workload(data: Mapping[str, Any], name: str = "workload") -> Workload:
    """Validate a workload given as nested tables (what TOML parsing gives)."""
    for section in data:
        if section == "run":
            continue  # the run options: checked by ckptbench.runspec, not part of the workload
        if section not in _SECTIONS:
            raise SpecError(f"unknown table [{section}]; allowed: {allowed([*_SECTIONS, 'run'])}")
        if not isinstance(data[section], Mapping):
            raise SpecError(f"[{section}] must be a table")
    meta = data.get("workload", {})
    _check_keys(meta, "workload")
    if "model" not in data:
        raise SpecError("[model] table is required")
    model = _model(data["model"])

    state_table = data.get("state", {})
    _check_keys(state_table, "state")
    dtypes = tuple(DTYPE_BYTES)
    state = StateSpec(
        param_dtype=choice_field(state_table, "state", "param_dtype", dtypes, "float32"),
        master_dtype=choice_field(state_table, "state", "master_dtype", ("none", *dtypes), "none"),
        optimizer=choice_field(state_table, "state", "optimizer", OPTIMIZERS, "adamw"),
        optimizer_dtype=choice_field(state_table, "state", "optimizer_dtype", dtypes, "float32"),
    )
    parallel = _parallel(data.get("parallel", {}), model)

    ckpt_table = data.get("checkpoint", {})
    _check_keys(ckpt_table, "checkpoint")
    default_files = "megatron" if parallel.layout == "megatron-deepspeed" else "dcp"
    checkpoint = CheckpointSpec(
        files=choice_field(ckpt_table, "checkpoint", "files", FILE_GROUPINGS, default_files),
        threads=int_field(ckpt_table, "checkpoint", "threads", 1, maximum=MAX_FILE_THREADS),
        stripe_size=int_field(ckpt_table, "checkpoint", "stripe_size", 1 << 20, minimum=STRIPE_ALIGN),
        stripe_count=int_field(ckpt_table, "checkpoint", "stripe_count", 0, minimum=-1),
    )
    if checkpoint.stripe_size % STRIPE_ALIGN:
        raise SpecError(
            f"[checkpoint] stripe_size = {checkpoint.stripe_size} must be a multiple of"
            f" {STRIPE_ALIGN} (e.g. 1048576)"
        )
    restore_table = data.get("restore", {})
    restore = _restore(restore_table, model, parallel)
    if (checkpoint.files == "megatron") != (parallel.layout == "megatron-deepspeed"):
        raise SpecError(
            f"[checkpoint] files = {checkpoint.files!r} does not fit layout {parallel.layout!r};"
            f" allowed: {'megatron' if parallel.layout == 'megatron-deepspeed' else 'dcp, per-chunk, per-rank, shared'}"
        )
    return Workload(
        name=_workload_name(meta, name),
        description=_description(meta),
        model=model,
        state=state,
        parallel=parallel,
        checkpoint=checkpoint,
        restore=restore,
        tiers=tierspec.parse_tiers(data.get("tiers", {})),
    )


def workload_from_dict(data: Mapping[str, Any]) -> Workload:
    """A workload from :meth:`Workload.to_dict` (as results files and manifests carry it)."""
    tables: dict[str, Any] = {"workload": {"name": data.get("name", "workload"),
                                           "description": data.get("description", "")}}
    for section in ("model", "state", "parallel", "checkpoint", "restore", "tiers"):
        # a section that is there must be a table: a string (restore = "x") was dropped
        # without a word, and the workload quietly became another one
        if data.get(section) is not None and not isinstance(data[section], Mapping):
            raise SpecError(f"[{section}] = {shown(data[section])}; allowed: a table")
    for section in ("model", "state", "parallel", "checkpoint"):
        if isinstance(data.get(section), Mapping):
            tables[section] = dict(data[section])
    restore = data.get("restore")
    if isinstance(restore, Mapping):  # a ParallelSpec's fields: the layout's keys kept
        tables["restore"] = {k: v for k, v in restore.items() if k in RESTORE_KEYS}
    if isinstance(data.get("tiers"), Mapping) and data["tiers"].get("use"):  # a tiered run
        tables["tiers"] = {k: v for k, v in data["tiers"].items() if k in tierspec.KEYS}
    return parse_workload(tables, name=str(data.get("name", "workload")))


def load_workload(path: str | Path) -> Workload:
    """Read and validate a TOML workload file."""
    path = Path(path)
    data = read_toml(path, MAX_WORKLOAD_FILE_BYTES, "a UTF-8 TOML workload file")
    try:
        return parse_workload(data, name=path.stem)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def scaled(workload: Workload, factor: int) -> Workload:
    """Shrink every tensor dimension by `factor`, keeping the layout (for small machines).

    Dimensions that are sharded keep a multiple of what the layout needs, so the same
    mesh still applies; layer count and world size do not change.
    """
    if factor == 1:
        return workload
    m = workload.model
    head_dim = max(1, m.resolved_head_dim // factor)
    return replace(
        workload,
        model=replace(
            m,
            dim=head_dim * m.heads,
            head_dim=head_dim,
            ffn_dim=max(1, m.ffn_dim // factor),
            vocab_size=max(1, m.vocab_size // factor),
            moe_ffn_dim=max(1, m.moe_ffn_dim // factor) if m.experts else 0,
        ),
    )
