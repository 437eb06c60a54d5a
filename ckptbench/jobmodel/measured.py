"""What a run measured, per node: read from a results file through ckptbench.records and
ckptbench.report (no parser of its own), or from a sweep file that lists several. A
``--mode async`` run also measured what its training loop waited and how much the
persist slowed it (:class:`AsyncMeasurement`); its save records are the persists'.

A *node sample* is one host in one successful iteration of a phase: the bytes its ranks
moved and the span from its first rank's start to its last rank's end (a node is done
when its slowest rank is). The manifest and commit (save) or the manifest read
(restore) lie outside that span: they are the phase's metadata time, kept apart
because the job pays them once, not per node (a restoring rank that reads the manifest
itself starts its span after that read). Runs that recorded the phases' named parts
(runner.parts: gather, coordinator, metadata, commit) keep them, so the model charges
each part as what it is.

A format's own restore parts inside its ranks' spans (torch-dcp's load: metadata,
planning, then deserialise, data, sync) are read per rank (the rank record's ``parts``,
else its ``dcp_load`` op's): what a restart pays once whatever its bytes (DCP's
``.metadata`` read and the load planning, ``DCP_LOAD_ONCE``) is taken out of each rank's
span, so the per-node rate is the per-byte work alone (reads, deserialisation, the
closing sync). Kept for the job model's growth with the job: how many read the manifest
or ``.metadata`` per restore (``metadata_readers``) and its bytes (``metadata_bytes``).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.jobmodel.stragglers import LogNormalFit
from ckptbench.plan.metadata import BYTES_PER_CHUNK, BYTES_PER_KEY
from ckptbench.plan.state import PARAM_GROUP_ITEMS
from ckptbench.records import read_records
from ckptbench.report import throughput, view
from ckptbench.runner.parts import FIRST_RESTORE
from ckptbench.spec import RESTORE_KEYS, Workload, parse_workload

PHASES = ("save", "restore")
# A DCP load's parts (formats.dcp_load) that a restart pays once, whatever its bytes: the
# .metadata read (every rank reads it) and the load planning (local plans, the
# coordinator's global plan, its scatter); the rest (deserialise, data, sync) is per byte.
DCP_LOAD_ONCE = ("metadata", "planning")


@dataclass(frozen=True)
class NodeSample:
    iteration: int
    host: str
    ranks: int
    bytes: int
    seconds: float

    @property
    def seconds_per_byte(self) -> float:
        return self.seconds / self.bytes


@dataclass(frozen=True)
class PhaseMeasurement:
    """One phase of a run, per node, over its successful iterations."""

    phase: str
    samples: tuple[NodeSample, ...]
    iterations: int
    metadata_s: float  # median over iterations: phase span minus the ranks' data span
    rank_throughput: tuple[float, float, float]  # min, median, max over ranks x iterations
    cache: str | None  # restore: how the cache was avoided
    headline: str = ""  # the phase's throughput as every command prints it (report.throughput)
    throughput_bytes_per_s: float | None = None  # its value: median over iterations
    parts: Mapping[str, float] = field(default_factory=dict)  # median s per named part
    # readers of the manifest (or DCP's .metadata) per restore, and its bytes (None: not
    # recorded); DCP_LOAD_ONCE parts taken out of the ranks' spans (a DCP load's)
    metadata_readers: int | None = None
    metadata_bytes: int | None = None
    out_of_spans: tuple[str, ...] = ()
    intra_op_threads: tuple[int, int] | None = None  # min, max over the ranks (recorded)

    @property
    def node_throughputs(self) -> list[float]:
        return [s.bytes / s.seconds for s in self.samples]

    @property
    def node_bytes_per_s(self) -> float:
        """Per node, data only: the geometric mean over the node samples (the lognormal
        fit's median, the figure the job model scales and `sweep` prints)."""
        return 1.0 / LogNormalFit.of(s.seconds_per_byte for s in self.samples).median


@dataclass(frozen=True)
class AsyncMeasurement:
    """What a ``--mode async`` run measured that the job's cost needs: the blocking time
    of one process's state (waits for the previous persist left out: at an interval above
    the floor there are none) and the interference during persists."""

    blocking_s: float  # median over checkpoints, the slowest process
    bytes_per_process: int  # the state each process snapshotted
    interference: float | None  # measured (below 0, noise: charged as 0); None: not
    source: str  # measurable (the steps slowed more than the persists lasted: load drift)

    def blocking_for(self, bytes_per_gpu: float) -> float:
        """The job's blocking time: a snapshot is a copy, linear in the bytes it copies."""
        return self.blocking_s * bytes_per_gpu / self.bytes_per_process


def async_of(summaries: list[dict[str, Any]], where: str, path: str) -> AsyncMeasurement | None:
    """The async summary of a run (None for a sync run) as an AsyncMeasurement."""
    if not summaries:
        return None
    record = summaries[0]
    blocking = (record.get("blocking_without_wait_s") or {}).get("median")
    nbytes = record.get("bytes_per_process")
    inter = record.get("interference")
    if not (isinstance(blocking, int | float) and blocking > 0 and isinstance(nbytes, int)
            and nbytes > 0):
        raise results_error(where, "the async summary has no blocking time; was a checkpoint"
                                   " committed?")
    return AsyncMeasurement(float(blocking), nbytes,
                            float(inter) if isinstance(inter, int | float) else None, path)


@dataclass(frozen=True)
class Measurement:
    """A run as the job model needs it (`path` names it in messages)."""

    path: str
    workload_name: str
    workload: Workload | None  # the full-size workload the run was measured for
    scale: int
    ranks: tuple[int, ...]
    nodes: int
    ranks_per_node: int
    bytes_per_rank: float  # mean over the ranks run
    file_bytes: float | None  # mean bytes per file of the plan as run
    chunk_bytes: float | None  # mean bytes per chunk of the plan as run
    block_size: int | None
    cache_option: str | None  # the run's --cache (None: not recorded)
    save: PhaseMeasurement
    restore: PhaseMeasurement | None
    asynchronous: AsyncMeasurement | None = None  # --mode async runs
    chunks: int | None = None  # the plan's chunks as run (DCP's .metadata entries)
    format: str | None = None  # the run's --format (None: not recorded)
    metadata_bytes: int | None = None  # DCP's .metadata of the plan as run (its size model)

    @property
    def samples(self) -> int:
        return len(self.save.samples)


def results_error(source: str, what: str) -> SpecError:
    return SpecError(f"{source}: {what}")


def workload_of(run: Mapping[str, Any]) -> Workload | None:
    """The full-size workload a run record names, with the restore layout it ran (None
    when it does not validate)."""
    data = run.get("workload")
    if not isinstance(data, dict):
        return None
    tables = {k: v for k, v in data.items() if k in ("model", "state", "parallel", "checkpoint")}
    tables["model"] = {k: v for k, v in tables.get("model", {}).items()
                       if v or k in ("name", "layers", "dim", "heads", "kv_heads", "ffn_dim",
                                     "vocab_size")}
    restore = data.get("restore")
    if isinstance(restore, dict):  # the layout the run restored onto (DCP's reshard)
        tables["restore"] = {k: v for k, v in restore.items() if k in RESTORE_KEYS}
    tables["workload"] = {"name": data.get("name", "workload")}
    try:
        return parse_workload(tables)
    except SpecError:
        return None


@dataclass
class _Scan:
    """A phase's records of its successful iterations, sorted out."""

    nodes: dict[tuple[int, str], list[dict[str, Any]]] = field(
        default_factory=lambda: defaultdict(list))
    extra: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))  # manifest/commit
    parts: list[dict[str, float]] = field(default_factory=list)
    first: dict[tuple[int, int], int] = field(default_factory=dict)  # first data read's end
    own: dict[tuple[int, int], Mapping[str, float]] = field(default_factory=dict)  # per rank
    readers: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # manifest reads
    sizes: list[int] = field(default_factory=list)  # the manifest's bytes as read

    def add(self, r: dict[str, Any], phase: str) -> None:
        kind, op = r.get("type"), r.get("op")
        if kind == "phase" and isinstance(r.get("parts"), dict):
            self.parts.append(r["parts"])
        if kind == "rank":
            self.nodes[(r["iteration"], str(r.get("host", "?")))].append(r)
            if isinstance(r.get("parts"), dict):  # the rank's own parts win over its op's
                self.own[(r["iteration"], r.get("rank", -1))] = r["parts"]
        elif kind == "op" and op in ("manifest", "commit"):
            self.extra[r["iteration"]] += [r["start_ns"], r["end_ns"]]
            if op == "manifest" and phase == "restore":
                self.readers[r["iteration"]] += 1
                if isinstance(r.get("size"), int):
                    self.sizes.append(r["size"])
        elif kind == "op" and op == "read" and phase == "restore":
            key = (r["iteration"], r["rank"])
            self.first[key] = min(self.first.get(key, r["end_ns"]), r["end_ns"])
        elif kind == "op" and isinstance(r.get("parts"), dict):
            self.own.setdefault((r["iteration"], r.get("rank", -1)), r["parts"])


