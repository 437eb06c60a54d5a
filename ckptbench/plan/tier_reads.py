"""A tier restart onto another layout: DCP's load plan read from the tiers' copies.

A tier copy is one process's shard: the files of its plan ranks, in plan order, end to
end (runner.tiers writes them so). When the restore layout (``[restore]``) differs from
the save's, each restarted process's restore ranks read what DCP's load planner gives them
(plan.restore: every overlapping saved chunk, whole), and each such chunk lies at a known
offset of the copy of the process that saved it. So a load plan becomes ranged reads of
copies: (owner process, offset in its copy, bytes, where it goes in the reader's memory),
with neighbouring chunks of one copy that land next to each other merged into one range.
Which copy of an owner serves a reader (its own node's, or a peer's over the network) is
the runner's choice; this is the arithmetic only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.plan.core import Plan
from ckptbench.plan.restore import RestorePlan


@dataclass(frozen=True)
class CopyRead:
    """One saved chunk a restore rank reads: file `file` at `offset` (its manifest
    position), `nbytes` long, from `owner`'s copy at `at`, into the reader's memory at
    `dest`."""

    owner: int
    at: int
    nbytes: int
    file: int
    offset: int
    dest: int


@dataclass(frozen=True)
class CopyRange:
    """Bytes [at, at + nbytes) of `owner`'s copy into the reader's memory at `dest`."""

    owner: int
    at: int
    nbytes: int
    dest: int


def copy_offsets(plan: Plan, ranks_of: list[list[int]]) -> dict[int, tuple[int, int]]:
    """Every saved file: (the process whose copy holds it, its offset in that copy).
    `ranks_of[p]`: process p's plan ranks (its copy is their files in plan order)."""
    out: dict[int, tuple[int, int]] = {}
    for proc, ranks in enumerate(ranks_of):
        at = 0
        for r in ranks:
            for f in plan.files_of_rank(r):
                out[int(f)] = (proc, at)
                at += int(plan.file_bytes[f])
    return out


def chunk_reads(rplan: RestorePlan, restore_ranks: list[int],
                owners: dict[int, tuple[int, int]]) -> list[CopyRead]:
    """The chunks restore ranks `restore_ranks` read (DCP's order, empty chunks skipped),
    each placed in its owner's copy and packed end to end in the reader's memory. A file
    no process's copy holds (a subset run) is a KeyError naming its path."""
    plan = rplan.save
    out: list[CopyRead] = []
    dest = 0
    for r in restore_ranks:
        chunks = rplan.reads_of_rank(r)
        sizes = plan.chunk_nbytes[chunks]
        for i, n in zip(chunks[sizes > 0].tolist(), sizes[sizes > 0].tolist(), strict=True):
            f = int(plan.chunk_file[i])
            if f not in owners:
                raise KeyError(plan.file_paths[f])
            owner, base = owners[f]
            offset = int(plan.chunk_file_offset[i])
            out.append(CopyRead(owner, base + offset, int(n), f, offset, dest))
            dest += int(n)
    return out


def merged_ranges(reads: list[CopyRead]) -> list[CopyRange]:
    """`reads` as ranges of copies: a read that continues the previous one in both its
    owner's copy and the reader's memory extends it."""
    out: list[CopyRange] = []
    for rd in reads:
        last = out[-1] if out else None
        if (last is not None and last.owner == rd.owner and last.at + last.nbytes == rd.at
                and last.dest + last.nbytes == rd.dest):
            out[-1] = CopyRange(last.owner, last.at, last.nbytes + rd.nbytes, last.dest)
        else:
            out.append(CopyRange(rd.owner, rd.at, rd.nbytes, rd.dest))
    return out


def reshards(rplan: RestorePlan | None, plan: Plan) -> bool:
    """Whether a restart reads onto another layout than the save's (a restore plan onto a
    differing ``[restore]``)."""
    return rplan is not None and rplan.layout != plan.workload.parallel
