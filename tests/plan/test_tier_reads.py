"""A tier restart onto another layout (issue 32, 4b): DCP's load plan as ranged reads of
the tiers' copies. Each read lands on the saved chunk's bytes in the copy of the process
that saved it (checked against the payload generator's bytes for that chunk), every
restore rank reads what the restore plan gives it, and merging keeps every byte."""

from __future__ import annotations

import numpy as np
import pytest

from ckptbench.formats.base import file_jobs
from ckptbench.payload import PayloadGenerator, Region
from ckptbench.plan import build_plan
from ckptbench.plan.restore import build_restore_plan
from ckptbench.plan.tier_reads import (
    CopyRead,
    chunk_reads,
    copy_offsets,
    merged_ranges,
    reshards,
)
from ckptbench.spec import parse_workload

CUSTOM = {
    "model": {"name": "custom", "layers": 2, "dim": 256, "heads": 8, "kv_heads": 4,
              "ffn_dim": 688, "vocab_size": 1000},
    "parallel": {"world_size": 4, "layout": "fsdp2", "tp": 2},
}


def copies(plan, ranks_of: list[list[int]]) -> list[np.ndarray]:
    """Each process's copy as runner.tiers writes it: its ranks' files, filled, in order."""
    gen = PayloadGenerator("random", 3)
    out = []
    for ranks in ranks_of:
        jobs = file_jobs(plan, ranks, "tiers", 1, 3)
        data = np.zeros(sum(j.size for j in jobs), dtype=np.uint8)
        at = 0
        for j in jobs:
            gen.fill(j.base, j.regions, 0, data[at:at + j.size])
            at += j.size
        out.append(data)
    return out


@pytest.mark.parametrize(("restore", "ranks_of"), [
    ({"world_size": 2, "tp": 1}, [[0], [1], [2], [3]]),
    ({"world_size": 8, "dp_replicate": 2}, [[0, 1], [2, 3]]),
    ({"world_size": 4, "tp": 4}, [[0, 1, 2, 3]]),
])
def test_every_read_lands_on_its_saved_chunk_in_the_owners_copy(restore, ranks_of) -> None:
    plan = build_plan(parse_workload({**CUSTOM, "restore": restore}))
    rplan = build_restore_plan(plan)
    assert reshards(rplan, plan)
    held = copies(plan, ranks_of)
    owners = copy_offsets(plan, ranks_of)
    assert sorted(owners) == list(range(plan.n_files))
    jobs = {j.index: j for ranks in ranks_of for j in file_jobs(plan, ranks, "tiers", 1, 3)}
    gen = PayloadGenerator("random", 3)
    for r in range(rplan.world_size):
        reads = chunk_reads(rplan, [r], owners)
        assert sum(rd.nbytes for rd in reads) == rplan.rank_bytes()[r]
        assert [rd.dest for rd in reads] == np.cumsum([0] + [rd.nbytes for rd in reads])[:-1].tolist()
        for rd in reads:
            region = next(g for g in jobs[rd.file].regions if g.start == rd.offset)
            assert region.end - region.start == rd.nbytes
            want = gen.expected(jobs[rd.file].base, Region(region.start, region.end,
                                                           region.key, region.dtype))
            assert np.array_equal(held[rd.owner][rd.at:rd.at + rd.nbytes], want), rd


def test_the_save_layout_does_not_reshard() -> None:
    plan = build_plan(parse_workload(CUSTOM))
    assert not reshards(build_restore_plan(plan), plan)
    assert not reshards(None, plan)


def test_merged_ranges_keep_every_byte_and_merge_only_what_continues() -> None:
    reads = [CopyRead(1, 0, 10, 0, 0, 0), CopyRead(1, 10, 5, 0, 10, 10),  # continues
             CopyRead(2, 15, 5, 1, 0, 15),  # another owner
             CopyRead(2, 30, 5, 1, 15, 20),  # a gap in the copy
             CopyRead(2, 35, 5, 1, 20, 25)]
    ranges = merged_ranges(reads)
    assert [(g.owner, g.at, g.nbytes, g.dest) for g in ranges] == [
        (1, 0, 15, 0), (2, 15, 5, 15), (2, 30, 10, 20)]
    assert merged_ranges([]) == []


def test_a_file_no_process_saved_is_named() -> None:
    plan = build_plan(parse_workload({**CUSTOM, "restore": {"world_size": 2, "tp": 1}}))
    rplan = build_restore_plan(plan)
    owners = copy_offsets(plan, [[0], [1]])  # a subset: ranks 2 and 3 saved nothing
    with pytest.raises(KeyError) as exc:
        chunk_reads(rplan, [0, 1], owners)
    assert exc.value.args[0] in plan.file_paths