def _phase(records: list[dict[str, Any]], phase: str, cache: Any) -> PhaseMeasurement | None:
    ok = {r["iteration"] for r in records
          if r.get("type") == "phase" and r.get("phase") == phase and r.get("ok")}
    scan = _Scan()
    for r in records:
        if r.get("phase") == phase and r.get("iteration") in ok:
            scan.add(r, phase)
    nodes, parts, first = scan.nodes, scan.parts, scan.first
    if not all(FIRST_RESTORE[-1] in p for p in parts) or not parts:
        first = {}  # no first-restore parts charged once: they stay in the node rates
    if not nodes:
        return None
    # a DCP load's once-per-restart parts, per rank, out of its span (ns); every rank of a
    # DCP load reads .metadata itself
    once = {k: int(sum(float(v.get(n, 0.0)) for n in DCP_LOAD_ONCE) * 1e9)
            for k, v in scan.own.items() if phase == "restore" and "planning" in v}
    if once:  # the DCP ranks' reads (not ckptbench's own manifest read)
        scan.readers = defaultdict(int)
        for iteration, _ in once:
            scan.readers[iteration] += 1
    samples, rank_rates = [], []
    spans: dict[int, list[int]] = defaultdict(list)
    for (iteration, host), ranks in sorted(nodes.items()):
        start = min(_data_start(r, first, once) for r in ranks)
        end = max(r["end_ns"] for r in ranks)
        spans[iteration] += [start, end]
        nbytes = sum(r["bytes"] for r in ranks)
        if nbytes > 0:
            samples.append(NodeSample(iteration, host, len(ranks), nbytes, max(end - start, 1) / 1e9))
        rank_rates += [r["bytes"] / max(r["end_ns"] - _data_start(r, first, once), 1) * 1e9
                       for r in ranks]
    threads = [r["intra_op_threads"] for rs in nodes.values() for r in rs
               if isinstance(r.get("intra_op_threads"), int)]
    meta = []
    for iteration, data in spans.items():
        whole = data + scan.extra.get(iteration, [])
        meta.append(((max(whole) - min(whole)) - (max(data) - min(data))) / 1e9)
    if not samples:
        return None
    return PhaseMeasurement(
        phase=phase, samples=tuple(samples), iterations=len(spans),
        metadata_s=statistics.median(meta),
        rank_throughput=(min(rank_rates), statistics.median(rank_rates), max(rank_rates)),
        cache=None if cache is None else (cache if isinstance(cache, str) else ",".join(cache)),
        parts={k: statistics.median(p.get(k, 0.0) for p in parts)
               for k in dict.fromkeys(k for p in parts for k in p)},
        metadata_readers=max(scan.readers.values()) if scan.readers else None,
        metadata_bytes=max(scan.sizes) if scan.sizes else None,
        out_of_spans=DCP_LOAD_ONCE if once else (),
        intra_op_threads=(min(threads), max(threads)) if threads else None,
    )


