"""A process or node restart onto the restore layout, read from the tiers' copies.

When ``[restore]`` gives another layout than the save's, a restarted process does what
DCP's load planner asks of its restore ranks: every saved chunk that overlaps their
pieces, whole (plan.restore). Each chunk lies in the copy of the process that saved it
(plan.tier_reads), and the process reads it from the nearest surviving copy:

- a copy on its own node (that process's memory copy, or a replica held there): mapped and
  copied, as the memory tier's restart reads;
- else the owner's memory copy on its node, or a surviving peer's replica: fetched as
  ranges over the run's transport (TCP ``sendfile`` from the holder's file; MPI point to
  point, collective).

The baseline of each round moves the same bytes the same way from memory written before
the clock: a plain copy for the node's own ranges (each from bytes of its own, as the
read's come from distinct copies: ranges of one reused buffer would stay in the CPU's
caches), a plain transfer from the same holders for the fetched ones. Every chunk is then checked against the digest the save took of it
(process 0 keeps them, as a manifest does). A chunk no surviving copy holds is one line
naming its file.
"""

from __future__ import annotations

import statistics
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ckptbench.errors import RunFailed
from ckptbench.payload import digest
from ckptbench.plan.tier_reads import CopyRead, merged_ranges
from ckptbench.plan.tiers import TierPlan
from ckptbench.runner.tier_mpi import MpiPeers, Ranges, fetch_ranges
from ckptbench.runner.tier_peer import PLAIN_RANGES, RANGES, REPLICA_RANGES
from ckptbench.runner.tier_peer import fetch_ranges as fetch_ranges_tcp
from ckptbench.runner.tier_storage import StoragePart
from ckptbench.runner.tier_store import Copy, PlainDir, copy_name, read_ranges, touched

# A chunk's save digest by (file index, offset in the file).
ChunkDigests = dict[tuple[int, int], int]


@dataclass(frozen=True)
class Source:
    """The copy of `owner`'s shard a reader reads: held by process `holder` (the owner
    itself for its memory copy), a peer's `replica` or the owner's memory copy, on the
    reader's own node (`local`) or fetched."""

    owner: int
    holder: int
    replica: bool
    local: bool

    def describe(self, tp: TierPlan) -> str:
        if self.replica:
            return (f"the replica of process {self.owner} on node {tp.node_of[self.holder]} "
                    f"(process {self.holder})")
        return f"the memory copy of process {self.owner} on node {tp.node_of[self.owner]}"


def choose_source(tp: TierPlan, owner: int, node: int, lost: set[int]) -> Source | None:
    """The nearest surviving copy of `owner`'s shard for a reader on `node`: one on that
    node, else the owner's memory copy, else its first surviving replica (placement
    order); None when nodes `lost` took every copy."""
    found: list[Source] = []
    if tp.spec.has("memory") and tp.node_of[owner] not in lost:
        found.append(Source(owner, owner, False, tp.node_of[owner] == node))
    if tp.spec.has("peer"):
        found += [Source(owner, h, True, tp.node_of[h] == node) for h in tp.holders(owner)
                  if tp.node_of[h] not in lost]
    near = [s for s in found if s.local]
    best = near or found
    return best[0] if best else None


@dataclass
class ReshardRestart:
    """One process's restart onto the restore layout: where each owner's chunks come
    from, the memory they go to (allocated before the clock), the rounds' clock readings."""

    scenario: str
    it: int
    lost: set[int]
    reads: list[CopyRead]  # the chunks the tiers serve (their `dest`: in `data`)
    sources: dict[int, Source]  # owner -> the copy read
    data: np.ndarray
    # the plain copy's source: as large as `data`, written before the clock, each range
    # copied from its own bytes (as the read's come from distinct copies)
    source: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint8))
    stored: set[int] = field(default_factory=set)  # group: owners only storage holds
    part: StoragePart | None = None  # group: this process's storage read
    local: list[tuple[Copy, Ranges]] = field(default_factory=list)
    remote: list[tuple[Source, Ranges]] = field(default_factory=list)  # (holder, owner) order
    rounds: dict[str, list[tuple[int, int]]] = field(
        default_factory=lambda: {"read": [], "baseline": []})

    @property
    def local_bytes(self) -> int:
        return sum(n for _, rs in self.local for _, n, _ in rs)

    @property
    def remote_bytes(self) -> int:
        return sum(n for _, rs in self.remote for _, n, _ in rs)

    def requests(self) -> list[tuple[int, int, bool, list[tuple[int, int]]]]:
        """What this process asks of others: (holder, owner, replica, (offset, bytes)
        per range), in its order (an MPI holder serves them in the same order)."""
        return [(s.holder, s.owner, s.replica, [(at, n) for at, n, _ in rs])
                for s, rs in self.remote]


