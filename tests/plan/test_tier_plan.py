"""The recovery tiers' placement (issue 32): ring and clique replicas on other nodes,
nodes from ranks per node or the launcher's hosts, what survives a failure, and the
memory each node holds. Every refusal names the option."""

from __future__ import annotations

import pytest

from ckptbench.errors import SpecError
from ckptbench.plan.tiers import plan_tiers
from ckptbench.tierspec import TiersSpec, parse_tiers, tiers_with_flags

ALL = ("memory", "peer", "storage")


def placed(processes: int, **kw: object) -> object:
    spec = TiersSpec(use=ALL, **kw)  # type: ignore[arg-type]
    return plan_tiers(spec, ["h"] * processes)


def test_ring_places_each_nodes_replicas_on_the_next_k_nodes() -> None:
    tp = plan_tiers(TiersSpec(use=ALL, peer_replicas=2, ranks_per_node=2), ["h"] * 8)
    assert tp is not None and tp.nodes == 4
    assert tp.replicas == ((1, 2), (2, 3), (3, 0), (0, 1))
    assert tp.holders(0) == [2, 4] and tp.holders(7) == [1, 3]  # same place on the node
    assert tp.held_for(0) == [4, 6]  # node 0 keeps nodes 2 and 3's


def test_cliques_of_k_plus_1_nodes_replicate_among_themselves() -> None:
    tp = plan_tiers(TiersSpec(use=ALL, peer_replicas=1, placement="clique", ranks_per_node=1),
                    ["h"] * 4)
    assert tp is not None and tp.replicas == ((1,), (0,), (3,), (2,))
    tp = plan_tiers(TiersSpec(use=ALL, peer_replicas=2, placement="clique", ranks_per_node=1),
                    ["h"] * 6)
    assert tp is not None and tp.replicas == ((1, 2), (0, 2), (0, 1), (4, 5), (3, 5), (3, 4))


def test_nodes_from_the_launchers_hosts() -> None:
    tp = plan_tiers(TiersSpec(use=ALL), ["a", "a", "b", "b"])
    assert tp is not None and tp.node_of == (0, 0, 1, 1) and tp.node_source == "launcher hosts"
    assert tp.node_names == ("a", "b")
    tp = plan_tiers(TiersSpec(use=ALL), ["n1", "n2", "n1", "n2"], "slurm nodes")  # cyclic
    assert tp is not None and tp.node_of == (0, 1, 0, 1) and tp.node_source == "slurm nodes"
    assert tp.holders(0) == [1] and tp.holders(3) == [2]


def test_ranks_per_node_may_not_cut_across_the_launchers_nodes() -> None:
    """Emulated nodes on one host are fine; on a launcher's several nodes they must be
    those nodes (a replica could otherwise sit on the node it protects)."""
    one_host = plan_tiers(TiersSpec(use=ALL, ranks_per_node=2), ["h"] * 4)
    assert one_host is not None and one_host.node_names == ("h:0", "h:1")
    same = plan_tiers(TiersSpec(use=ALL, ranks_per_node=2), ["n1", "n1", "n2", "n2"], "slurm nodes")
    assert same is not None and same.node_names == ("n1", "n2")
    assert same.node_source == "slurm nodes"
    with pytest.raises(SpecError) as err:
        plan_tiers(TiersSpec(use=ALL, ranks_per_node=1), ["n1", "n1", "n2", "n2"], "slurm nodes")
    assert "--ranks-per-node 1 emulates nodes" in str(err.value)
    assert "(slurm nodes: n1: 2, n2: 2)" in str(err.value)


@pytest.mark.parametrize("kw, processes, needles", [
    ({"peer_replicas": 2, "ranks_per_node": 2}, 4, ["--peer-replicas 2", "allowed: 1 to 1"]),
    ({"peer_replicas": 1, "ranks_per_node": 4}, 4, ["1 node", "same node"]),
    ({"ranks_per_node": 3}, 4, ["--ranks-per-node 3 does not divide"]),
    ({"peer_replicas": 2, "placement": "clique", "ranks_per_node": 1}, 4,
     ["--peer-placement clique", "do not divide"]),
])
def test_a_placement_the_run_cannot_have_is_refused(kw: dict[str, object], processes: int,
                                                   needles: list[str]) -> None:
    with pytest.raises(SpecError) as err:
        placed(processes, **kw)
    for n in needles:
        assert n in str(err.value)


