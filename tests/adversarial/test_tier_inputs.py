"""Recovery tiers' input (issue 32): every bad tier spec (an unknown tier, k >= nodes, a
replica on its own node, N < 1, a clique that does not divide the nodes, flags without
tiers, a [tiers] key that does not exist) and a memory budget the copies do not fit are
one line naming the option, exit 2, before anything is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from .runs import TINY, ckptbench, one_line, refused_before_start

T = "--tiers"


@pytest.mark.parametrize("args, needles", [
    ([T, "memory,disk"], ["--tiers: unknown tier 'disk'", "allowed: memory, peer, storage"]),
    ([T, "memory,memory"], ["--tiers: tier 'memory' is named twice"]),
    ([T, "memory", "--storage-every", "0"], ["'--storage-every': 0 is not in the range x>=1"]),
    ([T, "memory,storage", "--storage-every", "-2"], ["'--storage-every': -2"]),
    ([T, "peer", "--ranks-per-node", "2", "--peer-replicas", "2"],
     ["--peer-replicas 2 needs more than 2 nodes", "allowed: 1 to 1"]),
    ([T, "peer", "--ranks-per-node", "4"], ["1 node", "same node"]),
    ([T, "memory,peer"], ["1 node", "same node"]),  # one host, nodes from the launcher
    ([T, "peer", "--ranks-per-node", "3"], ["--ranks-per-node 3 does not divide"]),
    ([T, "peer", "--ranks-per-node", "1", "--peer-replicas", "2", "--peer-placement",
      "clique"], ["--peer-placement clique", "do not divide the run's 4 nodes"]),
    ([T, "peer", "--peer-replicas", "0"], ["'--peer-replicas': 0 is not in the range x>=1"]),
    (["--peer-replicas", "2"], ["--peer-replicas needs tiers"]),
    ([T, "memory", "--memory-budget", "1MiB"],
     ["--memory-budget 1MiB: node 0 would hold", "allowed: a larger --memory-budget"]),
    ([T, "memory", "--memory-budget", "lots"], ["--memory-budget 'lots' is not a size"]),
    ([T, "memory", "--memory-dir", "/nonexistent/ckptbench"],
     ["--memory-dir /nonexistent/ckptbench: not a directory"]),
    ([T, "memory", "--mode", "async"], ["--tiers memory with --mode async",
                                        "allowed: --tiers peer or peer,storage"]),
    ([T, "peer,storage", "--mode", "async", "--storage-every", "2", "--ranks-per-node", "2"],
     ["--tiers peer,storage with --mode async", "--storage-every 1"]),
    ([T, "peer", "--mode", "async", "--ranks-per-node", "2", "--staging-memory", "16MiB"],
     ["with --tiers peer", "allowed: --staging-memory state"]),
])
def test_refused_before_the_run_starts(tmp_path: Path, args: list[str], needles: list[str]
                                       ) -> None:
    refused_before_start(tmp_path, args, needles)


@pytest.mark.parametrize("table, needle", [
    ("use = ['memory', 'tape']", "[tiers] use: unknown tier 'tape'"),
    ("use = ['memory']\nstorage_every = 0", "[tiers] storage_every = 0 must be an integer >= 1"),
    ("use = ['peer']\nreplicas = 2", "[tiers] unknown key 'replicas'"),
    ("use = ['peer']\nplacement = 'star'", "[tiers] placement = 'star' is not allowed"),
    ("use = ['peer']\npeer_transport = 'rdma'",
     "[tiers] peer_transport = 'rdma' is not allowed; allowed: auto, tcp"),
])
def test_bad_tiers_tables_name_their_key(tmp_path: Path, table: str, needle: str) -> None:
    workload = tmp_path / "w.toml"
    workload.write_text(TINY.read_text() + f"\n[tiers]\n{table}\n")
    r = ckptbench("run", str(workload), "--target", str(tmp_path / "t"), cwd=tmp_path)
    one_line(r, 2, needle)
    assert not (tmp_path / "t").exists()