def plan_restart(scenario: str, it: int, lost: set[int], reads: list[CopyRead],
                 tp: TierPlan, proc: int, directory: PlainDir,
                 missing: Callable[[int, int], str], held: bool = True) -> ReshardRestart:
    """The restart's sources and ranges for process `proc` (its reads: `reads`; `held`:
    whether the tiers still hold checkpoint `it`). A chunk no copy holds is storage's in
    the group restart (its owner in ``stored``), else RunFailed with `missing(file,
    owner)`, the line naming it."""
    by_owner: dict[int, list[CopyRead]] = defaultdict(list)
    for rd in reads:
        by_owner[rd.owner].append(rd)
    sources: dict[int, Source] = {}
    stored: set[int] = set()
    for owner, mine in by_owner.items():
        src = choose_source(tp, owner, tp.node_of[proc], lost) if held else None
        if src is None and scenario == "group":
            stored.add(owner)
        elif src is None:
            raise RunFailed(missing(mine[0].file, owner), "missing")
        else:
            sources[owner] = src
    reads = _packed([rd for rd in reads if rd.owner not in stored])
    local: dict[int, Ranges] = defaultdict(list)
    for rg in merged_ranges(reads):
        local[rg.owner].append((rg.at, rg.nbytes, rg.dest))
    total = sum(rd.nbytes for rd in reads)
    r = ReshardRestart(scenario, it, lost, reads, sources, np.empty(0, dtype=np.uint8),
                       stored=stored)
    for owner, rs in local.items():
        src = sources[owner]
        if src.local:
            r.local.append((directory / copy_name(owner, it, replica=src.replica), rs))
        else:
            r.remote.append((src, rs))
    r.remote.sort(key=lambda x: (x[0].holder, x[0].owner))
    r.data = touched(total)  # before the clock, as a framework builds its model first
    if r.local:
        r.source = touched(total)
    return r


def _packed(reads: list[CopyRead]) -> list[CopyRead]:
    """`reads` end to end in the reader's memory (those storage serves taken out)."""
    out, dest = [], 0
    for rd in reads:
        out.append(replace(rd, dest=dest))
        dest += rd.nbytes
    return out


