"""`ckptbench run`'s recovery tier flags (ckptbench.tierspec): each overrides the
workload's [tiers] key of the same name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ckptbench.tierspec import PLACEMENTS, TiersSpec, tiers_with_flags

# click parameter -> [tiers] key
PARAMS = {"tiers": "use", "memory_dir": "memory_dir", "memory_budget": "memory_budget",
           "peer_replicas": "peer_replicas", "peer_placement": "placement",
           "ranks_per_node": "ranks_per_node", "storage_every": "storage_every"}


def tier_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of the recovery tiers (docs/tiers.md)."""
    options = [
        click.option("--tiers", default=None,
                     help="Recovery tiers, e.g. memory,peer,storage: memory (a node-local copy "
                          "in --memory-dir), peer (replicas on other nodes), storage (TARGET, "
                          "every --storage-every-th checkpoint) [default: the workload's "
                          "[tiers] use; none: storage alone]."),
        click.option("--memory-dir", default=None,
                     help="tiers: where the node-local copies live [default: /dev/shm]."),
        click.option("--memory-budget", default=None,
                     help="tiers: host memory the copies may hold per node, e.g. 64GiB "
                          "[default: what --memory-dir has free]."),
        click.option("--peer-replicas", type=int, default=None,
                     help="tiers: replicas of each node's copy on other nodes [default: 1]."),
        click.option("--peer-placement", type=click.Choice(PLACEMENTS), default=None,
                     help="tiers: ring (node n -> n+1..n+k) or clique (groups of k+1 nodes) "
                          "[default: ring]."),
        click.option("--ranks-per-node", type=int, default=None,
                     help="tiers: processes per node (nodes emulated on one host) [default: "
                          "0, the launcher's hosts]."),
        click.option("--storage-every", type=int, default=None,
                     help="tiers: save every N-th checkpoint to TARGET [default: 1]."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def take_tier_flags(values: dict[str, Any]) -> dict[str, Any]:
    """The tier flags' values ([tiers] key -> value or None), taken out of `values`."""
    return {key: values.pop(param) for param, key in PARAMS.items()}


def tiers_from(flags: dict[str, Any], base: TiersSpec) -> TiersSpec:
    """The run's tiers: `base` (the workload's [tiers]) with the flags given."""
    return tiers_with_flags(base, flags)
