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
4. the parts paid once per job, each as what it is: the coordinator's planning and
   ``.metadata`` encoding (save) is torch DCP's measured cost at the target's chunk count
   (``dcp_costs``), not ckptbench's own encoder time; the metadata write and commit
   (save) and the manifest read (restore) are added as measured (the manifest is as
   large as the target's ``.metadata``); runs without named parts add the measured
   metadata time lumped, as measured;
5. restart: R adds a restart overhead (given, or a documented default) to the restore.

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
from ckptbench.jobmodel.dcp_costs import DCP_SAVE_CACHED, DCP_SAVE_COORDINATOR
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

    @property
    def capped(self) -> bool:
        return self.ceiling_s is not None and self.ceiling_s > self.slowest_node_s


SAVE_ONCE = ("gather", "coordinator", "metadata", "commit")  # runner.parts, outside the spans


def once_parts(p: PhaseMeasurement, t: Target) -> dict[str, float]:
    """The parts a job pays once: the save's coordinator part is DCP's (at the target's
    chunk count, when the target has a plan), its gather is in DCP's figure; the storage
    parts as measured. A run without parts, or whose parts lie inside its ranks' spans (a
    format's own, e.g. torch-dcp's load: metadata, planning, data, sync; already in the
    per-node rate): the metadata time outside those spans, as measured."""
    if not p.parts or set(p.parts) - {"data", *SAVE_ONCE, *FIRST_RESTORE}:
        return {"metadata": p.metadata_s}
    out = {k: v for k, v in p.parts.items() if k != "data"}
    if p.phase == "save" and t.chunks:
        out.pop("gather", None)
        out["coordinator"] = DCP_SAVE_COORDINATOR.seconds(t.chunks)
    return out


def phase_estimate(p: PhaseMeasurement, t: Target) -> PhaseEstimate:
    fit = LogNormalFit.of(s.seconds_per_byte for s in p.samples)
    slowest = expected_max(t.node_groups, fit)
    ceiling_s = t.total_bytes / t.ceiling if t.ceiling else None
    data = max(slowest, ceiling_s or 0.0)
    parts = once_parts(p, t)
    once = sum(parts.values())
    return PhaseEstimate(
        phase=p.phase, node_bandwidth=1.0 / fit.median, spread_sigma=fit.sigma,
        samples=fit.samples, median_node_s=t.mean_node_bytes * fit.median,
        slowest_node_s=slowest, ceiling_s=ceiling_s, metadata_s=once, data_s=data,
        total_s=data + once, parts=parts,
    )


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
            out.append("storage: no aggregate ceiling given, so it is assumed to scale with the"
                       " nodes (give --aggregate-bandwidth)")
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
        m, t, s = self.measurement, self.target, self.save
        out = []
        if not m.save.parts:
            meta = f"save {s.metadata_s:.3g} s"
            if self.restore is not None:
                meta += f", restore {self.restore.metadata_s:.3g} s"
            out.append(f"metadata: the measured manifest and commit time ({meta}) added once,"
                       " not scaled to the target's chunk count (the run recorded no named"
                       " parts)")
            return out
        if t.chunks and "coordinator" in s.parts:
            own = m.save.parts.get("coordinator", 0.0) + m.save.parts.get("gather", 0.0)
            out.append(f"coordinator: torch DCP's measured planning and .metadata pickling for"
                       f" {t.chunks:,} chunks, {s.parts['coordinator']:.3g} s"
                       f" ({DCP_SAVE_COORDINATOR.describe()}; with plan caching on, saves after"
                       f" the first: {DCP_SAVE_CACHED.seconds(t.chunks):.3g} s), in place of"
                       f" ckptbench's own manifest build and gather ({own:.3g} s measured)")
        stored = ", ".join(f"{k} {v:.3g} s" for k, v in s.parts.items() if k != "coordinator")
        line = f"save, once per job as measured: {stored}"
        if self.restore is not None:
            line += ("; restore: " + ", ".join(f"{k} {v:.3g} s"
                                               for k, v in self.restore.parts.items()))
        out.append(line + " (the manifest is as large as DCP's .metadata of the whole job)")
        return out

    def to_dict(self) -> dict[str, Any]:
        def phase(p: PhaseEstimate | None) -> dict[str, Any] | None:
            return None if p is None else {**asdict(p), "capped": p.capped}

        return {
            "inputs": self.inputs(),
            "assumptions": self.assumptions(),
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
        measurement=m, target=t, save=phase_estimate(m.save, t),
        restore=phase_estimate(m.restore, t.for_restore) if m.restore is not None else None,
        restart_overhead_s=restart_overhead_s, restart_source=restart_source,
        warnings=tuple(found),
    )
