"""Where each checkpoint copy lives: nodes, peer placement, what survives a failure.

Pure arithmetic on a TiersSpec and the run's processes. A node is one of the launcher's
nodes (the scheduler's node name under Slurm, where emulated nodes share one host name;
else the host name), or a group of ``ranks_per_node`` processes (nodes emulated on one
host; refused where it would cut across the launcher's nodes). Each node's copy is
replicated to ``k`` other nodes:

ring    node n -> nodes n+1 .. n+k (mod N), as Gemini places its replicas
clique  nodes in groups of k+1 (N divisible by k+1); each node -> the others of its group,
        as NVIDIA's resiliency extension's clique replication does

A process's replica on node m is held by the process with the same position on m (nodes
have equal process counts when a peer tier is used), so every shard's replica has one
named holder and a restore knows whom to ask.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ckptbench.errors import SpecError
from ckptbench.tierspec import TiersSpec

HELD_COPIES = 2  # the newest checkpoint and the one before it while the newest is written


@dataclass(frozen=True)
class TierPlan:
    """The tiers of one run, placed: node of each process and the replica nodes of each
    node (empty without a peer tier)."""

    spec: TiersSpec
    node_of: tuple[int, ...]  # process -> node
    replicas: tuple[tuple[int, ...], ...]  # node -> the nodes holding its copies
    node_source: str  # "ranks_per_node=N", "launcher hosts" or "slurm nodes"
    node_names: tuple[str, ...] = ()  # node -> the launcher's name for it (its processes')

    @property
    def nodes(self) -> int:
        return len(self.replicas)

    def processes_on(self, node: int) -> list[int]:
        return [p for p, n in enumerate(self.node_of) if n == node]

    def position(self, proc: int) -> int:
        """The process's index among its node's processes."""
        return self.processes_on(self.node_of[proc]).index(proc)

    def holders(self, proc: int) -> list[int]:
        """The processes holding `proc`'s peer replicas, in placement order."""
        pos = self.position(proc)
        return [self.processes_on(m)[pos] for m in self.replicas[self.node_of[proc]]]

    def held_for(self, proc: int) -> list[int]:
        """The processes whose replicas `proc` holds."""
        return [p for p in range(len(self.node_of)) if proc in self.holders(p)]

    def stores(self, iteration: int) -> bool:
        """Whether checkpoint `iteration` (1-based) is also saved to storage."""
        return self.spec.has("storage") and iteration % self.spec.storage_every == 0

    def serving_tier(self, proc: int, lost: Iterable[int]) -> tuple[str, int] | None:
        """Which copy of `proc`'s shard a restart reads when nodes `lost` are gone: its
        own node's memory copy ("memory", proc), a surviving replica ("peer", holder),
        else None (storage or nothing: the caller decides)."""
        gone = set(lost)
        if self.spec.has("memory") and self.node_of[proc] not in gone:
            return "memory", proc
        if self.spec.has("peer"):
            for holder in self.holders(proc):
                if self.node_of[holder] not in gone:
                    return "peer", holder
        return None

    def group(self, node: int) -> list[int]:
        """The replication group of `node`: the node and every node holding a copy of its
        shards. Losing all of them leaves its shards in no tier (storage or nothing)."""
        return sorted({node, *self.replicas[node]})

    def last_stored(self, iterations: int) -> int:
        """The newest checkpoint of `iterations` that is also in storage (0: none)."""
        every = self.spec.storage_every
        return iterations - iterations % every if self.spec.has("storage") else 0

    def held_bytes(self, proc_bytes: list[int]) -> list[int]:
        """Per node: the tier bytes it holds at most (own copies and the replicas it keeps,
        HELD_COPIES checkpoints each)."""
        out = [0] * self.nodes
        for p, n in enumerate(self.node_of):
            if self.spec.has("memory"):
                out[n] += proc_bytes[p] * HELD_COPIES
            if self.spec.has("peer"):
                for h in self.holders(p):
                    out[self.node_of[h]] += proc_bytes[p] * HELD_COPIES
        return out


