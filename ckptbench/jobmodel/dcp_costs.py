"""Torch DCP's costs that grow with the job, measured: what the job model charges for the
parts of C and R that a small run cannot show at the job's size.

* The save's **coordinator** (``DCP_SAVE_COORDINATOR``): at every save DCP's coordinator
  (rank 0) gathers every rank's local plan, deduplicates them, builds the global plan and
  the ``Metadata`` of every chunk, validates it, scatters the plans back, gathers the
  write results, indexes every chunk's storage, pickles and writes ``.metadata`` and
  broadcasts the ``Metadata`` to every rank: work that grows with the chunk count and
  that no other rank shares. ``benchmarks/dcp_coordinator_cost.py`` times these steps
  on rank 0 of real ``torch.distributed.checkpoint.save`` calls in a gloo process group
  (collectives included) at increasing chunk counts; ``seconds = b * chunks^k`` is
  fitted to the coordinator's CPU seconds (k = 1.064: the CPU per chunk grows slowly
  with the chunks; the log of the run: benchmarks/results/2026-12-07-dcp-coordinator.md).
  With plan caching on, a save after the first skips the planning (``DCP_SAVE_CACHED``).
  Then every rank receives and unpickles the broadcast ``Metadata``
  (``DCP_SAVE_BROADCAST``).
* The load's **planning** (``DCP_LOAD_COORDINATOR``): the coordinator's gather of every
  rank's load plan, the global load plan and its scatter, timed the same way in real
  ``dcp.load`` calls (planning only: the data is not read); and every rank's unpickle of
  the ``.metadata`` it read (``DCP_METADATA_DECODE``).
* The **.metadata read** (``METADATA_READERS``): DCP's load has every rank read
  ``.metadata`` itself, so the read grows with the restoring ranks and the file's size.
  ``benchmarks/metadata_readers.py`` read a ``.metadata``-sized file with 1 to 8
  concurrent cold readers (each its own copy: readers that share no cache) and fitted
  the slowest reader's time against the readers; its slope per byte is the storage's
  seconds per reader per byte (the inverse of the aggregate bandwidth the readers
  shared). :func:`metadata_read` charges each job node's readers beyond a run node's
  with it (the storage growing with the nodes, as the data's does), or the job's readers'
  bytes over the aggregate bandwidth when one is given.

Every model keeps the range it was fitted over, and :meth:`CostModel.fit_range` says how
far past it a job lies: the answer prints it beside every figure extrapolated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ckptbench.units import format_bytes, format_rate


def count(n: float) -> str:
    """A count in a few characters: 7.3k, 326k, 2.8M."""
    if n < 1e3:
        return f"{n:.0f}"
    if n < 1e6:
        return f"{n / 1e3:.3g}k"
    return f"{n / 1e6:.3g}M"


def _past(value: float, lo: float, hi: float, what: str) -> str:
    fitted = f"fitted {count(lo)}-{count(hi)} {what}"
    if value > hi:
        return f"{fitted}; the job has {count(value)}: {value / hi:.3g}x past it"
    if value < lo:
        return f"{fitted}; the job has {count(value)}: below it"
    return f"{fitted}; the job's {count(value)} within it"


@dataclass(frozen=True)
class CostModel:
    """seconds = a + b * chunks^exponent, the chunk counts it was fitted over, and its
    source."""

    a_s: float
    b_s_per_chunk: float
    what: str
    source: str
    fitted: tuple[int, int] = (0, 0)  # the lowest and highest chunk count fitted
    exponent: float = 1.0

    def seconds(self, chunks: int) -> float:
        return max(self.a_s + self.b_s_per_chunk * math.pow(chunks, self.exponent), 0.0)

    def describe(self) -> str:
        if self.exponent != 1.0:
            hi = self.fitted[1]
            return (f"{self.what}: {self.b_s_per_chunk:.4g} s x chunks^{self.exponent:.4g}"
                    f" ({self.seconds(hi) / hi * 1e6:.3g} us per chunk at {count(hi)}),"
                    f" {self.source}")
        return (f"{self.what}: {self.a_s:.3g} s + {self.b_s_per_chunk * 1e6:.3g} us per chunk,"
                f" {self.source}")

    def fit_range(self, chunks: int) -> str:
        """Where `chunks` lies against the fitted range ("fitted 7.28k-1M chunks; the job
        has 2.81M: 2.81x past it")."""
        return _past(chunks, *self.fitted, "chunks")


@dataclass(frozen=True)
class ReadersModel:
    """Concurrent readers of one file: each reader beyond the first adds
    ``s_per_reader_per_byte`` x the file's bytes to the slowest reader's time."""

    s_per_reader_per_byte: float
    fitted: tuple[int, int]  # the reader counts measured
    measured_bytes: int  # the file's size in the measurement
    source: str

    @property
    def aggregate_bytes_per_s(self) -> float:
        return 1.0 / self.s_per_reader_per_byte

    def fit_range(self, readers: int) -> str:
        return _past(readers, *self.fitted, "readers")


SOURCE = ("real torch.distributed.checkpoint.save/load, torch 2.15.0, CPython 3.11.7, gloo"
          " groups of 4 processes (2 and 8 at 7k and 56k chunks; the 1M point planning only),"
          " CPU seconds on a 2-vCPU AMD EPYC VM shared with other jobs, 2026-12-07")

# DefaultSavePlanner(enable_plan_caching=False), DCP's default: every save plans anew.
# CPU grows slightly faster than the chunks (k 1.065 fitted on 7k-326k alone, which
# predicted the 1M point within 4 %).
DCP_SAVE_COORDINATOR = CostModel(0.0, 7.8126e-05, "DCP's save coordinator (rank 0), plan"
                                 " caching off",
                                 SOURCE, (7_275, 1_000_000), exponent=1.0639)
# real dcp.save's coordinator CPU seconds, the medians of the saves that planned (chunks,
# seconds; benchmarks/results/2026-12-07-dcp-coordinator.md): the model is within 25 %
MEASURED_SAVE: tuple[tuple[int, float], ...] = (
    (7_275, 0.92), (56_000, 10.14), (120_000, 16.79), (325_876, 51.52), (1_000_000, 197.11))
# enable_plan_caching=True, a save after the first with unchanged plans: the ranks send
# empty plans and the coordinator reuses its cached global plan; the write results are
# still gathered, .metadata still indexed, pickled, written and broadcast.
DCP_SAVE_CACHED = CostModel(-0.182, 47.64e-6, "plan caching on, a save after the first",
                            SOURCE, (7_275, 325_876))
# After a save every rank receives the Metadata the coordinator broadcasts and unpickles it
# (dcp.save returns then): rank 1's CPU seconds in the broadcast.
DCP_SAVE_BROADCAST = CostModel(0.059, 24.05e-6, "every rank's receipt of the broadcast"
                               " Metadata (rank 1)", SOURCE, (7_275, 1_000_000))
# Before a load every rank reads and unpickles .metadata (FileSystemReader.read_metadata):
# rank 0's CPU seconds there, the file cold (its read's wait is the storage's: see
# METADATA_READERS).
DCP_METADATA_DECODE = CostModel(-0.152, 25.93e-6, "every rank's read and unpickle of"
                                " .metadata (rank 0, CPU)",
                                SOURCE, (7_275, 1_000_000))
# DefaultLoadPlanner: the coordinator's gather of the load plans, the global plan (a pass
# through), the scatter; the .metadata read is apart (METADATA_READERS, DCP_METADATA_DECODE).
DCP_LOAD_COORDINATOR = CostModel(-0.120, 84.84e-6, "DCP's load planning on the coordinator"
                                 " (rank 0)",
                                 SOURCE, (7_275, 1_000_000))

# benchmarks/results/2026-12-07-metadata-readers.md: the slowest of n readers = -0.363 s
# + 0.470 s x n for a 484,735,884-byte file (8 trials per point; 8 readers: 3.71 s,
# 1.05 GB/s in all); 0.470 s / 484,735,884 bytes per reader.
METADATA_READERS = ReadersModel(
    9.706e-10, (1, 8), 484_735_884,
    "benchmarks/metadata_readers.py: 1-8 concurrent cold readers (fadvise) of their own copy"
    " of a 462 MiB file on the development VM's ext4 on a virtio disk, 2026-12-07")


def at_size(measured_s: float, run_bytes: float | None, nbytes: float | None,
            rate: float | None, rate_is: str = "per-rank") -> tuple[float, str]:
    """A metadata read or write the run timed on `run_bytes`, at the job's `nbytes`: the
    time measured plus the bytes beyond the run's at `rate` (the run's measured per-rank
    rate: a small file's time is mostly latency, which does not grow with its bytes), or
    per byte without a rate or for a smaller file. (seconds, how)"""
    if not (run_bytes and nbytes) or run_bytes == nbytes:
        return measured_s, ""
    if nbytes > run_bytes and rate:
        return (measured_s + (nbytes - run_bytes) / rate,
                f"{measured_s:.3g} s measured on the run's {format_bytes(run_bytes)} + the job's"
                f" {format_bytes(nbytes - run_bytes)} more at the run's {rate_is} rate"
                f" {format_rate(rate)}")
    return (measured_s * nbytes / run_bytes,
            f"{measured_s:.3g} s measured on the run's {format_bytes(run_bytes)}, per byte at"
            f" the job's {format_bytes(nbytes)}")


@dataclass(frozen=True)
class MetadataRead:
    """The job's .metadata read: the run's slowest read at the job's size (measured) and
    what the job's many more readers add (modelled)."""

    measured_s: float
    fan_in_s: float
    readers: int
    run_readers: int
    nbytes: float
    run_bytes: float | None
    rule: str  # how the fan-in was charged, with its range
    sized: str = ""  # how the run's read was brought to the job's size
    ceiling: float | None = None  # the aggregate bandwidth given, if any
    shared_s: float | None = None  # without a ceiling: were every reader on the run's storage

    @property
    def seconds(self) -> float:
        return self.measured_s + self.fan_in_s

    def short(self) -> str:
        """The fan-in in a line: readers, bytes, the rate and the fit range."""
        total = f"{self.readers:,} readers x {format_bytes(self.nbytes)}"
        if self.ceiling:
            return f"{total} over --aggregate-bandwidth {format_rate(self.ceiling)}"
        return (f"{total}: each node's readers beyond the run's at the fitted"
                f" {format_rate(METADATA_READERS.aggregate_bytes_per_s)} per node (storage"
                " scaling with the nodes, as for the data)")

    def describe(self) -> str:
        size = f"{self.measured_s:.3g} s: the run's slowest of {self.run_readers} reads" + (
            f" ({self.sized})" if self.sized else "")
        shared = "" if self.shared_s is None else (
            f"; were all {self.readers:,} readers to share one storage as fast as the run's"
            f" (the fitted {format_rate(METADATA_READERS.aggregate_bytes_per_s)} aggregate)"
            f" the fan-in would be {self.shared_s:.3g} s: give --aggregate-bandwidth with"
            " your storage's")
        return (f"every restoring rank reads .metadata ({self.readers:,} readers of"
                f" {format_bytes(self.nbytes)}, {format_bytes(self.readers * self.nbytes)}"
                f" per restart): {size}; fan-in {self.fan_in_s:.3g} s ({self.rule}){shared}")


def metadata_read(measured_s: float, run_readers: int, run_bytes: float | None, readers: int,
                  nbytes: float | None, ceiling: float | None, rate: float | None = None,
                  ranks_per_node: int = 1, run_nodes: int = 1) -> MetadataRead:
    """The job's .metadata read from the run's (`measured_s`: its slowest of
    `run_readers` reads of `run_bytes` on `run_nodes` nodes): brought to the job's
    `nbytes` (:func:`at_size`, `rate` the run's per-rank read rate), then grown to
    `readers` readers. With an aggregate bandwidth `ceiling`: readers x bytes over it (at
    least the single read). Without one the storage is taken to grow with the nodes, as
    the data's is: each node's `ranks_per_node` readers share that node's slice, so the
    readers a job's node has beyond a run's node each add the fitted per-reader time of
    ``METADATA_READERS`` (measured 1-8 readers on one storage); what the fan-in would be
    were every reader on one storage as fast as the run's is kept beside it."""
    run_readers = max(run_readers, 1)
    nbytes = nbytes or run_bytes or 0.0
    one, sized = at_size(measured_s, run_bytes, nbytes, rate)
    r = METADATA_READERS
    if ceiling:
        total = readers * nbytes / ceiling
        return MetadataRead(one, max(one, total) - one, readers, run_readers, nbytes,
                            run_bytes, f"{readers:,} readers x {format_bytes(nbytes)} over the"
                            f" aggregate bandwidth {format_rate(ceiling)}: {total:.3g} s in all",
                            sized, ceiling)
    per_run_node = max(run_readers // max(run_nodes, 1), 1)
    extra = max(ranks_per_node - per_run_node, 0)
    rule = (f"each node's {ranks_per_node} readers, {extra} beyond a run node's {per_run_node},"
            f" x {format_bytes(nbytes)} at the fitted {r.s_per_reader_per_byte * 2**30:.3g} s"
            f" per reader per GiB ({r.source}; {r.fit_range(ranks_per_node)}); the storage"
            " assumed to grow with the nodes, as for the data")
    shared = max(readers - run_readers, 0) * nbytes * r.s_per_reader_per_byte
    return MetadataRead(one, extra * nbytes * r.s_per_reader_per_byte, readers, run_readers,
                        nbytes, run_bytes, rule, sized, None, shared)
