"""Failure classes with a reach, and which checkpoint level each one needs.

A failure does not only interrupt the job: it takes copies with it. A software fault
kills processes and leaves node memory intact (a copy in host memory survives); a GPU
or host fault takes the node and its memory (a copy on a peer node survives); a switch,
rack or power fault takes a group of nodes (only a copy outside the group, or storage,
survives); a storage or whole-job fault leaves only what the storage holds. Each class
has a rate and one of these scopes; each checkpoint level names the widest scope it
survives, and a failure needs the cheapest level that survives it (its *severity* in
the multi-level model, ``cadence.multilevel``).
"""

from __future__ import annotations

import itertools
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckptbench.cadence.formulas import SECONDS_PER_HOUR, non_negative
from ckptbench.errors import SpecError
from ckptbench.fields import read_small_text, shown

MAX_CLASSES_FILE = 1 << 20
MAX_CLASSES = 1000

SCOPES = ("process", "node", "group", "job")
UNITS = ("gpu", "host", "job")


@dataclass(frozen=True)
class FailureClass:
    """Failures of one kind: a rate per unit-hour (per GPU, per host, or for the job)."""

    name: str
    scope: str
    rate_per_hour: float
    unit: str = "gpu"

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise SpecError(f"failure class {self.name}: scope {self.scope!r} is not known; "
                            f"allowed: {', '.join(SCOPES)}")
        if self.unit not in UNITS:
            raise SpecError(f"failure class {self.name}: unit {self.unit!r} is not known; "
                            f"allowed: {', '.join(UNITS)}")
        non_negative(f"failure class {self.name} rate", self.rate_per_hour)

    def per_second(self, gpus: int, gpus_per_host: int) -> float:
        units = {"gpu": gpus, "host": math.ceil(gpus / gpus_per_host), "job": 1}[self.unit]
        return self.rate_per_hour * units / SECONDS_PER_HOUR


# Llama 3 (Meta, "The Llama 3 Herd of Models", 2024, table 5): 419 unexpected
# interruptions in 54 days on 16,384 H100 (2,048 hosts). The scope of each cause is an
# assumption: a GPU, memory, NIC or host fault takes its node (the node is drained or
# replaced, its memory copy with it); software faults and NCCL watchdog timeouts end
# processes only; a switch or cable takes the nodes behind it; "dependency" failures
# (storage and other services the job needs) are charged to the whole job.
LLAMA3_HOURS = 54 * 24 * 16_384
LLAMA3_CAUSES: tuple[tuple[str, int, str], ...] = (
    ("faulty GPU", 148, "node"), ("GPU HBM3 memory", 72, "node"),
    ("software bug", 54, "process"), ("network switch/cable", 35, "group"),
    ("host maintenance", 32, "node"), ("GPU SRAM memory", 19, "node"),
    ("GPU system processor", 17, "node"), ("NIC", 7, "node"), ("NCCL watchdog", 7, "process"),
    ("silent data corruption", 6, "node"), ("GPU thermal interface", 6, "node"),
    ("SSD", 3, "node"), ("power supply", 3, "node"), ("server chassis", 2, "node"),
    ("IO expansion board", 2, "node"), ("dependency", 2, "job"), ("CPU", 2, "node"),
    ("system memory", 2, "node"),
)
# Kokolis et al. 2024, "Revisiting Reliability in Large-Scale Machine Learning Research
# Clusters" (Meta; HPCA 2025): 11 months of two clusters of 8-GPU A100 nodes, with the
# rate of failures per 1,000 node-days. The rate counts node failures (what their health
# checks attribute to a node), so every failure is given the node as its scope; the
# paper publishes no split of these rates by reach that a process or group class could
# take. (Its job-level MTTF, 1.8 h at 16,384 GPUs, is the job preset `rsc1` of cadence.)
HOURS_PER_DAY = 24
RSC_NODE_FAILURES_PER_1K_NODE_DAYS = {"rsc1": ("RSC-1, 16k A100", 6.50),
                                      "rsc2": ("RSC-2, 8k A100", 2.34)}


def _rsc_preset(name: str) -> tuple[str, tuple[FailureClass, ...]]:
    cluster, per_1k_node_days = RSC_NODE_FAILURES_PER_1K_NODE_DAYS[name]
    source = (f"Kokolis et al. 2024 (Meta {cluster}): {per_1k_node_days} node failures per "
              "1k node-days, all of node scope (the paper does not split them by reach)")
    rate = per_1k_node_days / 1000 / HOURS_PER_DAY
    return source, (FailureClass(f"{name} node failure", "node", rate, "host"),)


CLASS_PRESETS: dict[str, tuple[str, tuple[FailureClass, ...]]] = {
    "llama3": (
        "Llama 3 Herd of Models (Meta, 2024): 419 unexpected interruptions in 54 days on "
        "16,384 H100, per cause; each cause's scope assumed (docs/cadence.md)",
        tuple(FailureClass(name, scope, count / LLAMA3_HOURS)
              for name, count, scope in LLAMA3_CAUSES)),
    **{name: _rsc_preset(name) for name in RSC_NODE_FAILURES_PER_1K_NODE_DAYS},
}


