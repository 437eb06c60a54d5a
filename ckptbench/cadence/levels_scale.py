"""A tiered run's levels, scaled from the run's size to the job's, on one footing.

A ``run --tiers`` measures each level at its own size: a few (often emulated) nodes,
each holding ``B_run`` bytes of state. The job's nodes hold ``B_job`` (its workload's
plan at its GPUs and GPUs per node, heaviest node). The memory and peer levels are
scaled alike (docs/cadence.md, "Levels measured by a tiered run, scaled to the job"):
the run's time over its plain baseline of one node's bytes (``r = t_run / T_run``: the
tier's own cost, kept) times the job's node bytes over a rate, ``t_job = r * B_job / R``.
The footing says which rates, one for every level (:class:`Footing`):

* ``stated`` (the default): stated figures for the job's nodes, each with its source.
  memory: ``R`` = half the node's host memory bandwidth (a copy reads and writes;
  default :data:`NODE_MEMORY_BPS`, ``--node-memory-bandwidth``), ``T_run`` the run's plain
  copy (the memory tier's baseline); peer: ``R = W``, the node's network (default
  :data:`NODE_NETWORK_BPS`, ``--node-network``), ``T_run`` the run's plain transfer;
* ``measured``: the run's own nodes: ``R`` = what the run measured (``B_run / T_run``), so
  ``t_job = t_run * B_job / B_run`` for both (memory: the node's memory as the run saw it,
  peer: the run's own transport);
* storage, in both: the job model (``jobmodel``): the run's storage measurement at the
  job's plan (the slowest of the job's nodes from the measured spread, what is paid once
  as measured), accepted or refused by the same rules as ``cadence --results``.

Both restore and save of a level use its save's baseline (the restart scenario is read
at the same rate). Scaled figures that no hardware produces (a peer save below the
memory save the replication starts from, a memory restore slower than the storage
restore) are refused unless forced (:func:`tier_scaling`). With the job equal to the run
(``B_job = B_run``) the measured footing gives the measured memory and peer levels
exactly.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ckptbench.cadence.answer import DEFAULT_RESTART_OVERHEAD_S, RESTART_OVERHEAD_SOURCE
from ckptbench.cadence.job import job_target
from ckptbench.cadence.levels_job import parse_level
from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.jobmodel import JobEstimate, Target, estimate, measurement_of, workload_of
from ckptbench.records import read_records
from ckptbench.report.tiers import LEVELS, SUMMARY, summarize_tiers
from ckptbench.spec import Workload
from ckptbench.units import format_bytes, format_duration, format_rate, parse_bandwidth

STATED, MEASURED = "stated", "measured"
FOOTINGS = (STATED, MEASURED)

NODE_NETWORK_BPS = 400e9 / 8  # bytes/s: 400 Gb/s per node
NODE_NETWORK_SOURCE = (
    "400 Gb/s per node: the host (CPU) network of NVIDIA's HGX H100/H200/B200 AI Factory "
    "reference architecture (two 200 GbE ports per node, docs.nvidia.com/reference-"
    "architectures/hgx-ai-factory-h100-h200-b200/network-logical-architecture), which host-"
    "memory copies travel on; a node replicating over its eight 400 Gb/s GPU NICs has 3.2 Tb/s")
NODE_NETWORK_SHORT = ("the default 400 Gb/s: a node's host network in NVIDIA's HGX reference "
                      "architecture; --node-network")
NODE_MEMORY_BPS = 2 * 8 * 4800e6 * 8  # bytes/s: 614.4 GB/s, 2 sockets x 8 channels of DDR5-4800
NODE_MEMORY_SOURCE = (
    "614.4 GB/s of host memory per node, a copy at half that (it reads and writes): an HGX "
    "H100 node's 2 sockets x 8 channels of DDR5-4800 at 38.4 GB/s each (Intel Xeon Platinum "
    "8480+ specification: 8 channels of DDR5-4800 per socket; an NVIDIA DGX H100 has two "
    "such CPUs, Xeon Platinum 8480C), the specification's peak")
NODE_MEMORY_SHORT = ("the default 614.4 GB/s: an HGX H100 node's 2 x 8 channels of DDR5-4800; "
                     "--node-memory-bandwidth")
_SHORT = {NODE_NETWORK_SOURCE: NODE_NETWORK_SHORT, NODE_MEMORY_SOURCE: NODE_MEMORY_SHORT}
STORAGE_SOURCE = "the job model: the run's storage measurement at the job's plan"


def parse_network(text: str, option: str = "--node-network") -> float | None:
    """Bytes/s of a node's network (units.parse_bandwidth: a bare number is in Gb/s);
    ``measured``: None (the run's own transport)."""
    if text.strip().lower() == MEASURED:
        return None
    try:
        return parse_bandwidth(text, option)
    except SpecError as exc:
        raise SpecError(f"{exc}, or 'measured' (the run's own transport, with --footing "
                        "measured)") from None


def parse_memory(text: str, option: str = "--node-memory-bandwidth") -> float:
    """Bytes/s of a node's host memory (a bare number is in GB/s; a lowercase b: bits)."""
    try:
        return parse_bandwidth(text, option, "GB")
    except SpecError:
        raise SpecError(f"{option} {text!r}: allowed: a node's host memory bandwidth > 0 such "
                        "as 614.4GB/s or 1.2TB/s (B: bytes; a lowercase b or bit: bits; a bare "
                        "number: GB/s)") from None


@dataclass(frozen=True)
class Footing:
    """What every level is scaled by: stated figures for the job's nodes, each with its
    source (``stated``), or the run's own nodes as measured (``measured``)."""

    name: str  # STATED | MEASURED
    memory_Bps: float | None = None  # stated: a node's host memory bandwidth (DRAM)
    memory_source: str = ""
    network_Bps: float | None = None  # stated: W, a node's network bandwidth
    network_source: str = ""

    @property
    def copy_Bps(self) -> float | None:
        """A copy in host memory reads and writes: half the memory bandwidth at most."""
        return self.memory_Bps / 2 if self.memory_Bps else None


STATED_FOOTING = Footing(STATED, NODE_MEMORY_BPS, NODE_MEMORY_SOURCE, NODE_NETWORK_BPS,
                         NODE_NETWORK_SOURCE)
MEASURED_FOOTING = Footing(MEASURED)


def parse_footing(footing: str | None, memory: str | None = None, network: str | None = None
                  ) -> Footing:
    """``--footing``, ``--node-memory-bandwidth`` and ``--node-network`` as one footing; a
    stated figure with ``--footing measured``, or ``--node-network measured`` with the
    stated footing, is refused (SpecError, one line)."""
    name = STATED if footing is None else footing.strip().lower()
    if name not in FOOTINGS:
        raise SpecError(f"--footing {footing!r}: allowed: stated (stated figures for the job's "
                        "nodes: --node-memory-bandwidth, --node-network) or measured (the "
                        "run's own nodes as measured)")
    rate = parse_network(network) if network is not None else NODE_NETWORK_BPS
    copy = parse_memory(memory) if memory is not None else NODE_MEMORY_BPS
    if name == MEASURED:
        for given, flag in ((memory, "--node-memory-bandwidth"),
                            (network if rate is not None else None, "--node-network")):
            if given is not None:
                raise SpecError(f"--footing measured and {flag} {given}: allowed: one of them "
                                f"(measured scales every tier by the run's own nodes; {flag} is "
                                "a stated figure, for --footing stated)")
        return MEASURED_FOOTING
    if rate is None:
        raise SpecError(f"--node-network {network} and --footing {footing or 'stated'}"
                        f"{'' if footing else ' (the default)'}: allowed: --footing measured "
                        "(every tier by the run's own nodes, its transport included), or a "
                        "stated bandwidth such as --node-network 400Gb/s")
    return Footing(STATED, copy, NODE_MEMORY_SOURCE if memory is None
                   else f"--node-memory-bandwidth {memory} (host memory per node; a copy at "
                        "half that)",
                   rate, NODE_NETWORK_SOURCE if network is None else f"--node-network {network}")


@dataclass(frozen=True)
class RunTiers:
    """What a tiered run measured, per node of the run (its emulated nodes on one host)."""

    nodes: int
    node_bytes: float  # the heaviest node's state, one copy (median over checkpoints)
    replicas: int
    levels: dict[str, tuple[float, float, str]]  # name -> (save, restore, scope) as measured
    transfer_s: float | None  # a plain transfer of every process's shard at once (peer)
    transport: str
    copy_s: float | None = None  # a plain copy of every process's shard at once (memory)
    memory_where: str = ""  # the memory tier's directory and pages

    @property
    def network_Bps(self) -> float | None:
        """The run's transport per node: one node's bytes over the plain transfer."""
        return self.node_bytes / self.transfer_s if self.transfer_s else None

    @property
    def copy_Bps(self) -> float | None:
        """The run's plain copy per node: one node's bytes over the plain copy."""
        return self.node_bytes / self.copy_s if self.copy_s else None


@dataclass(frozen=True)
class JobSize:
    """The job the levels are scaled to."""

    name: str  # its workload's
    gpus: int
    gpus_per_node: int
    nodes: int
    node_bytes: float  # the heaviest node's state
    footing: Footing
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
    footing: str  # what the figure stands on: stated | measured (storage: the run's)
    source: str  # where the rate it is scaled by comes from

    def text(self) -> str:
        """The level as `levels --level` takes it."""
        return f"{self.name}:{self.save_s!r}s:{self.restore_s!r}s:{self.scope}"


def _baseline_error(tier: str, what: str) -> SpecError:
    return SpecError(f"the tiered run has a {tier} tier but no {what} baseline (tier_summary "
                     f"baseline_s); allowed: a results file of `ckptbench run --tiers "
                     f"...{tier}...`, or --footing measured")


def _memory(run: RunTiers, f: Footing, nbytes: float) -> tuple[float, str, str]:
    """The memory level's factor, the factor in words, and the source of its rate."""
    if f.name == MEASURED or f.copy_Bps is None:
        seen = run.node_bytes / run.levels["memory"][0] if run.levels["memory"][0] > 0 else 0
        return nbytes, f"x {nbytes:.4g} (bytes per node)", (
            f"the run's node memory, measured: its copy at {format_rate(seen)} per node"
            + (f" into {run.memory_where}" if run.memory_where else ""))
    if run.copy_Bps is None:
        raise _baseline_error("memory", "plain-copy")
    rel = run.copy_Bps / f.copy_Bps
    return nbytes * rel, (f"x {nbytes:.4g} (bytes per node) x {rel:.4g} (the run's plain copy "
                          f"{format_rate(run.copy_Bps)} / a copy at "
                          f"{format_rate(f.copy_Bps)}, half the stated memory)"), f.memory_source


def _peer(run: RunTiers, f: Footing, nbytes: float) -> tuple[float, str, str]:
    """The peer level's factor, the factor in words, and the source of its rate."""
    if run.network_Bps is None:
        raise _baseline_error("peer", "plain-transfer")
    if f.name == MEASURED or f.network_Bps is None:
        return nbytes, f"x {nbytes:.4g} (bytes per node)", (
            f"the run's own {run.transport}, measured: {format_rate(run.network_Bps)} per node "
            "(its plain transfer)")
    rel = run.network_Bps / f.network_Bps
    return nbytes * rel, (f"x {nbytes:.4g} (bytes per node) x {rel:.4g} (the run's "
                          f"{run.transport} {format_rate(run.network_Bps)} / the stated network "
                          f"{format_rate(f.network_Bps)})"), f.network_source


def scale(run: RunTiers, job: JobSize) -> tuple[ScaledLevel, ...]:
    """The run's levels at the job's size on the job's footing (pure: see the module's
    formulas)."""
    out = []
    nbytes = job.node_bytes / run.node_bytes
    for name, (save, restore, scope) in run.levels.items():
        if name in ("memory", "peer"):
            factor, how, source = (_memory if name == "memory" else _peer)(run, job.footing,
                                                                            nbytes)
        elif name == "storage" and job.storage is not None:
            out.append(ScaledLevel(name, scope, save, restore, *job.storage, "the job model",
                                   MEASURED, f"{STORAGE_SOURCE}, the slowest of its "
                                   f"{job.nodes:,} nodes"))
            continue
        else:
            raise SpecError(f"level {name!r} of the tiered run cannot be scaled (no job model "
                            "estimate)")
        out.append(ScaledLevel(name, scope, save, restore, save * factor, restore * factor,
                               how, job.footing.name, source))
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
    tier = {r["tier"]: r for r in summaries if r.get("type") == SUMMARY}
    peer, memory = tier.get("peer"), tier.get("memory")

    def baseline(summary: dict[str, Any] | None) -> float | None:
        return float(summary["baseline_s"]) if summary and summary.get("baseline_s") else None

    return RunTiers(len({r.get("node", 0) for r in tiers}), float(heaviest),
                    int(peer["replicas"]) if peer else 0, levels, baseline(peer),
                    str(peer["transport"]) if peer else "", baseline(memory),
                    str(memory.get("transport", "")) if memory else "")


@dataclass(frozen=True)
class TierScaling:
    """A tiered run's levels, measured and scaled to one job."""

    path: str
    run: RunTiers
    job: JobSize
    levels: tuple[ScaledLevel, ...]
    estimate: JobEstimate | None  # the job model's, for the storage level
    forced: str = ""  # why refusals were waived ("--force"); "": nothing was refused

    def texts(self) -> list[str]:
        return [lv.text() for lv in self.levels]

    def lines(self) -> list[str]:
        """What the scaling did, for people (one line of inputs, one per level with the
        source of its figures, then what was used anyway)."""
        r, j = self.run, self.job
        out = [f"scaled to the job (docs/cadence.md), footing {j.footing.name}: the run's "
               f"{r.nodes} node(s) of {format_bytes(r.node_bytes)} -> {j.nodes:,} nodes of "
               f"{format_bytes(j.node_bytes)} ({j.name}, {j.gpus:,} GPUs, {j.gpus_per_node} "
               "per node)"]
        for lv in self.levels:
            out.append(f"  {lv.name:<8} save {format_duration(lv.measured_save_s)} -> "
                       f"{format_duration(lv.save_s)}, restore "
                       f"{format_duration(lv.measured_restore_s)} -> "
                       f"{format_duration(lv.restore_s)}: {lv.how}; source ({lv.footing}): "
                       f"{_SHORT.get(lv.source, lv.source)}")
        used = f" (used anyway: {self.forced})" if self.forced else ""
        out += [f"  caution{used}: {c}" for c in self.cautions()]
        if self.estimate is not None and self.estimate.warnings:
            out.append(f"  storage by the job model, warnings{used}: "
                       + "; ".join(w.message for w in self.estimate.warnings))
        return out + self.share_lines()

    def shares(self) -> list[dict[str, Any]]:
        """Each level's save and restore seconds, measured or modelled, with the parts
        of the storage level's by the job model (restarts are the mechanisms')."""
        out: list[dict[str, Any]] = []
        for lv in self.levels:
            if lv.name == "storage" and self.estimate is not None:
                for phase, shares in self.estimate.shares(with_restart=False).items():
                    out += [{"level": lv.name, "phase": phase, **asdict(s)} for s in shares]
                continue
            kind = MEASURED if lv.footing == MEASURED else "modelled"
            note = (f"the run's {lv.name} time x bytes per node" if kind == MEASURED else
                    f"the run's {lv.name} time x bytes per node x its baseline / the stated"
                    f" figure ({lv.source})")
            out += [{"level": lv.name, "phase": "save", "name": "data", "seconds": lv.save_s,
                     "kind": kind, "note": note},
                    {"level": lv.name, "phase": "restore", "name": "data",
                     "seconds": lv.restore_s, "kind": kind, "note": note}]
        return out

    def share_lines(self) -> list[str]:
        """Per level, how much of its save and restore is measured and how much modelled
        (docs/cadence.md, "Measured and modelled")."""
        out = ["  measured vs modelled, per level (restarts: the mechanisms above):"]
        for lv in self.levels:
            if lv.name == "storage" and self.estimate is not None:
                out += [f"    storage {text}" for text in
                        self.estimate.describe_shares(with_restart=False)]
                continue
            stated = lv.footing != MEASURED
            out.append(f"    {lv.name} save {format_duration(lv.save_s)}, restore "
                       f"{format_duration(lv.restore_s)}: "
                       + ("modelled 100 % (the run's measured time rescaled to the stated"
                          f" figures: {_SHORT.get(lv.source, lv.source)})" if stated else
                          "measured 100 % (the run's own time, x the job's bytes per node)"))
        return out

    def cautions(self) -> list[str]:
        """Orderings no hardware produces: a replication (it starts from the node's memory
        copy) done before that copy, and a restore from the node's memory slower than one
        from storage."""
        by = {lv.name: lv for lv in self.levels}
        memory, peer, storage = by.get("memory"), by.get("peer"), by.get("storage")
        out = []
        if memory is not None and peer is not None and peer.save_s < memory.save_s:
            out.append(f"the peer save {format_duration(peer.save_s)} is below the memory save "
                       f"{format_duration(memory.save_s)} it starts from (the replication "
                       "sends the node's memory copy)")
        if memory is not None and storage is not None and memory.restore_s > storage.restore_s:
            out.append(f"the memory restore {format_duration(memory.restore_s)} is slower than "
                       f"the storage restore {format_duration(storage.restore_s)}")
        return out

    def to_dict(self) -> dict[str, Any]:
        r, j, f = self.run, self.job, self.job.footing
        return {
            "results": self.path,
            "footing": f.name,
            "run": {"nodes": r.nodes, "node_bytes": r.node_bytes, "replicas": r.replicas,
                    "transport": r.transport, "transfer_s": r.transfer_s,
                    "network_bytes_per_s": r.network_Bps, "copy_s": r.copy_s,
                    "copy_bytes_per_s": r.copy_Bps, "memory_where": r.memory_where},
            "job": {"workload": j.name, "gpus": j.gpus, "gpus_per_node": j.gpus_per_node,
                    "nodes": j.nodes, "node_bytes": j.node_bytes,
                    "memory_bytes_per_s": f.memory_Bps, "copy_bytes_per_s": f.copy_Bps,
                    "memory_source": f.memory_source, "network_bytes_per_s": f.network_Bps,
                    "network_source": f.network_source},
            "levels": [{"level": lv.name, "scope": lv.scope, "measured_save_s": lv.measured_save_s,
                        "measured_restore_s": lv.measured_restore_s, "save_s": lv.save_s,
                        "restore_s": lv.restore_s, "scaled_by": lv.how, "footing": lv.footing,
                        "source": lv.source} for lv in self.levels],
            "cautions": self.cautions(),
            "forced": self.forced,
            "shares": self.shares(),
            "storage_assumptions": self.estimate.assumptions() if self.estimate else [],
            "storage_warnings": [w.message for w in self.estimate.warnings]
            if self.estimate else [],
        }


def _target(workload: Workload, gpus: int, gpus_per_node: int, path: str | None) -> Target:
    """The job's target as `cadence --results --workload PATH` builds it (the path names
    the run that would measure it, in a refusal)."""
    t = job_target(workload, gpus, gpus_per_node)
    if path is None:
        return t
    restore = replace(t.restore, workload_path=path) if t.restore is not None else None
    return replace(t, workload_path=path, restore=restore)


def tier_scaling(path: str, gpus: int, gpus_per_node: int, footing: Footing = STATED_FOOTING,
                 where: str = "--tiers-results", workload: Workload | None = None,
                 workload_path: str | None = None, force: bool = False,
                 forced: str = "--force", ceiling: float | None = None) -> TierScaling:
    """The tiered run at `path`, its levels scaled to `workload`'s job (default: the run's
    own full-size workload) at `gpus` on `footing`. Refused (SpecError, one line) unless
    `force`: a storage measurement `cadence --results` refuses for the job (its reasons),
    and scaled levels in an order no hardware produces (:meth:`TierScaling.cautions`);
    forced, they travel as warnings (`forced`: why, in words). `ceiling`: the storage's
    aggregate bandwidth for the whole job (bytes/s; None: it keeps up with any nodes)."""
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
    target = replace(_target(workload, gpus, gpus_per_node, workload_path), ceiling=ceiling)
    found, storage = None, None
    if "storage" in run.levels:
        found = estimate(measurement_of(records, path, where), target,
                         restart_overhead_s=DEFAULT_RESTART_OVERHEAD_S,
                         restart_source=RESTART_OVERHEAD_SOURCE, force=force, source=where)
        assert found.restore is not None  # the job model refuses a run without restores
        storage = (found.save.total_s, found.restore.total_s)
    job = JobSize(target.name, target.gpus, target.ranks_per_node, target.nodes,
                  target.heaviest_node_bytes, footing, storage)
    scaling = TierScaling(path, run, job, scale(run, job), found, forced if force else "")
    wrong = scaling.cautions()
    if wrong and not force:
        raise SpecError(f"{where} {path} scaled to the job on the {footing.name} footing gives "
                        f"an order no hardware produces: {'; '.join(wrong)}. Allowed: "
                        + ("--footing stated (figures for the job's nodes, the default)"
                           if footing.name == MEASURED else
                           "stated figures that fit the job's nodes (--node-memory-bandwidth, "
                           "--node-network)")
                        + ", or --force to use them anyway")
    return scaling
