"""What a run will need, checked before anything is created: one line naming the option.

A benchmark must not take the machine down with it: ``--threads 1000`` once faulted in
gigabytes of read buffers for a 22 MiB checkpoint until the OOM killer came, and
``--block-size 1B`` turned a second's save into minutes of one-byte writes. So the block
size has a floor and a ceiling (and, for direct I/O, the backend's alignment: a block
that is not a multiple of it would be written as larger calls than recorded), threads
have a cap, and the buffers every process on one host will fault in (threads x blocks x
ranks, the prefill; each format's own estimate) must fit the memory the kernel says is
available there. In --mode async each process also holds its training state (host memory
without a GPU) and its staging memory (``--staging-memory``, at most the state): counted
too, and the refusal names them.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from ckptbench.backends.base import buffer_bytes_of
from ckptbench.errors import SpecError
from ckptbench.formats import format_class
from ckptbench.formats.manifest import manifest_bytes
from ckptbench.runner.async_mode import check_async, loop_memory_bytes
from ckptbench.runner.options import RunRequest
from ckptbench.units import format_size

if TYPE_CHECKING:
    from ckptbench.runner.session import Topology

MIN_BLOCK = 4 << 10
WORD = 8  # formats round a block up to whole 8-byte payload words (formats.base.Sizing)
MAX_BLOCK = 1 << 30
MAX_THREADS = 256  # I/O threads per plan rank
MAX_HOST_THREADS = 4096  # I/O threads of all ranks on one host
MEMORY_SHARE = 0.9  # of MemAvailable a run may plan to take
MEMINFO = Path("/proc/meminfo")


def check_options(req: RunRequest) -> None:
    """Refuse a block size or a thread count no run should use (the same on every
    process: raised everywhere alike)."""
    o = req.options
    align = max(1, req.backend.alignment)
    if align > 1 and o.block_size % align:
        raise SpecError(f"--block-size {o.block_size}: not a multiple of {align} bytes, the "
                        "alignment direct I/O needs (--io direct), so it would not be the size "
                        f"of the calls made; allowed: a multiple of {align}, e.g. 1MiB or 8MiB")
    if not MIN_BLOCK <= o.block_size <= MAX_BLOCK:
        raise SpecError(f"--block-size {format_size(o.block_size)}: allowed: "
                        f"{format_size(MIN_BLOCK)} to {format_size(MAX_BLOCK)}")
    if o.block_size % WORD:
        raise SpecError(f"--block-size {o.block_size}: not a multiple of {WORD} bytes (the "
                        "payload's word), so it would not be the size of the calls made; "
                        f"allowed: a multiple of {WORD}, e.g. 1MiB or 8MiB")
    if o.threads > MAX_THREADS:
        raise SpecError(f"--threads {o.threads}: allowed: 1 to {MAX_THREADS} I/O threads per rank")
    check_async(req.plan, o)


def mem_available() -> int | None:
    """The kernel's estimate of memory available without swapping (bytes); None where
    there is no /proc/meminfo."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_needs(req: RunRequest, topo: Topology) -> dict[str, tuple[int, int, int]]:
    """host -> (memory bytes, I/O threads, plan ranks) of the processes placed on it."""
    fmt = format_class(req.options.format)
    opts = req.options.format_options()
    needs: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for proc, (group, host) in enumerate(zip(topo.groups, topo.hosts, strict=True)):
        need = needs[host]
        need[0] += (fmt.memory_bytes(req.plan, group, opts, req.backend.alignment)
                    + buffer_bytes_of(req.backend))
        if proc == 0:  # the coordinator's manifest buffer (formats.manifest.ManifestWriter)
            need[0] += manifest_bytes(req.plan, req.options.format)
        need[1] += max(1, req.options.threads) * len(group)
        need[2] += len(group)
    return {h: (n[0], n[1], n[2]) for h, n in needs.items()}


def loop_needs(req: RunRequest, topo: Topology) -> dict[str, tuple[int, int]]:
    """host -> (state, staging) bytes of its processes' training loops (--mode async)."""
    needs: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for group, host in zip(topo.groups, topo.hosts, strict=True):
        state, staging = loop_memory_bytes(req.plan, group, req.options)
        needs[host][0] += state
        needs[host][1] += staging
    return {h: (n[0], n[1]) for h, n in needs.items()}


def resource_error(req: RunRequest, topo: Topology, available: int | None = None
                   ) -> SpecError | None:
    """Why the most loaded host cannot run its share (or None): too many threads, or
    buffers (and an async run's state and staging) that do not fit this host's available
    memory (hosts alike, as on a cluster; under MPI every process checks and the launcher
    agrees on the first refusal)."""
    needs = host_needs(req, topo)
    if not needs:
        return None
    o = req.options
    busiest = max(n[1] for n in needs.values())
    if busiest > MAX_HOST_THREADS:
        per_host = max(n[2] for n in needs.values())
        return SpecError(f"--threads {o.threads} x {per_host} ranks on one host = {busiest} I/O "
                         f"threads; allowed: at most {MAX_HOST_THREADS} per host (fewer "
                         "--threads or ranks)")
    loops = loop_needs(req, topo)
    host = max(needs, key=lambda h: needs[h][0] + sum(loops.get(h, (0, 0))))
    memory, _threads, ranks = needs[host]
    state, staging = loops.get(host, (0, 0))
    available = mem_available() if available is None else available
    if available is None or memory + state + staging <= MEMORY_SHARE * available:
        return None
    have = f"this host has {format_size(available)} available (MemAvailable)"
    buffers = (f"--threads {o.threads} x --block-size {format_size(o.block_size)} and --prefill "
               f"{format_size(o.prefill_bytes)} per rank")
    if state or staging:
        return SpecError(
            f"--mode async: {ranks} ranks on one host hold {format_size(state)} of training "
            f"state and --staging-memory {format_size(staging)} (at most the state) besides "
            f"{format_size(memory)} of I/O buffers ({buffers}); {have}; allowed: a smaller "
            "--staging-memory, a larger --scale or fewer ranks per host, or smaller buffers")
    transfers = buffer_bytes_of(req.backend)
    backend = (f", {format_size(transfers)} per process of them the {req.backend.name} backend's "
               "transfer buffers" if transfers else "")
    return SpecError(
        f"{buffers}, {ranks} ranks on one host, need about {format_size(memory)} of buffers "
        f"(--format {o.format}{backend}); {have}; allowed: fewer --threads, a smaller "
        "--block-size or --prefill, or fewer ranks per host")