def _data_start(rank: dict[str, Any], first: Mapping[tuple[int, int], int],
                once: Mapping[tuple[int, int], int]) -> int:
    """When a rank's data began: its start, or after its own manifest read (a restoring
    rank of the DCP restore plan reads the manifest first; that read is metadata), or,
    where the run recorded a restore's first-restore parts (runner.parts: setup,
    first_byte, charged once per restore), after its first data read, or, for a DCP load,
    after its .metadata read and load planning (``once``: ns per (iteration, rank))."""
    manifest = rank.get("manifest_s")
    key = (rank["iteration"], rank.get("rank", -1))
    start = int(rank["start_ns"] + (manifest * 1e9 if isinstance(manifest, int | float) else 0))
    start = min(start + once.get(key, 0), int(rank["end_ns"]))
    return max(start, first.get(key, start))


def measurement_of(records: list[dict[str, Any]], path: str, source: str = "--results"
                   ) -> Measurement:
    """A run's records (from ckptbench.records) as the job model's Measurement."""
    where = f"{source} {path}"
    loaded = view(records, path)
    for s in loaded["summary"]:
        if s.get("phase") not in PHASES:
            raise results_error(where, f"summary record of phase {s.get('phase')!r}; allowed: save, restore")
    caches = {s["phase"]: s.get("cache") for s in loaded["summary"]}
    shown = {s["phase"]: {"headline": throughput.headline(s),
                          "throughput_bytes_per_s": s["throughput_bytes_per_s"]}
             for s in loaded["summary"] if "throughput_bytes_per_s" in s}
    save = _phase(records, "save", None)
    if save is None:
        raise results_error(where, "no successful save with rank records (not the results of `ckptbench run`"
                           " or every save failed)")
    restore = _phase(records, "restore", caches.get("restore"))
    save = replace(save, **shown.get("save", {}))
    restore = restore and replace(restore, **shown.get("restore", {}))
    run = loaded["run"]
    if restore is not None and (run.get("options") or {}).get("verify") is False:
        raise results_error(where, "its restores were not verified (--no-verify, a "
                            "diagnostic): not a restore time a job could rely on; allowed: "
                            "the results of a run without --no-verify (or with --no-restore)")
    plan = run.get("plan") or {}
    first = [r for r in records if r.get("type") == "rank" and r.get("phase") == "save"
             and r.get("iteration") == save.samples[0].iteration]
    ranks_run = run.get("ranks") or sorted(r["rank"] for r in first)
    files, chunks, total = plan.get("files"), plan.get("chunks"), plan.get("total_bytes")
    options = run.get("options") or {}
    workload = workload_of(run)
    return Measurement(
        path=str(path),
        workload_name=str((run.get("workload") or {}).get("name", "workload")),
        workload=workload,
        scale=int(run.get("scale", 1) or 1),
        ranks=tuple(int(r) for r in ranks_run),
        nodes=len({s.host for s in save.samples}),
        ranks_per_node=max(s.ranks for s in save.samples),
        bytes_per_rank=statistics.fmean(r["bytes"] for r in first),
        file_bytes=total / files if total and files else None,
        chunk_bytes=total / chunks if total and chunks else None,
        block_size=options.get("block_size"),
        cache_option=options.get("cache"),
        save=save,
        restore=restore,
        asynchronous=async_of(loaded.get("async", []), where, str(path)),
        chunks=chunks if isinstance(chunks, int) else None,
        format=options.get("format") if isinstance(options.get("format"), str) else None,
        metadata_bytes=(restore and restore.metadata_bytes) or _dcp_metadata_bytes(
            workload, chunks, plan.get("state_keys")),
    )