def test_unequal_nodes_cannot_name_a_replicas_holder() -> None:
    with pytest.raises(SpecError, match="same number of processes"):
        plan_tiers(TiersSpec(use=ALL), ["a", "a", "b"])


def test_which_copy_a_restart_reads() -> None:
    tp = plan_tiers(TiersSpec(use=ALL, peer_replicas=1, ranks_per_node=1), ["h"] * 3)
    assert tp is not None
    assert tp.serving_tier(0, []) == ("memory", 0)
    assert tp.serving_tier(0, [0]) == ("peer", 1)  # node 0 replaced: its replica on node 1
    assert tp.serving_tier(0, [0, 1]) is None  # the replication group lost: storage
    mem_only = plan_tiers(TiersSpec(use=("memory", "storage"), ranks_per_node=1), ["h"] * 2)
    assert mem_only is not None and mem_only.serving_tier(1, [1]) is None


def test_held_bytes_count_own_copies_and_replicas_two_checkpoints_each() -> None:
    tp = plan_tiers(TiersSpec(use=ALL, peer_replicas=1, ranks_per_node=1), ["h"] * 2)
    assert tp is not None and tp.held_bytes([100, 10]) == [2 * 100 + 2 * 10, 2 * 10 + 2 * 100]


def test_storage_every_nth_checkpoint() -> None:
    tp = plan_tiers(TiersSpec(use=ALL, storage_every=3, ranks_per_node=1), ["h"] * 2)
    assert tp is not None and [i for i in range(1, 10) if tp.stores(i)] == [3, 6, 9]


@pytest.mark.parametrize("table, needle", [
    ({"use": ["memory", "disk"]}, "unknown tier 'disk'"),
    ({"use": ["memory", "memory"]}, "named twice"),
    ({"use": []}, "[tiers] use"),
    ({"use": "memory", "storage_every": 0}, "[tiers] storage_every = 0 must be an integer >= 1"),
    ({"use": "peer", "peer_replicas": 0}, "[tiers] peer_replicas = 0"),
    ({"use": "peer", "placement": "star"}, "[tiers] placement = 'star' is not allowed"),
    ({"use": "memory", "memory_budget": "lots"}, "[tiers] memory_budget 'lots' is not a size"),
    ({"use": "memory", "replicas": 2}, "[tiers] unknown key 'replicas'"),
    ({"use": ["storage"], "storage_every": 2}, "storage as the only tier"),
])
def test_bad_tables_name_their_key(table: dict[str, object], needle: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_tiers(table)
    assert needle in str(err.value)


def test_flags_override_the_table() -> None:
    base = parse_tiers({"use": ["memory", "storage"], "storage_every": 4})
    spec = tiers_with_flags(base, {"use": "memory,peer,storage", "peer_replicas": 2,
                                   "memory_budget": "1GiB", "storage_every": None})
    assert spec.use == ALL and spec.peer_replicas == 2 and spec.memory_budget == 1 << 30
    assert spec.storage_every == 4
    with pytest.raises(SpecError, match="--peer-replicas needs tiers"):
        tiers_with_flags(TiersSpec(), {"peer_replicas": 2})


def test_a_replication_group_and_the_newest_stored_checkpoint() -> None:
    """A node's replication group is the node and its replicas' nodes: losing them all
    leaves its shards in no tier, while the others still have a copy somewhere."""
    tp = plan_tiers(TiersSpec(use=ALL, peer_replicas=1, ranks_per_node=1), ["h"] * 4)
    assert tp is not None and tp.group(3) == [0, 3]
    lost = set(tp.group(3))
    assert [tp.serving_tier(p, lost) for p in range(4)] == [
        ("peer", 1), ("memory", 1), ("memory", 2), None]
    clique = plan_tiers(TiersSpec(use=ALL, peer_replicas=1, placement="clique",
                                  ranks_per_node=1), ["h"] * 4)
    assert clique is not None and clique.group(3) == [2, 3]
    alone = plan_tiers(TiersSpec(use=("memory", "storage"), ranks_per_node=2), ["h"] * 4)
    assert alone is not None and alone.group(1) == [1]
    every = plan_tiers(TiersSpec(use=ALL, storage_every=3, ranks_per_node=1), ["h"] * 2)
    assert every is not None
    assert [every.last_stored(n) for n in (1, 2, 3, 5, 6)] == [0, 0, 3, 3, 6]
    nostore = plan_tiers(TiersSpec(use=("memory", "peer"), ranks_per_node=1), ["h"] * 2)
    assert nostore is not None and nostore.last_stored(4) == 0
