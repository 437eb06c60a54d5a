"""The ``[tiers]`` table of a workload (and its flags): where a job keeps its checkpoints.

Recovery tiers as Gemini, NVIDIA's resiliency extension (local checkpointing with clique
replication) and ByteCheckpoint keep them: ``memory`` (each node's own copy, in node-local
shared memory that outlives the training process), ``peer`` (replicas of each node's
copy on ``peer_replicas`` other nodes, placed in a ``ring`` or in ``clique``s of
peer_replicas + 1 nodes) and ``storage`` (the ordinary save, every ``storage_every``-th
checkpoint). Nodes are groups of ``ranks_per_node`` processes, or (0) the launcher's
hosts. Only the schema lives here; the placement (which needs the node count) is
``ckptbench.plan.tiers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ckptbench.errors import SpecError
from ckptbench.fields import allowed, choice_field, int_field, shown
from ckptbench.units import parse_size

TIER_NAMES = ("memory", "peer", "storage")
PLACEMENTS = ("ring", "clique")
TRANSPORTS = ("auto", "tcp")  # auto: MPI point-to-point under an MPI launcher, else TCP
KEYS = ("use", "memory_dir", "memory_budget", "peer_replicas", "placement", "ranks_per_node",
        "storage_every", "peer_transport", "keep")
DEFAULT_MEMORY_DIR = "/dev/shm"
MAX_REPLICAS = 64
MAX_EVERY = 1 << 20

# table key -> the flag that overrides it (errors name what the user typed)
FLAGS = {"use": "--tiers", "memory_dir": "--memory-dir", "memory_budget": "--memory-budget",
         "peer_replicas": "--peer-replicas", "placement": "--peer-placement",
         "ranks_per_node": "--ranks-per-node", "storage_every": "--storage-every",
         "peer_transport": "--peer-transport", "keep": "--keep-tiers"}


@dataclass(frozen=True)
class TiersSpec:
    """Which tiers a job uses and how; ``use`` empty: storage alone (no tiers)."""

    use: tuple[str, ...] = ()
    memory_dir: str = DEFAULT_MEMORY_DIR
    memory_budget: int = 0  # bytes per node; 0: what memory_dir's file system has free
    peer_replicas: int = 1
    placement: str = "ring"
    ranks_per_node: int = 0  # 0: the launcher's hosts are the nodes
    storage_every: int = 1
    peer_transport: str = "auto"
    keep: bool = False  # the copies outlive the run, for a relaunch (runner.tier_relaunch)

    @property
    def enabled(self) -> bool:
        return bool(self.use)

    def has(self, tier: str) -> bool:
        return tier in self.use


def _use(value: Any, where: str) -> tuple[str, ...]:
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise SpecError(f"{where} = {shown(value)}: allowed: a list of {allowed(TIER_NAMES)}")
    out: list[str] = []
    for item in items:
        if item not in TIER_NAMES:
            raise SpecError(f"{where}: unknown tier {shown(item)}; allowed: {allowed(TIER_NAMES)}")
        if item in out:
            raise SpecError(f"{where}: tier {item!r} is named twice; allowed: each tier once")
        out.append(item)
    return tuple(t for t in TIER_NAMES if t in out)


def _budget(value: Any, where: str) -> int:
    if isinstance(value, str):
        return parse_size(value, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{where} = {shown(value)}: allowed: a size like 64GiB (0: what the "
                        "memory directory has free)")
    return value


def parse_tiers(table: Mapping[str, Any], section: str = "tiers") -> TiersSpec:
    """A TiersSpec from the [tiers] table (every error names its key)."""
    for key in table:
        if key not in KEYS:
            raise SpecError(f"[{section}] unknown key {key!r}; allowed: {allowed(KEYS)}")
    use = _use(table["use"], f"[{section}] use") if "use" in table else ()
    memory_dir = table.get("memory_dir", DEFAULT_MEMORY_DIR)
    if not isinstance(memory_dir, str) or not memory_dir or "\0" in memory_dir:
        raise SpecError(f"[{section}] memory_dir = {shown(memory_dir)}: allowed: a directory path")
    keep = table.get("keep", False)
    if not isinstance(keep, bool):
        raise SpecError(f"[{section}] keep = {shown(keep)}: allowed: true or false")
    spec = TiersSpec(
        use=use, keep=keep, memory_dir=memory_dir,
        memory_budget=_budget(table.get("memory_budget", 0), f"[{section}] memory_budget"),
        peer_replicas=int_field(table, section, "peer_replicas", 1, maximum=MAX_REPLICAS),
        placement=choice_field(table, section, "placement", PLACEMENTS, "ring"),
        ranks_per_node=int_field(table, section, "ranks_per_node", 0, minimum=0,
                                 maximum=1 << 20),
        storage_every=int_field(table, section, "storage_every", 1, maximum=MAX_EVERY),
        peer_transport=choice_field(table, section, "peer_transport", TRANSPORTS, "auto"))
    check_tiers(spec)
    return spec


def check_tiers(spec: TiersSpec) -> None:
    """What a spec alone can get wrong (the node count is the plan's business)."""
    if spec.enabled and spec.use == ("storage",) and spec.storage_every != 1:
        raise SpecError(f"--storage-every {spec.storage_every} with storage as the only tier "
                        "would leave checkpoints nowhere; allowed: 1, or add memory or peer")


def tiers_with_flags(base: TiersSpec, flags: Mapping[str, Any]) -> TiersSpec:
    """`base` (the workload's [tiers]) with the flags that were given (key -> value as
    typed; None: not given); errors name the flag."""
    values: dict[str, Any] = {}
    for key, value in flags.items():
        if value is None or (key == "keep" and value is False):  # a flag's False: not given
            continue
        flag = FLAGS[key]
        if key == "use":
            values[key] = () if value.strip() in ("", "none") else _use(value, flag)
        elif key == "memory_budget":
            values[key] = _budget(value, flag)
        elif key in ("placement", "peer_transport"):
            values[key] = choice_field({key: value}, "tiers", key,
                                       PLACEMENTS if key == "placement" else TRANSPORTS,
                                       str(getattr(base, key)))
        elif key == "memory_dir":
            values[key] = str(value)
        elif key == "keep":
            values[key] = True
        else:
            low = 0 if key == "ranks_per_node" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise SpecError(f"{flag} {shown(value)}: allowed: an integer >= {low}")
            values[key] = value
    spec = replace(base, **values)
    if values and not spec.enabled:
        named = next(FLAGS[k] for k in values if k != "use") if set(values) - {"use"} else None
        if named:
            raise SpecError(f"{named} needs tiers (--tiers memory,peer,storage or [tiers] use)")
    check_tiers(spec)
    return spec