def _dcp_metadata_bytes(workload: Workload | None, chunks: Any, keys: Any) -> int | None:
    """DCP's .metadata of the plan as run, by ckptbench.plan.metadata's size model (from
    the run record's chunk and key counts; None when it lacks them)."""
    if not (isinstance(chunks, int) and isinstance(keys, int)):
        return None
    adamw = workload is not None and workload.state.optimizer == "adamw"
    return BYTES_PER_CHUNK * chunks + BYTES_PER_KEY * (
        keys + (len(PARAM_GROUP_ITEMS) if adamw else 0))


def read_results(path: str | Path, source: str = "--results") -> Measurement:
    """One results file of `ckptbench run` (one-line errors that name `source` and the path)."""
    try:
        records = list(read_records(path))
    except CkptbenchError as exc:
        raise SpecError(f"{source} {exc}") from None
    return measurement_of(records, str(path), source)


def choose(measurements: list[Measurement], ranks_per_node: int) -> Measurement:
    """The measurement whose ranks per node match the target's, else the nearest (in
    ratio; the larger on a tie): the ranks-per-node check then says it does not match."""
    exact = [m for m in measurements if m.ranks_per_node == ranks_per_node]
    if exact:
        return max(exact, key=lambda m: m.samples)
    return min(measurements, key=lambda m: (abs(math.log2(m.ranks_per_node / ranks_per_node)),
                                           -m.ranks_per_node))
