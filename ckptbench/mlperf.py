"""MLPerf Storage v2.0 side by side: the same run's records read the way MLPerf reports
them and the way ckptbench does, and the CLOSED-submission rules the run would break.

MLPerf Storage v2.0 (DLIO, ``mlperf_storage_v2.0``) writes N checkpoints, then reads
them (runner.sequence's writes-then-reads), and reports checkpointing as GiB/s (printed
as "GB/s"), the mean and population standard deviation (``np.std``) over the
checkpoints, each one the checkpoint's tensor bytes over **rank 0's** duration of its
own save or load (no closing barrier), without fsync (its ``fsync`` key is read under
another name), reads usually from the page cache and unverified. Here, rank 0's clock
without fsync is its span in the same (durable) run less its fsync calls: with one I/O
thread per rank they are consecutive calls on that clock. ckptbench's way: the throughput
``ckptbench run`` prints for the same records (``report.throughput``: the phase from the
first rank's first call to the manifest's commit, or from reading the manifest to the
last rank's last read), every file fsynced, reads cold, every chunk verified; here in
GiB/s, MLPerf's unit, so that the ratio compares like with like.

Both views come from the same op records, so their ratio says how much of a published
figure is the measurement method rather than the storage.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ckptbench.report import iteration_stats

GIB = 2**30
WORKLOADS = ("mlperf-llama3-8b", "mlperf-llama3-70b", "mlperf-llama3-405b", "mlperf-llama3-1t")
SUBSET_PROCS = 8  # mlpstorage's LLM_SUBSET_PROCS: the one process count subset mode allows
CHECKPOINTS = 10  # checkpoint.num_checkpoints_write / _read in the CLOSED configs
RUNS = 5  # a submission's figure is averaged over 5 runs
CACHE_RATIO = 3  # caches need no clearing when a client writes >= 3x its memory


@dataclass(frozen=True)
class Stat:
    """Per-checkpoint seconds and GiB/s of one phase in one way, and their mean and
    standard deviation, the population one (ddof 0) that DLIO reports (``np.std``)."""

    seconds: list[float]
    gibps: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.gibps) if self.gibps else 0.0

    @property
    def stdev(self) -> float:
        return statistics.pstdev(self.gibps) if self.gibps else 0.0


@dataclass(frozen=True)
class Comparison:
    """One phase both ways. ``mlperf``: rank 0's clock with its fsync time taken out (what
    DLIO v2.0, which issues none, would time); ``mlperf_with_fsync``: rank 0's clock as
    ckptbench ran it; ``ckptbench``: the throughput `ckptbench run` prints (the whole
    phase, slowest rank, commit included)."""

    phase: str
    mlperf: Stat
    mlperf_with_fsync: Stat
    ckptbench: Stat
    tensor_bytes: int
    container_bytes: int

    @property
    def ratio(self) -> float:
        """MLPerf-way GiB/s over ckptbench-way GiB/s (mean over checkpoints)."""
        return self.mlperf.mean / self.ckptbench.mean if self.ckptbench.mean else 0.0


def _rank_ops(r: dict[str, Any]) -> bool:
    return r.get("type") == "op" and r.get("rank", -1) >= 0 and r.get("thread", -1) >= 0


def compare(records: Iterable[dict[str, Any]], phase: str, tensor_bytes: int) -> Comparison:
    """`phase` ('save' or 'restore') of a run both ways. `tensor_bytes`: the checkpoint's
    tensor bytes on the ranks that ran (DLIO's numerator: its allreduced state size)."""
    records = list(records)
    ours = {i["iteration"]: i for i in iteration_stats(records) if i["phase"] == phase}
    by_it: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("type") == "op" and r.get("phase") == phase:
            by_it.setdefault(int(r["iteration"]), []).append(r)
    ml, mlf, ck = Stat([], []), Stat([], []), Stat([], [])
    container = 0
    for it in sorted(by_it):
        ops = by_it[it]
        rank_ops = [o for o in ops if _rank_ops(o)]
        if not rank_ops:
            continue
        first = min(o["rank"] for o in rank_ops)  # DLIO's rank 0: the first process that ran
        r0 = [o for o in rank_ops if o["rank"] == first]
        span0 = (max(o["end_ns"] for o in r0) - min(o["start_ns"] for o in r0)) / 1e9
        fsync0 = sum(o["end_ns"] - o["start_ns"] for o in r0 if o["op"] == "fsync") / 1e9
        container = sum(o["bytes"] for o in rank_ops)
        for stat, secs, nbytes in ((ml, span0 - fsync0, tensor_bytes),
                                   (mlf, span0, tensor_bytes)):
            stat.seconds.append(secs)
            stat.gibps.append(nbytes / GIB / secs if secs > 0 else 0.0)
        if it in ours:  # a successful iteration: the throughput `run` prints, in GiB/s
            ck.seconds.append(ours[it]["seconds"])
            ck.gibps.append(ours[it]["throughput_bytes_per_s"] / GIB)
    return Comparison(phase, ml, mlf, ck, tensor_bytes, container)


@dataclass(frozen=True)
class Rule:
    """One CLOSED-submission rule: its name, whether the run keeps it, and why."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.detail}"


@dataclass(frozen=True)
class RunFacts:
    """What the rules look at, from the request and the records."""

    workload: str
    world_size: int
    ranks: int
    scale: int
    iterations: int
    hosts: int
    host_memory_bytes: int  # per client
    bytes_per_host: int  # one checkpoint's bytes written per client
    files_written: int
    files_fsynced: int
    cache: str  # the restore records' cache method ('none' when not evicted)
    verified: bool
    sequence: str = "interleaved"  # the run's option (runner.sequence)
    writes_first: bool = False  # the records show every save ending before any restore


def _sequence_rule(f: RunFacts) -> Rule:
    """v2.0 writes all checkpoints, then reads them (DLIO's write loop, then its read
    loop); the run's option says which order ran, the records confirm it."""
    if f.sequence != "writes-then-reads":
        return Rule("closed.sequence", False,
                    f"--sequence {f.sequence}: each checkpoint written, evicted and read in "
                    f"turn; v2.0 writes all {f.iterations}, then reads them (writes-then-reads)")
    return Rule("closed.sequence", f.writes_first,
                f"all {f.iterations} checkpoints written, then read in the order written"
                if f.writes_first else
                "writes-then-reads asked for, but the records show a restore before a save ended")


def rules(f: RunFacts) -> list[Rule]:
    """The run against the v2.0 CLOSED rules (as mlpstorage and the rules document state
    them), one rule per line."""
    subset = f.ranks == SUBSET_PROCS and f.ranks < f.world_size
    cold = "drop_caches" in f.cache or "direct" in f.cache
    big = f.bytes_per_host >= CACHE_RATIO * f.host_memory_bytes
    ratio = f.bytes_per_host / f.host_memory_bytes if f.host_memory_bytes else 0.0
    return [
        Rule("closed.model", f.workload in WORKLOADS,
             f"workload {f.workload!r}; CLOSED runs one of {', '.join(WORKLOADS)}"),
        Rule("closed.full_size", f.scale == 1,
             f"--scale {f.scale}: model dimensions divided by {f.scale}" if f.scale != 1
             else "full-size model"),
        Rule("closed.process_count", f.ranks == f.world_size or subset,
             f"{f.ranks} of {f.world_size} ranks; CLOSED runs all {f.world_size} or, in subset "
             f"mode, exactly {SUBSET_PROCS}"),
        Rule("closed.num_checkpoints", f.iterations == CHECKPOINTS,
             f"{f.iterations} checkpoints written and read; CLOSED writes and reads {CHECKPOINTS}"),
        _sequence_rule(f),
        Rule("closed.fsync", f.files_written > 0 and f.files_fsynced == f.files_written,
             f"{f.files_fsynced} of {f.files_written} files fsynced (the rules require fsync; "
             "DLIO v2.0 issues none: its fsync key is read as checkpoint_fsync)"),
        Rule("closed.page_cache", big or cold,
             f"{f.bytes_per_host / GIB:.2f} GiB written per client = {ratio:.2f}x its "
             f"{f.host_memory_bytes / GIB:.1f} GiB memory; under {CACHE_RATIO}x the caches must "
             f"be cleared before reading (restore cache: {f.cache})"),
        Rule("closed.runs", False,
             f"one run; a submission reports the mean of {RUNS} runs"),
        Rule("closed.verification", f.verified,
             "every chunk read back verified (DLIO checks only that torch.load returned a "
             "non-empty dict)" if f.verified else "reads not verified"),
    ]


def facts(records: list[dict[str, Any]], *, workload: str, world_size: int, ranks: int,
          scale: int, iterations: int, bytes_per_checkpoint: int) -> RunFacts:
    """RunFacts from a run's records (host memory from the run record's environment)."""
    run = next((r for r in records if r.get("type") == "run"), {})
    memory = int(run.get("environment", {}).get("memory_bytes", 0))
    hosts = {r["host"] for r in records if r.get("type") == "rank"} or {"?"}
    saves = [r for r in records if _rank_ops(r) and r["phase"] == "save"]
    written = {(r["iteration"], r["file"]) for r in saves if r["op"] == "open"}
    synced = {(r["iteration"], r["file"]) for r in saves if r["op"] == "fsync"}
    caches = sorted({str(r.get("cache")) for r in records
                     if r.get("type") == "phase" and r.get("phase") == "restore"}) or ["none"]
    verified = any(r.get("type") == "phase" and r.get("phase") == "restore" for r in records) \
        and all(r.get("verified", r.get("ok")) for r in records
                if r.get("type") == "phase" and r.get("phase") == "restore")
    ops = [r for r in records if r.get("type") == "op"]
    save_end = max((r["end_ns"] for r in ops if r["phase"] == "save"), default=0)
    restore_start = min((r["start_ns"] for r in ops if r["phase"] == "restore"), default=0)
    return RunFacts(workload, world_size, ranks, scale, iterations, len(hosts), memory,
                    bytes_per_checkpoint // len(hosts), len(written), len(synced & written),
                    "+".join(caches), bool(verified),
                    str(run.get("options", {}).get("sequence", "interleaved")),
                    bool(save_end) and bool(restore_start) and save_end <= restore_start)
