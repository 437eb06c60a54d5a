"""What each process does before the first byte of a restore, estimated before the run
starts: building the jobs of its restore ranks' reads (one object per read,
ckptbench.formats.ranged.restore_jobs) happens under the --stall-timeout watch, so a
restore layout far larger than the run (1,048,576 ranks) would sit at 0 B and then be
stopped as stalled. Refused up front, or said, instead."""

from __future__ import annotations

import numpy as np

from ckptbench.errors import SpecError
from ckptbench.plan.bounds import MEMORY_SHARE, available_memory
from ckptbench.plan.restore import restore_plan_of
from ckptbench.plan.restore_ranks import restoring_ranks
from ckptbench.runner.options import RunRequest
from ckptbench.runner.session import Launcher
from ckptbench.runner.threads import cores
from ckptbench.units import format_size

# Per read: measured 5.2 us of CPU and 311 bytes (tiny.toml on 1,048,576 restore ranks,
# the development VM); the time is taken low (a faster core), so "or more" holds.
SETUP_S_PER_READ = 1.5e-6
SETUP_BYTES_PER_READ = 320
SETUP_NOTICE_S = 1.0


def restore_setup(req: RunRequest, launch: Launcher) -> str:
    """Before the first byte of each restore, every process builds the jobs of its restore
    ranks' reads: refused in one line when that would take past --stall-timeout (the run
    would stop as stalled, minutes in) or more memory than this machine has; said when it
    takes a second or more; '' otherwise."""
    rplan = restore_plan_of(req.plan)
    ranks = req.ranks
    restoring = np.asarray(restoring_ranks(ranks, req.plan.world_size, rplan.world_size),
                           dtype=np.int64)
    if not len(restoring):
        return ""
    # The processes take the restoring ranks in contiguous groups, one per plan rank
    # (plan.restore_ranks.restore_positions); the busiest sets the time.
    csum = np.concatenate([[0], np.cumsum(np.diff(rplan.rank_ptr)[restoring])])
    q, r = divmod(len(restoring), len(ranks))
    ends = np.cumsum(np.array([q + 1] * r + [q] * (len(ranks) - r), dtype=np.int64))
    per_group = csum[ends] - csum[np.concatenate([[0], ends[:-1]])]
    busiest, total = int(per_group.max()), int(csum[-1])
    local = launch.kind == "local"
    here = len(ranks) if local else 1  # processes on this host (MPI: one known)
    seconds = busiest * SETUP_S_PER_READ * (max(1.0, here / cores()) if local else 1.0)
    world = rplan.world_size
    who = (f"{len(restoring):,} restore ranks" + (f" of the restore layout's {world:,}"
                                                   if len(restoring) != world else "")
           + f" by {len(ranks):,} process(es)")
    fix = ("a smaller restore layout (--restore-world-size, --restore-layout, [restore]), "
           "a subset run (--ranks), or --no-restore")
    stall = req.options.stall_timeout
    if stall > 0 and seconds > stall:
        raise SpecError(f"restoring {who}: the busiest sets up {busiest:,} reads before its "
                        f"first byte, an estimated {seconds:,.0f} s or more, past "
                        f"--stall-timeout {stall:g} s (the run would stop as stalled); "
                        f"allowed: a --stall-timeout above that (or off), {fix}")
    if local:
        need = total * SETUP_BYTES_PER_READ
        have = available_memory()
        if need > MEMORY_SHARE * have:
            raise SpecError(f"restoring {who}: they set up {total:,} reads before the first "
                            f"byte, an estimated {format_size(need)} of memory; allowed: at "
                            f"most {format_size(int(MEMORY_SHARE * have))} ({MEMORY_SHARE:.0%}"
                            f" of the {format_size(have)} this machine has available), {fix}")
    if seconds < SETUP_NOTICE_S:
        return ""
    return (f"restoring {who}: the busiest sets up {busiest:,} reads before the first byte "
            f"of each restore, an estimated {seconds:,.0f} s or more (progress shows 0 B "
            "until then)")
