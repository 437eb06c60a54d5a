"""From a measurement on a few nodes to the whole job's save and restore time.

The model, every step of which is printed with the answer:

1. per node: a node's time is its bytes times the measured seconds per byte of a node
   (the node's bytes over the span from its first rank's start to its last rank's end);
   valid while the target's bytes per rank and ranks per node are close to the run's,
   which the checks enforce;
2. the slowest node: the job's nodes are independent draws from the measured per-node
   distribution (a lognormal fit of seconds per byte; see ``stragglers``), each scaled
   by that node's bytes from the target's plan; the job's data time is the expected
   maximum over its nodes;
3. the storage ceiling: with an aggregate bandwidth given, the data time is at least
   total bytes / ceiling;
4. the parts paid once per job, each as what it is: the save's coordinator is torch
   DCP's, modelled at the target's chunk count (``dcp_costs``: real ``dcp.save`` on a
   gloo group), not ckptbench's own encoder time, and charged once, with every rank's
   receipt of the broadcast ``Metadata`` (a torch-dcp run's own, the models at its chunk
   count, are taken out of its node spans); the restore's ``.metadata`` read is the run's
   slowest read brought to the target's ``.metadata`` size, plus what the job's restoring
   ranks add (every one reads it: over the aggregate bandwidth when given, else each
   node's readers beyond a run node's at the fitted per-reader growth) and every rank's unpickle of it; a DCP load's planning is
   per restart as measured (out of the ranks' spans) and grows with the chunks by DCP's
   load model (a raw run's: DCP's load model at the target's chunks); the metadata write
   and commit (save) are added as measured; runs without named parts add the measured
   metadata time lumped, as measured;
5. restart: R adds a restart overhead (given, or a documented default) to the restore.

Each second of C and R is one of: measured (a rate or a time of the run), modelled (the
straggler tail, DCP's cost models, the readers' fan-in) or given (the storage ceiling,
the restart overhead): :meth:`JobEstimate.shares`.

The restore's nodes and bytes are the job's restarting on its restore layout
(``Target.for_restore``): what DCP's load planner gives each node's ranks, so a layout
that reads replicas or reshards costs the bytes it reads.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptbench.errors import SpecError
from ckptbench.jobmodel.checks import Finding, combined_command, findings, refusal
from ckptbench.jobmodel.dcp_costs import (
    DCP_LOAD_COORDINATOR,
    DCP_METADATA_DECODE,
    DCP_SAVE_BROADCAST,
    DCP_SAVE_CACHED,
    DCP_SAVE_COORDINATOR,
    MetadataRead,
    at_size,
    metadata_read,
)
from ckptbench.jobmodel.measured import Measurement, PhaseMeasurement
from ckptbench.jobmodel.stragglers import LogNormalFit, expected_max
from ckptbench.jobmodel.target import Target
from ckptbench.runner.parts import FIRST_RESTORE
from ckptbench.units import format_bytes, format_rate


@dataclass(frozen=True)
class PhaseEstimate:
    """One phase (save or restore) of the whole job, and how it was arrived at."""

    phase: str
    node_bandwidth: float  # the fit's median per-node bytes/s (geometric mean of the samples)
    spread_sigma: float  # sd of ln(seconds per byte) over the samples
    samples: int
    median_node_s: float  # a median node writing the target's mean node bytes
    slowest_node_s: float  # expected slowest of the target's nodes
    ceiling_s: float | None  # total bytes / aggregate ceiling
    metadata_s: float  # the parts paid once per job, summed
    data_s: float  # max(slowest node, ceiling)
    total_s: float  # data + metadata
    parts: dict[str, float] = field(default_factory=dict)  # metadata_s by name
    kinds: dict[str, str] = field(default_factory=dict)  # part -> measured | modelled
    notes: dict[str, str] = field(default_factory=dict)  # part -> where its figure comes from
    out_of_spans_s: float = 0.0  # a torch-dcp save's own DCP planning taken out of each span
    metadata_read: MetadataRead | None = None  # the restore's .metadata read, by readers

    @property
    def capped(self) -> bool:
        return self.ceiling_s is not None and self.ceiling_s > self.slowest_node_s


SAVE_ONCE = ("gather", "coordinator", "metadata", "commit")  # runner.parts, outside the spans
MEASURED, MODELLED, GIVEN, ASSUMED = "measured", "modelled", "given", "assumed"


@dataclass(frozen=True)
class Part:
    """A part of a phase the job pays once, and whether its figure is measured or
    modelled (with where it comes from)."""

    name: str
    seconds: float
    kind: str = MEASURED
    note: str = ""


def _save_parts(p: PhaseMeasurement, t: Target, m: Measurement) -> list[Part]:
    out = []
    if t.chunks:
        out.append(Part("coordinator", DCP_SAVE_COORDINATOR.seconds(t.chunks), MODELLED,
                        f"DCP's save coordinator at {t.chunks:,} chunks;"
                        f" {DCP_SAVE_COORDINATOR.fit_range(t.chunks)}"))
        out.append(Part("metadata_broadcast", DCP_SAVE_BROADCAST.seconds(t.chunks), MODELLED,
                        f"every rank unpickles the {t.chunks:,} chunks' Metadata the"
                        f" coordinator broadcasts; {DCP_SAVE_BROADCAST.fit_range(t.chunks)}"))
    padded = m.format in (None, "raw")  # its manifest is padded to DCP's .metadata size
    for k, v in p.parts.items():
        if k == "data" or (t.chunks and k in ("gather", "coordinator")):
            continue
        if k == "metadata" and padded:  # one writer: at the node's rate
            sized, note = at_size(v, m.metadata_bytes, t.metadata_bytes, p.node_bytes_per_s,
                                  "per-node")
            out.append(Part(k, sized, MEASURED, note))
        else:
            out.append(Part(k, v))
    return out


def _restore_parts(p: PhaseMeasurement, t: Target, m: Measurement, job: Target
                   ) -> tuple[list[Part], MetadataRead | None]:
    """The restore's parts paid once per restart: the .metadata read (the run's slowest,
    per byte at the job's size, then its fan-in to the job's readers), DCP's load
    planning (a DCP load's as measured, out of its spans, and its growth with the chunks;
    for a run of another format DCP's model at the job's chunks), a raw run's own setup
    and first byte as measured."""
    read = metadata_read(p.parts.get("metadata", 0.0), p.metadata_readers or 1,
                         m.metadata_bytes, t.gpus, job.metadata_bytes, job.ceiling,
                         p.rank_throughput[1], t.ranks_per_node, m.nodes)
    note = f"the run's slowest of {read.run_readers} .metadata reads" + (
        f": {read.sized}" if read.sized else "")
    out = [Part("metadata", read.measured_s, MEASURED, note)]
    if read.nbytes:
        out.append(Part("metadata_fan_in", read.fan_in_s, MODELLED, read.short()))
    dcp_load = "planning" in p.parts
    if dcp_load:
        out.append(Part("planning", p.parts["planning"], MEASURED,
                        f"DCP's load planning of the run ({m.chunks or 0:,} chunks), once per"
                        " restart (out of the ranks' spans)"))
    out += [Part(k, v) for k, v in p.parts.items()
            if k in FIRST_RESTORE]
    if job.chunks:
        run = DCP_METADATA_DECODE.seconds(m.chunks or 0) if dcp_load else 0.0
        out.append(Part("metadata_decode", max(DCP_METADATA_DECODE.seconds(job.chunks) - run,
                                               0.0), MODELLED,
                        f"every rank unpickles .metadata: {job.chunks:,} chunks"
                        + (f" less the run's {m.chunks or 0:,} (in its measured read)"
                           if dcp_load else "")
                        + f"; {DCP_METADATA_DECODE.fit_range(job.chunks)}"))
        base = DCP_LOAD_COORDINATOR.seconds(m.chunks or 0) if dcp_load else 0.0
        grow = max(DCP_LOAD_COORDINATOR.seconds(job.chunks) - base, 0.0)
        what = (f"DCP's load planning at {job.chunks:,} chunks less the model at the run's"
                f" {m.chunks or 0:,}" if dcp_load else
                f"DCP's load planning at {job.chunks:,} chunks (a {m.format or 'raw'} run"
                " plans its own reads)")
        out.append(Part("planning_growth" if dcp_load else "dcp_planning", grow, MODELLED,
                        f"{what}; {DCP_LOAD_COORDINATOR.fit_range(job.chunks)}"))
    return out, read


def once_parts(p: PhaseMeasurement, t: Target, m: Measurement | None = None,
               job: Target | None = None) -> tuple[list[Part], MetadataRead | None]:
    """The parts a job pays once, each measured or modelled. Save: the coordinator is
    DCP's at the target's chunk count (when the target has a plan; the run's gather and
    manifest build are left out), the storage parts as measured. Restore: see
    `_restore_parts`. A run without named parts, or with parts this model does not know:
    the metadata time outside the spans, as measured."""
    known = {"data", *SAVE_ONCE, *FIRST_RESTORE, "planning", "deserialise", "sync"}
    if m is None or not p.parts or set(p.parts) - known \
            or ("planning" in p.parts and not p.out_of_spans):
        return [Part("metadata", p.metadata_s)], None
    if p.phase == "save":
        return _save_parts(p, t, m), None
    return _restore_parts(p, t, m, job or t)


def in_spans_s(p: PhaseMeasurement, t: Target, m: Measurement | None) -> float:
    """A torch-dcp save's own DCP coordinator and Metadata broadcast, inside every rank's
    span (all ranks wait for them): DCP's models at the run's chunk count, taken out of
    the node spans when the job's are charged once at the job's chunk count."""
    if m is None or p.phase != "save" or m.format != "torch-dcp" or not t.chunks or not m.chunks:
        return 0.0
    return DCP_SAVE_COORDINATOR.seconds(m.chunks) + DCP_SAVE_BROADCAST.seconds(m.chunks)


def phase_estimate(p: PhaseMeasurement, t: Target, m: Measurement | None = None,
                   job: Target | None = None) -> PhaseEstimate:
    inside = in_spans_s(p, t, m)
    fit = LogNormalFit.of(max(s.seconds - inside, 0.1 * s.seconds) / s.bytes
                          for s in p.samples)
    slowest = expected_max(t.node_groups, fit)
    ceiling_s = t.total_bytes / t.ceiling if t.ceiling else None
    data = max(slowest, ceiling_s or 0.0)
    parts, read = once_parts(p, t, m, job)
    once = sum(x.seconds for x in parts)
    return PhaseEstimate(
        phase=p.phase, node_bandwidth=1.0 / fit.median, spread_sigma=fit.sigma,
        samples=fit.samples, median_node_s=t.mean_node_bytes * fit.median,
        slowest_node_s=slowest, ceiling_s=ceiling_s, metadata_s=once, data_s=data,
        total_s=data + once, parts={x.name: x.seconds for x in parts},
        kinds={x.name: x.kind for x in parts}, notes={x.name: x.note for x in parts if x.note},
        out_of_spans_s=inside, metadata_read=read,
    )


@dataclass(frozen=True)
class Share:
    """Seconds of C or R, what they are, and whether measured, modelled or given."""

    name: str
    seconds: float
    kind: str
    note: str = ""


def _phase_shares(p: PhaseEstimate, nodes: int) -> list[Share]:
    median = min(p.median_node_s, p.slowest_node_s)
    out = [Share("data", median, MEASURED, "a median node: the measured per-node rate x its"
                 " bytes")]
    if p.slowest_node_s > median:
        out.append(Share("stragglers", p.slowest_node_s - median, MODELLED,
                         f"the expected slowest of {nodes:,} nodes beyond the median one"
                         f" (lognormal fit, sigma {p.spread_sigma:.3g}; heavier nodes' bytes)"))
    if p.capped and p.ceiling_s is not None:
        out.append(Share("ceiling", p.ceiling_s - p.slowest_node_s, GIVEN,
                         "--aggregate-bandwidth: the storage's ceiling binds"))
    out += [Share(k, v, p.kinds.get(k, MEASURED), p.notes.get(k, "")) for k, v in p.parts.items()]
    return out


@dataclass(frozen=True)
class JobEstimate:
    """C and R of the whole job, with the model's inputs, assumptions and warnings."""

    measurement: Measurement
    target: Target
    save: PhaseEstimate
    restore: PhaseEstimate | None
    restart_overhead_s: float
    restart_source: str
    warnings: tuple[Finding, ...]

    @property
    def save_s(self) -> float:
        return self.save.total_s

    @property
    def restore_s(self) -> float | None:
        """Restore plus the restart overhead: R of the cadence model."""
        return None if self.restore is None else self.restore.total_s + self.restart_overhead_s

    def shares(self, with_restart: bool = True) -> dict[str, tuple[Share, ...]]:
        """C ("save") and R ("restore", with the restart unless `with_restart` is False:
        `levels` charges restarts by their own mechanisms) by part, each measured,
        modelled, given (a figure of the user's) or assumed (a documented default); the
        seconds of a phase add up to C or R."""
        out = {"save": tuple(_phase_shares(self.save, self.target.nodes))}
        if self.restore is not None and not with_restart:
            out["restore"] = tuple(_phase_shares(self.restore, self.target.for_restore.nodes))
        elif self.restore is not None:
            restart = Share("restart", self.restart_overhead_s,
                            GIVEN if self.restart_source == "given" else ASSUMED,
                            self.restart_source)
            out["restore"] = (*_phase_shares(self.restore, self.target.for_restore.nodes),
                              restart)
        return out

    def share_totals(self) -> dict[str, dict[str, float]]:
        """Per phase, the seconds of each kind (measured, modelled, given, assumed)."""
        out: dict[str, dict[str, float]] = {}
        for phase, shares in self.shares().items():
            kinds = {k: 0.0 for k in (MEASURED, MODELLED, GIVEN, ASSUMED)}
            for s in shares:
                kinds[s.kind] += s.seconds
            out[phase] = kinds
        return out

    def describe_shares(self, with_restart: bool = True) -> list[str]:
        """One line per phase: C or R, the seconds of each kind and their share, the
        parts of each kind (modelled ones with where their figure comes from)."""
        lines = []
        for phase, shares in self.shares(with_restart).items():
            total = sum(s.seconds for s in shares)
            name = "C" if phase == "save" else "R"
            kinds = []
            for kind in (MODELLED, MEASURED, GIVEN, ASSUMED):
                mine = [s for s in shares if s.kind == kind and s.seconds > 0]
                if not mine:
                    continue
                sec = sum(s.seconds for s in mine)
                items = ", ".join(f"{s.name} {s.seconds:.3g} s"
                                  + (f" [{s.note}]" if kind == MODELLED and s.note else "")
                                  for s in mine)
                kinds.append(f"{kind} {sec:.3g} s ({100 * sec / total:.0f} %: {items})"
                             if total else f"{kind} {sec:.3g} s ({items})")
            lines.append(f"{name} {total:.3g} s: " + "; ".join(kinds))
        return lines

    def inputs(self) -> dict[str, Any]:
        m, t = self.measurement, self.target

        def phase(p: PhaseMeasurement | None) -> dict[str, Any] | None:
            if p is None:
                return None
            rates = p.node_throughputs
            return {"iterations": p.iterations, "node_samples": len(p.samples),
                    "node_bytes_per_s": {"min": min(rates), "median": statistics.median(rates),
                                         "max": max(rates)},
                    "rank_bytes_per_s": dict(zip(("min", "median", "max"), p.rank_throughput,
                                                 strict=True)),
                    "metadata_s": p.metadata_s, "cache": p.cache,
                    "throughput_bytes_per_s": p.throughput_bytes_per_s,
                    "node_bytes_per_s_geometric_mean": p.node_bytes_per_s}

        return {
            "measurement": {
                "results": m.path, "workload": m.workload_name, "scale": m.scale,
                "ranks": len(m.ranks), "nodes": m.nodes, "ranks_per_node": m.ranks_per_node,
                "bytes_per_rank": m.bytes_per_rank, "bytes_per_file": m.file_bytes,
                "bytes_per_chunk": m.chunk_bytes, "save": phase(m.save),
                "restore": phase(m.restore),
            },
            "target": {
                "workload": t.name, "workload_file": t.workload_path, "gpus": t.gpus,
                "nodes": t.nodes, "ranks_per_node": t.ranks_per_node,
                "checkpoint_bytes": t.total_bytes, "bytes_per_rank": t.bytes_per_rank,
                "mean_node_bytes": t.mean_node_bytes,
                "heaviest_node_bytes": t.heaviest_node_bytes, "bytes_per_file": t.file_bytes,
                "aggregate_bandwidth": t.ceiling, "placement": t.placement,
                "restore": None if t.restore is None else {
                    "layout": t.restore_layout, "gpus": t.restore.gpus,
                    "nodes": t.restore.nodes, "read_bytes": t.restore.total_bytes,
                    "amplification": t.restore.total_bytes / t.total_bytes,
                    "mean_node_bytes": t.restore.mean_node_bytes,
                    "heaviest_node_bytes": t.restore.heaviest_node_bytes,
                    "placement": t.restore.placement},
            },
            "restart_overhead_s": self.restart_overhead_s,
        }

    def assumptions(self) -> list[str]:
        m, t, s = self.measurement, self.target, self.save
        one_node = " (one node measured: its iteration-to-iteration spread stands for the" \
                   " spread between nodes)" if m.nodes == 1 else ""
        out = [
            f"per node: time = the node's bytes x the measured seconds per byte of a node with"
            f" {m.ranks_per_node} ranks (save {format_rate(s.node_bandwidth)} per node, data only:"
            " the fit's median, the geometric mean of the samples)",
            f"nodes: {t.nodes:,} independent draws from a lognormal fit of the measured"
            f" per-node time per byte (save sigma {s.spread_sigma:.3g} from {s.samples}"
            f" samples = {m.nodes} node(s) x {m.save.iterations} iteration(s)){one_node};"
            f" all start together and the phase ends with the slowest: its expected time",
            f"bytes per node: {t.placement} (heaviest node {format_bytes(t.heaviest_node_bytes)},"
            f" mean {format_bytes(t.mean_node_bytes)})",
        ]
        r = t.restore
        if r is not None:
            out.append(f"restore: the job restarting on {t.restore_layout} ({r.gpus:,} GPUs ="
                       f" {r.nodes:,} nodes) reads {format_bytes(r.total_bytes)},"
                       f" {r.total_bytes / t.total_bytes:.3f}x the checkpoint, as its DCP restore"
                       f" plan gives its ranks (heaviest node {format_bytes(r.heaviest_node_bytes)},"
                       f" mean {format_bytes(r.mean_node_bytes)})")
        elif self.restore is not None:
            out.append("restore: each node reads back the bytes it saved (no restore plan:"
                       " give --workload)")
        if t.ceiling is None:
            fan = " (the .metadata fan-in too: see metadata)" if (
                self.restore is not None and self.restore.metadata_read is not None) else ""
            out.append("storage: no aggregate ceiling given, so it is assumed to scale with the"
                       f" nodes{fan} (give --aggregate-bandwidth)")
        else:
            binding = [p.phase for p in (self.save, self.restore) if p is not None and p.capped]
            out.append(f"storage: capped at the aggregate ceiling {format_rate(t.ceiling)}"
                       f" ({t.total_bytes / t.ceiling:.3g} s for the whole checkpoint;"
                       f" {'binding for ' + ' and '.join(binding) if binding else 'not binding'})")
        out += self._once_assumptions()
        out.append(f"restart overhead: {self.restart_overhead_s:.3g} s added to the restore"
                   f" ({self.restart_source})")
        return out

    def _once_assumptions(self) -> list[str]:
        """What each part paid once per job is, and where its figure comes from."""
        m, t, s, r = self.measurement, self.target, self.save, self.restore
        out = []
        if not m.save.parts:
            meta = f"save {s.metadata_s:.3g} s"
            if r is not None:
                meta += f", restore {r.metadata_s:.3g} s"
            out.append(f"metadata: the measured manifest and commit time ({meta}) added once,"
                       " not scaled to the target's chunk count (the run recorded no named"
                       " parts)")
            return out
        if t.chunks and "coordinator" in s.parts:
            own = m.save.parts.get("coordinator", 0.0) + m.save.parts.get("gather", 0.0)
            line = (f"coordinator: torch DCP's save coordinator for {t.chunks:,} chunks,"
                    f" {s.parts['coordinator']:.3g} s modelled, charged once"
                    f" ({DCP_SAVE_COORDINATOR.describe()}; {DCP_SAVE_COORDINATOR.fit_range(t.chunks)};"
                    f" with plan caching on, saves after the first:"
                    f" {DCP_SAVE_CACHED.seconds(t.chunks):.3g} s), in place of ckptbench's own"
                    f" manifest build and gather ({own:.3g} s measured)")
            if s.out_of_spans_s:
                line += (f"; the run's own DCP planning and Metadata broadcast (the models at"
                         f" its {m.chunks or 0:,} chunks, {s.out_of_spans_s:.3g} s) are taken"
                         " out of its node spans, so they are not charged per byte as well")
            out.append(line)
            out.append(f"metadata broadcast: {s.parts['metadata_broadcast']:.3g} s modelled,"
                       f" every rank unpickling the Metadata the coordinator broadcasts at the"
                       f" end of dcp.save ({DCP_SAVE_BROADCAST.describe()};"
                       f" {DCP_SAVE_BROADCAST.fit_range(t.chunks)})")
        stored = ", ".join(f"{k} {v:.3g} s" + (f" ({s.notes[k]})" if k in s.notes else "")
                           for k, v in s.parts.items() if s.kinds.get(k) == MEASURED)
        out.append(f"save, once per job as measured: {stored}")
        if r is not None:
            out += self._restore_assumptions(r)
        return out

    def _restore_assumptions(self, r: PhaseEstimate) -> list[str]:
        m = self.measurement
        out = []
        if r.metadata_read is not None:
            out.append(f"metadata: {r.metadata_read.describe()}")
        mr = m.restore
        if mr is not None and mr.out_of_spans:
            threads = "intra-op threads not recorded" if mr.intra_op_threads is None else (
                f"{mr.intra_op_threads[0]} intra-op thread(s)"
                if mr.intra_op_threads[0] == mr.intra_op_threads[1]
                else f"{mr.intra_op_threads[0]}-{mr.intra_op_threads[1]} intra-op threads")
            per_byte = ", ".join(f"{k} {v:.3g} s" for k, v in mr.parts.items()
                                 if k not in mr.out_of_spans)
            out.append(f"DCP load: its .metadata read and planning are paid once per restart,"
                       f" out of each rank's span; the rest is per byte at the measured rate"
                       f" ({per_byte} in the run's slowest load; deserialisation with"
                       f" {threads})")
        if "metadata_decode" in r.parts:
            out.append(f"metadata decode: {r.parts['metadata_decode']:.3g} s modelled"
                       f" ({r.notes['metadata_decode']}; {DCP_METADATA_DECODE.describe()})")
        for k in ("planning_growth", "dcp_planning"):
            if k in r.parts:
                out.append(f"load planning: {r.parts[k]:.3g} s modelled"
                           f" ({r.notes.get(k, '')}; {DCP_LOAD_COORDINATOR.describe()})")
        stored = ", ".join(f"{k} {v:.3g} s" for k, v in r.parts.items()
                           if r.kinds.get(k) == MEASURED and k != "metadata")
        if stored:
            out.append(f"restore, once per restart as measured: {stored}")
        return out

    def to_dict(self) -> dict[str, Any]:
        def phase(p: PhaseEstimate | None) -> dict[str, Any] | None:
            return None if p is None else {**asdict(p), "capped": p.capped}

        return {
            "inputs": self.inputs(),
            "assumptions": self.assumptions(),
            "shares": {"parts": {k: [asdict(s) for s in v] for k, v in self.shares().items()},
                       "totals": self.share_totals()},
            "save": phase(self.save),
            "restore": phase(self.restore),
            "save_s": self.save_s,
            "restore_s": self.restore_s,
            "restart_overhead_source": self.restart_source,
            "warnings": [{"check": w.check, "message": w.message, "command": w.command}
                         for w in self.warnings],
        }


def estimate(m: Measurement, t: Target, *, restart_overhead_s: float, restart_source: str,
             need_restore: bool = True, force: bool = False, source: str = "--results"
             ) -> JobEstimate:
    """The whole job's C and R from `m`; refuses (SpecError) a measurement that cannot
    stand for `t` unless `force`, in which case the warnings travel with the answer."""
    if need_restore and m.restore is None:
        raise SpecError(f"{source} {m.path}: no restore summary (the run only saved); run"
                        " `ckptbench run` without --no-restore")
    found = findings(m, t, need_restore)
    if found and not force:
        raise refusal(found, combined_command(m, t, found), f"{source} {m.path}")
    return JobEstimate(
        measurement=m, target=t, save=phase_estimate(m.save, t, m),
        restore=phase_estimate(m.restore, t.for_restore, m, t) if m.restore is not None else None,
        restart_overhead_s=restart_overhead_s, restart_source=restart_source,
        warnings=tuple(found),
    )
