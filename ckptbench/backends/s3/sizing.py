"""Default part size, parts in flight and ranged-GET size, chosen from the object's size,
the runner's threads and the ranks on this host (docs/s3.md, "Defaults"), so that a run
with no S3 flags keeps enough bytes in flight to measure the store, not the client.

Why these numbers: one S3 request moves at most a few hundred MB/s, so a host needs tens of
requests in flight to fill a 100-400 Gb/s NIC; every request costs the client (and the
server) a fixed amount of CPU, so fewer, larger requests cost less per byte; and a rank's
objects should be in flight whole when they fit (the checkpoint files of one rank are
written and read one after the other by each runner thread).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ckptbench.backends.s3.options import MAX_PART, MAX_PARTS, MIB, MIN_PART
from ckptbench.backends.s3.readahead import LARGE_HELD, SMALL_HELD

HOST_IN_FLIGHT = 32  # requests in flight per host, shared by its ranks, ...
CPU_IN_FLIGHT = 2  # ... and at most 2 per CPU: one rank on a 2-CPU box spent 10-25% more
# CPU per GB with 8 in flight than with 4, at the same speed; 16 starved its sends
RANK_IN_FLIGHT = (4, 16)  # ... but at least 4 and at most 16 per rank
SINGLE_PUT_MAX = 64 * MIB  # an object up to this size is one PUT (one GET on restore)
PART_RANGE = (16 * MIB, 64 * MIB)  # parts (and read-ahead ranges) of a larger object
_LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
                    "PMI_LOCAL_SIZE")


def ranks_per_host(hint: int) -> int:
    """The ranks sharing this host: the MPI launcher's local size where it says so, else
    the runner's hint (all ranks of a local launch share the host)."""
    for var in _LOCAL_SIZE_VARS:
        value = os.environ.get(var, "").split("(")[0]
        if value.isdigit() and int(value) > 0:
            return int(value)
    return max(1, hint)


@dataclass(frozen=True)
class Sizing:
    """Requests in flight per object and part sizes: given ones, or chosen (None)."""

    part_size: int | None  # --part-size; None: chosen per object
    concurrency: int | None  # --s3-concurrency; None: chosen from ranks and threads
    threads: int = 1
    ranks_per_host: int = 1
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)

    @property
    def in_flight(self) -> int:
        """Requests in flight per object (multipart parts, parallel ranged GETs)."""
        if self.concurrency is not None:
            return self.concurrency
        low, high = RANK_IN_FLIGHT
        host = min(HOST_IN_FLIGHT, CPU_IN_FLIGHT * self.cpus)
        per_rank = min(high, max(low, -(-host // self.ranks_per_host)))
        return max(1, -(-per_rank // self.threads))

    @property
    def base_part(self) -> int:
        """The part size buffers are pooled at (the given one, else the largest chosen)."""
        return self.part_size if self.part_size is not None else PART_RANGE[1]

    def part_for(self, size: int) -> int:
        """The part size of an object of `size` bytes: an object of at most one part is a
        single PUT. Raised for objects that would need more than 10,000 parts."""
        if self.part_size is not None:
            part = self.part_size
        elif size <= SINGLE_PUT_MAX:
            part = max(size, MIN_PART)
        else:  # the whole object in flight at once where parts of 16-64 MiB allow it
            low, high = PART_RANGE
            part = min(high, max(low, _round_mib(-(-size // self.in_flight))))
        need = -(-size // MAX_PARTS)
        return min(MAX_PART, max(part, _round_mib(need)))

    def buffer_bytes(self, read_range: int) -> int:
        """The most memory one process's transfers hold, counted in the run's memory bound:
        an upload part per part in flight and one more, a range per ranged GET a lane holds
        (in flight or done: readahead.Lane) and one more (`read_range` bytes), and a restore
        plan's small GETs."""
        in_flight = self.in_flight * self.threads
        return ((in_flight + 1) * self.base_part + (LARGE_HELD * in_flight + 1) * read_range
                + self.threads * SMALL_HELD)

    def describe(self) -> dict[str, object]:
        return {"part_size": self.part_size if self.part_size is not None else "auto",
                "concurrency": self.in_flight,
                "concurrency_chosen": self.concurrency is None,
                "ranks_per_host": self.ranks_per_host}


def _round_mib(n: int) -> int:
    return -(-n // MIB) * MIB