def parse_class(text: str) -> FailureClass:
    """``NAME:SCOPE:RATE[:UNIT]``, RATE per unit-hour (default unit: gpu)."""
    usage = (f"--failure-class {text!r}: allowed: NAME:SCOPE:RATE[:UNIT], scope "
             f"{'|'.join(SCOPES)}, rate per unit-hour, unit {'|'.join(UNITS)} (default gpu)")
    parts = text.split(":")
    if len(parts) not in (3, 4) or not parts[0].strip():
        raise SpecError(usage)
    try:
        rate = float(parts[2])
    except ValueError:
        raise SpecError(usage) from None
    if not math.isfinite(rate):
        raise SpecError(usage)
    return FailureClass(parts[0].strip(), parts[1].strip(), rate,
                        parts[3].strip() if len(parts) == 4 else "gpu")


def load_classes(path: Path) -> tuple[FailureClass, ...]:
    """A TOML file of ``[[class]]`` tables: ``name``, ``scope``, ``rate`` (per unit-hour)
    and optionally ``unit`` (gpu, host or job; default gpu)."""
    text = read_small_text(path, MAX_CLASSES_FILE, "a TOML file of [[class]] tables")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not TOML ({exc})") from None
    unknown = set(data) - {"class", "source"}
    if unknown:
        raise SpecError(f"{path}: unknown key {sorted(unknown)[0]!r}; allowed: [[class]], source")
    tables = data.get("class")
    if not isinstance(tables, list) or not tables or len(tables) > MAX_CLASSES:
        raise SpecError(f"{path}: allowed: 1 to {MAX_CLASSES} [[class]] tables")
    out = []
    for i, table in enumerate(tables, 1):
        where = f"{path}: [[class]] {i}"
        if not isinstance(table, dict):
            raise SpecError(f"{where}: must be a table")
        extra = set(table) - {"name", "scope", "rate", "unit"}
        if extra:
            raise SpecError(f"{where}: unknown key {sorted(extra)[0]!r}; allowed: name, scope, "
                            "rate, unit")
        name, rate = table.get("name"), table.get("rate")
        if not isinstance(name, str) or not name.strip():
            raise SpecError(f"{where}: name = {shown(name)} must be a non-empty string")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate):
            raise SpecError(f"{where} ({name}): rate = {shown(rate)} must be a number >= 0 "
                            "(failures per unit-hour)")
        scope, unit = table.get("scope"), table.get("unit", "gpu")
        if not isinstance(scope, str) or not isinstance(unit, str):
            raise SpecError(f"{where} ({name}): scope and unit must be strings")
        out.append(FailureClass(name.strip(), scope, float(rate), unit))
    return tuple(out)


def classes_from(preset: str | None, given: Sequence[FailureClass]) -> tuple[FailureClass, ...]:
    """A preset's classes (or a TOML file's, for a name ending in .toml) and/or the classes
    given; at least one."""
    if preset is not None and preset.endswith(".toml"):
        return (*load_classes(Path(preset)), *given)
    if preset is not None and preset not in CLASS_PRESETS:
        raise SpecError(f"--failure-classes {preset!r} is not known; allowed: "
                        f"{', '.join(CLASS_PRESETS)} or a .toml file of [[class]] tables")
    out = (*(CLASS_PRESETS[preset][1] if preset else ()), *given)
    if not out:
        raise SpecError("failure classes are required: --failure-classes PRESET or "
                        "--failure-class NAME:SCOPE:RATE[:UNIT]")
    return out


def assign(level_scopes: Sequence[str], classes: Sequence[FailureClass]) -> list[int]:
    """For each class, the cheapest level (0-based) that survives it.

    Levels go from cheapest to most durable, each surviving a wider scope than the one
    before; the last must survive every class given.
    """
    reach = []
    for i, scope in enumerate(level_scopes):
        if scope not in SCOPES:
            raise SpecError(f"level {i + 1}: scope {scope!r} is not known; allowed: "
                            f"{', '.join(SCOPES)}")
        reach.append(SCOPES.index(scope))
    if any(b <= a for a, b in itertools.pairwise(reach)):
        raise SpecError("levels: each level must survive a wider scope than the one before "
                        f"(given: {', '.join(level_scopes)}); allowed order: {', '.join(SCOPES)}")
    out = []
    for c in classes:
        need = SCOPES.index(c.scope)
        level = next((i for i, r in enumerate(reach) if r >= need), None)
        if level is None:
            raise SpecError(f"failure class {c.name} (scope {c.scope}) is survived by no level; "
                            f"allowed: a last level of scope {c.scope} or wider (e.g. storage: job)")
        out.append(level)
    return out


def severity_rates(level_scopes: Sequence[str], classes: Sequence[FailureClass], gpus: int,
                   gpus_per_host: int) -> list[float]:
    """Failure rate (1/s) for each level: the classes that level is the cheapest to survive."""
    if gpus < 1 or gpus_per_host < 1:
        raise SpecError(f"--gpus {gpus} and --gpus-per-node {gpus_per_host}: allowed: 1 or more")
    rates = [0.0] * len(level_scopes)
    for c, level in zip(classes, assign(level_scopes, classes), strict=True):
        rates[level] += c.per_second(gpus, gpus_per_host)
    return rates