class Mover:
    """Moves a restart's ranges, read or baseline: the node's own ranges in a thread beside
    the fetches (TCP: a thread per holder; MPI: collective, on the calling thread)."""

    def __init__(self, proc: int, directory: PlainDir, plain: np.ndarray,
                 addresses: list[tuple[str, int]], mpi: MpiPeers | None) -> None:
        self.proc, self.dir, self.plain = proc, directory, plain
        self.addresses, self.mpi = addresses, mpi
        self.asked: list[list[tuple[int, int, bool, list[tuple[int, int]]]]] = []

    def move(self, r: ReshardRestart, plain: bool, error: str | None, mpi: bool = True,
             rest: bool = True) -> list[str]:
        """One round into `r.data` (`plain`: the baseline); the copies that were missing.
        Under MPI the exchange is entered after an `error` too, as it was asked for (nothing
        else is). `mpi`,
        `rest`: whether to run the MPI exchange, and the rest (the node's own ranges and
        TCP fetches): the group restart runs the exchange on the main thread first, the
        rest beside the storage read."""
        missing: list[str] = []
        errors: list[BaseException] = []

        def guarded(fn: Any, *args: Any) -> None:
            try:
                fn(*args)
            except BaseException as exc:
                errors.append(exc)

        threads = [] if error or not rest else [threading.Thread(target=guarded, args=(
            self._local, r, plain), daemon=True)]
        if not error and rest and self.mpi is None:
            for src, rs in r.remote:
                threads.append(threading.Thread(target=guarded, args=(
                    self._fetch_tcp, r, src, rs, plain, missing), daemon=True))
        for t in threads:
            t.start()
        if self.mpi is not None and mpi:
            guarded(self._fetch_mpi, r, plain, missing)
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return missing

    def _local(self, r: ReshardRestart, plain: bool) -> None:
        for path, rs in r.local:
            if plain:
                for _, n, dest in rs:
                    np.copyto(r.data[dest:dest + n], r.source[dest:dest + n])
            else:
                read_ranges(path, rs, r.data)

    def _fetch_tcp(self, r: ReshardRestart, src: Source, rs: Ranges, plain: bool,
                   missing: list[str]) -> None:
        op = PLAIN_RANGES if plain else REPLICA_RANGES if src.replica else RANGES
        if not fetch_ranges_tcp(self.addresses[src.holder], op, src.owner, r.it, rs, r.data):
            missing.append(f"process {src.holder} has no copy of process {src.owner}'s "
                           "shard")

    def _fetch_mpi(self, r: ReshardRestart, plain: bool, missing: list[str]) -> None:
        assert self.mpi is not None
        serves: list[tuple[int, Copy | np.ndarray, Ranges]] = []
        for reader, asks in enumerate(self.asked):
            for holder, owner, replica, ranges in asks:
                if holder == self.proc:
                    src: Copy | np.ndarray = (self.plain if plain else
                                              self.dir / copy_name(owner, r.it, replica))
                    serves.append((reader, src, [(at, n, 0) for at, n in ranges]))
        # A holder sends what it has whatever happened here: after an `error` too, every
        # range asked for is received (into memory no one checks), or its send never ends.
        wants = [(s.holder, rs) for s, rs in r.remote]
        ok = fetch_ranges(self.mpi, serves, wants, r.data)
        missing += [f"process {s.holder} has no copy of process {s.owner}'s shard"
                    for (s, _), fine in zip(r.remote, ok, strict=True) if not fine]


def first_bad_chunk(r: ReshardRestart, expected: ChunkDigests) -> CopyRead | None:
    """The first chunk whose bytes do not have the save's digest (None: all match)."""
    for rd in r.reads:
        if digest(r.data[rd.dest:rd.dest + rd.nbytes]) != expected.get((rd.file, rd.offset)):
            return rd
    return None


def reshard_record(r: ReshardRestart, tp: TierPlan, offset: int, verify_s: float,
                   restore_ranks: list[int], verified: bool = True) -> dict[str, Any]:
    """The restore record's fields. `tier`: storage when storage served some of its
    chunks (the group restart; `verified`: the run's --verify, as the format checked
    them), memory when every byte came from copies on the process's own node that are
    memory copies, else peer (a replica, or bytes over the network)."""
    reads = [(b - a) / 1e9 for a, b in r.rounds["read"]]
    bases = [(b - a) / 1e9 for a, b in r.rounds["baseline"]]
    first = r.rounds["read"][0]
    used = sorted({s.holder for s in r.sources.values()})
    peer = r.remote_bytes > 0 or any(s.replica for s in r.sources.values())
    baseline = " + ".join(x for x, n in (("plain copy", r.local_bytes),
                                        ("plain transfer", r.remote_bytes)) if n)
    stored = r.part.bytes if r.part is not None else 0
    one = used[0] if len(used) == 1 and not stored else None
    return {"tier": "storage" if stored else "peer" if peer else "memory",
            "from_node": tp.node_of[one] if one is not None else None,
            "from_process": one, "from_processes": used,
            "bytes": int(r.data.nbytes) + stored, "local_bytes": r.local_bytes,
            "remote_bytes": r.remote_bytes, "storage_bytes": stored,
            "start_ns": first[0] + offset, "end_ns": first[1] + offset,
            "seconds": statistics.median(reads), "rounds_s": reads,
            "verify_s": verify_s, "verified": verified or not stored,
            # a storage read has no baseline: a process it served in part has none
            "baseline_s": statistics.median(bases) if bases and not stored else 0.0,
            "baseline_rounds_s": [] if stored else bases,
            "baseline": None if stored else baseline or "plain copy",
            "reads": "dcp plan", "restore_ranks": restore_ranks}
