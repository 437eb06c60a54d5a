"""Where a measurement cannot stand for the job, and the run that would measure it.

Each check compares what ran with the target and, when they differ too much, names the
`ckptbench run` command that measures the missing case (the run's own command with that
one thing fixed). The job model refuses a measurement with findings unless forced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from ckptbench.errors import SpecError
from ckptbench.jobmodel.measured import Measurement
from ckptbench.jobmodel.target import Target
from ckptbench.units import format_bytes

MIN_SAMPLES = 5  # per-node samples (nodes x iterations) for a spread estimate worth the name
BYTES_TOLERANCE = 2.0  # bytes per rank may differ by this factor either way
DEFAULT_BLOCK = 8 << 20  # `ckptbench run --block-size` default


@dataclass(frozen=True)
class Finding:
    """One reason the measurement does not fit the target, and the run that would."""

    check: str  # ranks-per-node | bytes-per-rank | tiny-files | iterations | cache
    message: str
    command: str  # "": no run of ckptbench's options measures it (said in the message)
    fix: dict[str, Any] = field(default_factory=dict, compare=False)  # RunShape changes


@dataclass(frozen=True)
class RunShape:
    """The parts of a `ckptbench run` command line the checks change."""

    workload: str
    ranks: int  # plan ranks 0..ranks-1 on one node
    scale: int
    iterations: int
    cache: str = ""

    def command(self) -> str:
        ranks = "0" if self.ranks == 1 else f"0-{self.ranks - 1}"
        extra = f" --cache {self.cache}" if self.cache else ""
        return (f"ckptbench run {self.workload} --ranks {ranks} --scale {self.scale}"
                f" --iterations {self.iterations}{extra} --target DIR")


def _size(n: float) -> str:
    return format_bytes(n)


def _cache_finding(m: Measurement) -> tuple[str, bool] | None:
    """Why the restore may have read from memory, and whether `--cache auto` would
    change that; None when it was cold. A process's restore is cold when it evicted what
    it wrote (O_DIRECT, fadvise, drop_caches) or its target has no cache to evict (an
    object store: 'none (object store)'; any 'none' when the run asked for --cache auto);
    'warm: ...' is a client cache that could not be evicted (docs/parallel-fs.md)."""
    assert m.restore is not None
    methods = set((m.restore.cache or "none").split(","))
    warm = sorted(x for x in methods if x.startswith("warm"))
    if warm:
        return (f"restore: recorded warm ({'; '.join(warm)}): reads may have come from the"
                " client's cache, which --cache auto could not evict (see docs/parallel-fs.md:"
                " --io direct or a restore shift across nodes)", False)
    if "none" in methods and m.cache_option != "auto":
        return ("restore: caches were not avoided (--cache none): reads may have come from"
                " memory", True)
    return None


def _scale_for(scale: int, have: float, want: float) -> int:
    """The --scale that brings `have` bytes (at `scale`) to about `want`: bytes shrink with
    the square of the scale (both dimensions of a matrix are divided)."""
    return max(1, round(scale * math.sqrt(have / want)))


def _same_workload(m: Measurement, t: Target) -> bool:
    return t.workload_path is not None and t.name == m.workload_name


def _shape(m: Measurement, t: Target) -> RunShape:
    """The run as it was (its workload file by name, unless it is the target's)."""
    workload = t.workload_path if _same_workload(m, t) and t.workload_path \
        else f"workloads/{m.workload_name}.toml"
    return RunShape(workload, m.ranks_per_node, m.scale, m.save.iterations)


def findings(m: Measurement, t: Target, need_restore: bool = True) -> list[Finding]:
    """Every way `m` falls short of standing for `t`, each with its run."""
    shape = _shape(m, t)
    same = _same_workload(m, t)  # then --scale 1 is exactly the target's bytes
    out: list[Finding] = []

    def add(check: str, message: str, **fix: Any) -> None:
        out.append(Finding(check, message, replace(shape, **fix).command() if fix else "", fix))

    if m.ranks_per_node != t.ranks_per_node:
        add("ranks-per-node",
            f"ranks per node: the run had {m.ranks_per_node}, the target has {t.ranks_per_node}"
            " (a node's throughput depends on how many ranks share its device and links)",
            ranks=t.ranks_per_node)
    ratio = t.bytes_per_rank / m.bytes_per_rank
    if not 1 / BYTES_TOLERANCE <= ratio <= BYTES_TOLERANCE:
        fix: dict[str, Any] = {"scale": 1 if same else _scale_for(m.scale, m.bytes_per_rank,
                                                                   t.bytes_per_rank)}
        at_full = m.bytes_per_rank * m.scale**2
        if not same and at_full * BYTES_TOLERANCE < t.bytes_per_rank and t.workload_path:
            fix = {"scale": 1, "workload": t.workload_path}  # even full size is too small
        add("bytes-per-rank",
            f"bytes per rank: the run wrote {_size(m.bytes_per_rank)}, the target writes"
            f" {_size(t.bytes_per_rank)} ({ratio:.3g}x; allowed within {BYTES_TOLERANCE:g}x)",
            **fix)
    # without a plan, the target's files are taken to grow with its bytes per rank
    target_files = t.file_bytes or (m.file_bytes or 0.0) * ratio
    unit = min(target_files, m.block_size or DEFAULT_BLOCK)
    if m.file_bytes is not None and m.file_bytes < unit / 2:
        chunks = f", {_size(m.chunk_bytes)} per chunk" if m.chunk_bytes else ""
        at = f" at --scale {m.scale}" if m.scale > 1 else ""
        add("tiny-files",
            f"files are tiny{at}: {_size(m.file_bytes)} per file{chunks}, against {_size(unit)}"
            " (the target's files, or one --block-size write if smaller): per-file costs"
            " (open, fsync, close) dominate",
            scale=1 if same else max(1, math.floor(m.scale * math.sqrt(m.file_bytes / unit))))
    if m.samples < MIN_SAMPLES:
        add("iterations",
            f"spread: {m.samples} per-node sample(s) ({m.nodes} node(s) x {m.save.iterations}"
            f" iteration(s)); the slowest-of-{t.nodes:,} estimate needs at least {MIN_SAMPLES}",
            iterations=math.ceil(MIN_SAMPLES / m.nodes))
    cache = _cache_finding(m) if need_restore and m.restore is not None else None
    if cache is not None:
        message, fixed_by_auto = cache
        add("cache", message, **({"cache": "auto"} if fixed_by_auto else {}))
    return out


def combined_command(m: Measurement, t: Target, found: list[Finding]) -> str:
    """One run that answers every finding at once (the smallest scale, the most
    iterations asked for); "" when no finding names a run (it would be the same run)."""
    if not any(f.fix for f in found):
        return ""
    merged: dict[str, Any] = {}
    for f in found:
        for key, wanted in f.fix.items():
            value = wanted
            if key in merged and key in ("scale", "iterations"):
                value = (min if key == "scale" else max)(merged[key], wanted)
            merged[key] = value
    return replace(_shape(m, t), **merged).command()


def refusal(found: list[Finding], combined: str, source: str) -> SpecError:
    """The one-line error for a measurement that cannot stand for the job."""
    reasons = "; ".join(f.message + (f" [measure: {f.command}]" if f.command else "")
                        for f in found)
    how = f"Measure it with `{combined}`, or give" if combined else "Give"
    return SpecError(f"{source} cannot stand for the target job: {reasons}. {how} --force to use"
                     " it anyway")