def _nodes_of(spec: TiersSpec, hosts: list[str], source: str
              ) -> tuple[tuple[int, ...], str, tuple[str, ...]]:
    """(node of each process, where the nodes come from, each node's name)."""
    index: dict[str, int] = {}
    placed = tuple(index.setdefault(h, len(index)) for h in hosts)
    names = tuple(index)
    k = spec.ranks_per_node
    if not k:
        return placed, source, names
    if len(hosts) % k:
        raise SpecError(f"--ranks-per-node {k} does not divide the run's "
                        f"{len(hosts)} processes; allowed: a divisor of {len(hosts)}")
    emulated = tuple(p // k for p in range(len(hosts)))
    if len(names) > 1 and emulated != placed:
        counts = ", ".join(f"{n}: {placed.count(i)}" for i, n in enumerate(names))
        raise SpecError(f"--ranks-per-node {k} emulates nodes on one host, but the launcher "
                        f"placed the run's processes on {len(names)} nodes ({source}: "
                        f"{counts}), which nodes of {k} processes cut across (a replica could "
                        "land on the node it protects); allowed: 0 (the launcher's nodes)")
    if len(names) > 1:
        return placed, source, names
    return emulated, f"ranks_per_node={k}", tuple(f"{hosts[0]}:{i}"
                                                  for i in range(len(hosts) // k))


def _replicas(spec: TiersSpec, nodes: int) -> tuple[tuple[int, ...], ...]:
    k = spec.peer_replicas
    if k >= nodes:
        raise SpecError(f"--peer-replicas {k} needs more than {k} nodes (replicas live on other "
                        f"nodes), the run has {nodes}; allowed: 1 to {nodes - 1}, or more nodes "
                        "(--ranks-per-node)" if nodes > 1 else
                        f"--peer-replicas {k}: the run has 1 node, so a replica would be on the "
                        "same node; allowed: 2 or more nodes (--ranks-per-node, or more hosts)")
    if spec.placement == "ring":
        return tuple(tuple((n + i) % nodes for i in range(1, k + 1)) for n in range(nodes))
    size = k + 1
    if nodes % size:
        raise SpecError(f"--peer-placement clique: cliques of --peer-replicas {k} + 1 = {size} "
                        f"nodes do not divide the run's {nodes} nodes; allowed: a replica count "
                        "k with nodes divisible by k + 1, or --peer-placement ring")
    return tuple(tuple(m for m in range(n - n % size, n - n % size + size) if m != n)
                 for n in range(nodes))


def plan_tiers(spec: TiersSpec, hosts: list[str], source: str = "launcher hosts"
               ) -> TierPlan | None:
    """The placement for processes on `hosts` (the node of each process, as the launcher
    names it: `source`); None without tiers. A spec the run cannot place is one line
    naming the option."""
    if not spec.enabled:
        return None
    node_of, source, names = _nodes_of(spec, hosts, source)
    nodes = max(node_of) + 1 if node_of else 0
    replicas: tuple[tuple[int, ...], ...] = tuple(() for _ in range(nodes))
    if spec.has("peer"):
        counts = {node_of.count(n) for n in range(nodes)}
        if len(counts) > 1:
            raise SpecError(f"--tiers peer: nodes hold {sorted(counts)} processes; a replica's "
                            "holder is the process at the same place on another node; allowed: "
                            "the same number of processes on every node")
        replicas = _replicas(spec, nodes)
    plan = TierPlan(spec, node_of, replicas, source, names)
    for n, nodes_of_n in enumerate(plan.replicas):  # the placement's own promise, checked
        if n in nodes_of_n or len(set(nodes_of_n)) != len(nodes_of_n):
            raise SpecError(f"--peer-placement {spec.placement}: node {n} would hold its own "
                            "replica; allowed: replicas on other nodes")
    return plan
