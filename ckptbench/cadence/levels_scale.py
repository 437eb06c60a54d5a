"""A tiered run's levels, scaled from the run's size to the job's.

A ``run --tiers`` measures each level at its own size: a few (often emulated) nodes,
each holding ``B_run`` bytes of state. The job's nodes hold ``B_job`` (its workload's
plan at its GPUs and GPUs per node, heaviest node). Per level (docs/cadence.md, "Levels
measured by a tiered run, scaled to the job"):

* memory: a copy into (and out of) the node's own memory, at the node's memory bandwidth
  as measured (``B_run / t``): ``t_job = t_run * B_job / B_run``, save and restore;
* peer: the node's bytes over its network. The run's time over its plain transfer of
  one node's bytes (``r = t_run / T_run``, the same transport, all processes at once)
  is the tier's own cost; the transfer at the job is ``B_job / W``, with ``W`` the node's
  network bandwidth (stated, default :data:`NODE_NETWORK_BPS`): ``t_job = r * B_job / W
  = t_run * (B_job / B_run) * (W_run / W)``, ``W_run = B_run / T_run``; the replication
  and the node-replaced restore alike;
* storage: the job model (``jobmodel``): the slowest of the job's nodes from the measured
  spread, what is paid once as measured, at the job's plan.

With the job equal to the run (``B_job = B_run``) and ``W = W_run`` (``--node-network
measured``) the memory and peer levels are the measured ones exactly.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckptbench.cadence.job import job_target, run_job
from ckptbench.cadence.levels_job import parse_level
from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.jobmodel import JobEstimate, measurement_of, workload_of
from ckptbench.records import read_records
from ckptbench.report.tiers import LEVELS, SUMMARY, summarize_tiers
from ckptbench.spec import Workload
from ckptbench.units import format_bytes, format_duration, format_rate, parse_bandwidth

NODE_NETWORK_BPS = 400e9 / 8  # bytes/s: 400 Gb/s per node
NODE_NETWORK_SOURCE = (
    "400 Gb/s per node: the host (CPU) network of NVIDIA's HGX H100/H200/B200 AI Factory "
    "reference architecture (two 200 GbE ports per node, docs.nvidia.com/reference-"
    "architectures/hgx-ai-factory-h100-h200-b200/network-logical-architecture), which host-"
    "memory copies travel on; a node replicating over its eight 400 Gb/s GPU NICs has 3.2 Tb/s")
NODE_NETWORK_SHORT = ("the default 400 Gb/s: a node's host network in NVIDIA's HGX reference "
                      "architecture; --node-network")
MEASURED = "measured"


def parse_network(text: str, option: str = "--node-network") -> float | None:
    """Bytes/s of a node's network (units.parse_bandwidth: a bare number is in Gb/s);
    ``measured``: None (the run's own transport)."""
    if text.strip().lower() == MEASURED:
        return None
    try:
        return parse_bandwidth(text, option)
    except SpecError as exc:
        raise SpecError(f"{exc}, or 'measured' (the run's own transport)") from None


@dataclass(frozen=True)
class RunTiers:
    """What a tiered run measured, per node of the run (its emulated nodes on one host)."""

    nodes: int
    node_bytes: float  # the heaviest node's state, one copy (median over checkpoints)
    replicas: int
    levels: dict[str, tuple[float, float, str]]  # name -> (save, restore, scope) as measured
    transfer_s: float | None  # a plain transfer of every process's shard at once (peer)
    transport: str

    @property
    def network_Bps(self) -> float | None:
        """The run's transport per node: one node's bytes over the plain transfer."""
        return self.node_bytes / self.transfer_s if self.transfer_s else None


@dataclass(frozen=True)
class JobSize:
    """The job the levels are scaled to."""

    name: str  # its workload's
    gpus: int
    gpus_per_node: int
    nodes: int
    node_bytes: float  # the heaviest node's state
    network_Bps: float  # W, bytes/s per node
    network_source: str
    storage: tuple[float, float] | None  # the job model's save and restore (no restart)


@dataclass(frozen=True)
class ScaledLevel:
    name: str
    scope: str
    measured_save_s: float
    measured_restore_s: float
    save_s: float
    restore_s: float
    how: str  # the factor, in words

    def text(self) -> str:
        """The level as `levels --level` takes it."""
        return f"{self.name}:{self.save_s!r}s:{self.restore_s!r}s:{self.scope}"


def scale(run: RunTiers, job: JobSize) -> tuple[ScaledLevel, ...]:
    """The run's levels at the job's size (pure: see the module's formulas)."""
    out = []
    nbytes = job.node_bytes / run.node_bytes
    for name, (save, restore, scope) in run.levels.items():
        if name == "memory":
            factor, how = nbytes, f"x {nbytes:.4g} (bytes per node)"
        elif name == "peer":
            if run.network_Bps is None:
                raise SpecError("the tiered run has a peer tier but no plain-transfer baseline"
                                " (tier_summary baseline_s); allowed: a results file of "
                                "`ckptbench run --tiers ...peer...`")
            net = run.network_Bps / job.network_Bps
            factor, how = nbytes * net, (f"x {nbytes:.4g} (bytes per node) x {net:.4g} "
                                         "(run's transport / node network)")
        elif name == "storage" and job.storage is not None:
            out.append(ScaledLevel(name, scope, save, restore, *job.storage, "the job model"))
            continue
        else:
            raise SpecError(f"level {name!r} of the tiered run cannot be scaled (no job model "
                            "estimate)")
        out.append(ScaledLevel(name, scope, save, restore, save * factor, restore * factor,
                               how))
    return tuple(out)


def run_tiers(records: Sequence[dict[str, Any]], where: str) -> RunTiers:
    """The per-node figures of a tiered run's records (SpecError: not a tiered run)."""
    kept = [r for r in records if r.get("type") in (SUMMARY, LEVELS)]
    summaries = kept if any(r.get("type") == LEVELS for r in kept) \
        else summarize_tiers(list(records))
    found = next((r for r in summaries if r.get("type") == LEVELS), None)
    tiers = [r for r in records if r.get("type") == "tier"]
    if found is None or not tiers:
        raise SpecError(f"{where}: no tier measurements in it; allowed: the results file of a "
                        "`ckptbench run --tiers ...`")
    levels = {}
    for text in found["levels"]:
        level, scope = parse_level(str(text))
        levels[level.name] = (level.save_s, level.restore_s, scope)
    first = tiers[0]["tier"]
    per_node: dict[int, dict[Any, float]] = defaultdict(lambda: defaultdict(float))
    for r in tiers:
        if r["tier"] == first:
            per_node[r["iteration"]][r.get("node", 0)] += r["bytes"]
    heaviest = statistics.median(max(nodes.values()) for nodes in per_node.values())
    peer = next((r for r in summaries if r.get("type") == SUMMARY and r["tier"] == "peer"),
                None)
    return RunTiers(len({r.get("node", 0) for r in tiers}), float(heaviest),
                    int(peer["replicas"]) if peer else 0, levels,
                    float(peer["baseline_s"]) if peer and peer["baseline_s"] > 0 else None,
                    str(peer["transport"]) if peer else "")


@dataclass(frozen=True)
class TierScaling:
    """A tiered run's levels, measured and scaled to one job."""

    path: str
    run: RunTiers
    job: JobSize
    levels: tuple[ScaledLevel, ...]
    estimate: JobEstimate | None  # the job model's, for the storage level

    def texts(self) -> list[str]:
        return [lv.text() for lv in self.levels]

    def lines(self) -> list[str]:
        """What the scaling did, for people (one line of inputs, one per level)."""
        r, j = self.run, self.job
        head = (f"scaled to the job (docs/cadence.md): the run's {r.nodes} node(s) of "
                f"{format_bytes(r.node_bytes)} -> {j.nodes:,} nodes of "
                f"{format_bytes(j.node_bytes)} ({j.name}, {j.gpus:,} GPUs, {j.gpus_per_node} per node)")
        if "memory" in r.levels:
            head += f"; node memory {format_rate(r.node_bytes / r.levels['memory'][0])} as measured"
        if "peer" in r.levels and r.network_Bps:
            source = NODE_NETWORK_SHORT if j.network_source == NODE_NETWORK_SOURCE \
                else j.network_source
            head += (f"; network {format_rate(j.network_Bps)} per node ({source}), the run's "
                     f"{r.transport} {format_rate(r.network_Bps)}")
        out = [head]
        for lv in self.levels:
            out.append(f"  {lv.name:<8} save {format_duration(lv.measured_save_s)} -> "
                       f"{format_duration(lv.save_s)}, restore "
                       f"{format_duration(lv.measured_restore_s)} -> "
                       f"{format_duration(lv.restore_s)} ({lv.how})")
        out += [f"  caution: {c}" for c in self.cautions()]
        if self.estimate is not None and self.estimate.warnings:
            out.append("  storage by the job model, cautions: "
                       + "; ".join(w.message for w in self.estimate.warnings))
        return out

    def cautions(self) -> list[str]:
        """Where the scaled figures contradict each other: a replication faster than the
        node's own memory copy of the same bytes (it reads and writes host memory too)."""
        by = {lv.name: lv for lv in self.levels}
        memory, peer = by.get("memory"), by.get("peer")
        if memory is None or peer is None or peer.save_s >= memory.save_s:
            return []
        return [f"the peer replication ({format_duration(peer.save_s)}) is faster than the "
                f"node's memory copy of the same bytes ({format_duration(memory.save_s)}): the "
                "network given is faster than the memory bandwidth this run's node measured, "
                "and a replication reads and writes host memory too; measure on a node like "
                "the job's"]

    def to_dict(self) -> dict[str, Any]:
        r, j = self.run, self.job
        return {
            "results": self.path,
            "run": {"nodes": r.nodes, "node_bytes": r.node_bytes, "replicas": r.replicas,
                    "transport": r.transport, "transfer_s": r.transfer_s,
                    "network_bytes_per_s": r.network_Bps},
            "job": {"workload": j.name, "gpus": j.gpus, "gpus_per_node": j.gpus_per_node, "nodes": j.nodes,
                    "node_bytes": j.node_bytes, "network_bytes_per_s": j.network_Bps,
                    "network_source": j.network_source},
            "levels": [{"level": lv.name, "scope": lv.scope, "measured_save_s": lv.measured_save_s,
                        "measured_restore_s": lv.measured_restore_s, "save_s": lv.save_s,
                        "restore_s": lv.restore_s, "scaled_by": lv.how} for lv in self.levels],
            "cautions": self.cautions(),
            "storage_assumptions": self.estimate.assumptions() if self.estimate else [],
        }


def tier_scaling(path: str, gpus: int, gpus_per_node: int, network_Bps: float | None = None,
                 network_source: str = NODE_NETWORK_SOURCE, where: str = "--tiers-results",
                 workload: Workload | None = None) -> TierScaling:
    """The tiered run at `path`, its levels scaled to `workload`'s job (default: the run's
    own full-size workload) at `gpus` (`network_Bps` None: the run's own transport,
    ``--node-network measured``)."""
    try:
        records = list(read_records(path))
    except CkptbenchError as exc:
        raise SpecError(f"{where} {exc}") from None
    run = run_tiers(records, f"{where} {path}")
    workload = workload or workload_of(next((r for r in records if r.get("type") == "run"),
                                            {}))
    if workload is None:
        raise SpecError(f"{where} {path}: the run record has no full-size workload (written "
                        "by an older ckptbench); allowed: the results of this version's "
                        "`ckptbench run --tiers`, --workload FILE, or --at-run-size")
    estimate, storage = None, None
    if "storage" in run.levels:
        estimate = run_job(measurement_of(records, path, where), gpus, gpus_per_node, workload)
        assert estimate.restore is not None  # the job model refuses a run without restores
        storage = (estimate.save.total_s, estimate.restore.total_s)
    target = estimate.target if estimate else job_target(workload, gpus, gpus_per_node)
    if network_Bps is None:
        network_Bps, network_source = run.network_Bps or 1.0, f"the run's own {run.transport}"
    job = JobSize(target.name, target.gpus, target.ranks_per_node, target.nodes,
                  target.heaviest_node_bytes, network_Bps, network_source, storage)
    return TierScaling(path, run, job, scale(run, job), estimate)
