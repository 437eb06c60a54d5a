"""Sweeps: the same workload at several ranks per node, one results file per point.

A sweep file (JSON Lines, ``ckptbench.sweep/1``) has a ``sweep`` line (workload, scale,
iterations, target) and one ``point`` line per run: its ranks per node, its results file
(relative to the sweep file), the per-node figures (per node, data only: the figure the
job model scales) and each phase's throughput (``report.throughput``: what `run` prints
for the same results), so the curve reads without the results. The job model takes the
point whose ranks per node match the target's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ckptbench.errors import SpecError
from ckptbench.fields import read_small_text
from ckptbench.jobmodel.measured import Measurement, read_results, results_error

SWEEP_SCHEMA = "ckptbench.sweep/1"
# A sweep file is a header line and one short line per point.
MAX_SWEEP_FILE_BYTES = 64 << 20
SATURATION_GAIN = 1.10  # more ranks per node must add at least 10 % per node to count


@dataclass(frozen=True)
class SweepPoint:
    """One point of the per-node curve."""

    ranks_per_node: int
    results: str
    bytes_per_rank: float
    save_node_bytes_per_s: float  # per node, data only (geometric mean over node samples)
    restore_node_bytes_per_s: float | None
    save_bytes_per_s: float | None = None  # the phase's throughput, median over iterations
    restore_bytes_per_s: float | None = None
    nodes: int = 1  # the nodes the point ran on (mpirun/srun: each with ranks_per_node)

    @classmethod
    def of(cls, m: Measurement, results: str) -> SweepPoint:
        restore = m.restore.node_bytes_per_s if m.restore else None
        return cls(m.ranks_per_node, results, m.bytes_per_rank, m.save.node_bytes_per_s,
                   restore, m.save.throughput_bytes_per_s,
                   m.restore.throughput_bytes_per_s if m.restore else None, m.nodes)


def saturation(points: list[SweepPoint], phase: str = "save") -> SweepPoint | None:
    """The first point that no later point beats by 10 % or more per node: where the
    node's device or links saturate (None: the last point is still the first such)."""
    ordered = sorted(points, key=lambda p: p.ranks_per_node)

    def rate(p: SweepPoint) -> float:
        value = p.save_node_bytes_per_s if phase == "save" else p.restore_node_bytes_per_s
        return value or 0.0

    for i, here in enumerate(ordered[:-1]):
        if max(rate(p) for p in ordered[i + 1:]) < SATURATION_GAIN * rate(here):
            return here
    return None


def sweep_points(path: Path, source: str = "--results") -> list[str]:
    """The results files a sweep file lists (relative to it)."""
    points: list[str] = []
    try:
        text = read_small_text(path, MAX_SWEEP_FILE_BYTES, "a sweep file of `ckptbench sweep`")
    except SpecError as exc:
        raise SpecError(f"{source} {exc}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise results_error(f"{source} {path}:{number}", "not a JSON line") from None
        if isinstance(record, dict) and record.get("type") == "point":
            if not isinstance(record.get("results"), str):
                raise results_error(f"{source} {path}:{number}", "point without a 'results' path")
            points.append(record["results"])
    if not points:
        raise results_error(f"{source} {path}", "a sweep file with no points")
    return points


def write_sweep(path: Path, header: Mapping[str, Any], points: Iterable[SweepPoint]) -> None:
    """A sweep file: a ``sweep`` line, then one ``point`` line per results file (its path
    relative to the sweep file). Never overwrites."""
    lines = [{"type": "sweep", "schema": SWEEP_SCHEMA, **header},
             *({"type": "point", **asdict(p)} for p in points)]
    try:
        with path.open("x") as f:
            f.writelines(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)
    except FileExistsError:
        raise SpecError(f"{path}: sweep file exists (never overwritten)") from None


def _first_line(path: Path) -> Any:
    try:
        with path.open("rb") as f:  # a sweep's header is short: no line is read on and on
            return json.loads(f.readline(1 << 20) or b"null")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None  # not a sweep file: read as a results file, which says what is wrong


def read_measurements(paths: Iterable[str | Path], source: str = "--results") -> list[Measurement]:
    """Results files and sweep files (each point's results file, resolved beside it)."""
    out: list[Measurement] = []
    for path in map(Path, paths):
        head = _first_line(path) if path.is_file() else None
        if isinstance(head, dict) and head.get("schema") == SWEEP_SCHEMA:
            out += [read_results(path.parent / p, f"{source} {path}: point")
                    for p in sweep_points(path, source)]
        else:
            out.append(read_results(path, source))
    return out
