"""The one throughput every command prints, and the names of every other figure.

*Throughput* (``save throughput 0.6023 GB/s``): a phase's bytes over its wall time, from
the first rank's first call (a restore: from reading the manifest) until the slowest rank
is done and, for a save, the manifest is committed: what a training job waits for. The
median over iterations. ``run``, ``report``, ``sweep``, ``cadence`` and ``mlperf`` print
it in the same words (:func:`headline`), with the parts of the wall time, so one results
file gives one throughput whichever command reads it.

Every other rate is named by what it is:

* *data-only throughput*: the bytes over the ranks' span alone (the manifest and the
  commit, or the manifest read, left out);
* *per node, data only*: a node's bytes over its ranks' span, the geometric mean over
  the node samples: what ``cadence``'s job model scales to the job and ``sweep`` plots;
* *per rank*: a rank's bytes over its own span.

Units follow :data:`ckptbench.units.CONVENTION`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ckptbench.units import CONVENTION, format_bytes, format_rate

NAME = "throughput"
DEFINITION = ("throughput: bytes over the phase's wall time, from the first rank's first call "
              "(restore: the manifest read) until the slowest rank is done and (save) the "
              "manifest committed; median over iterations")
DATA_ONLY = "data-only throughput"
PER_NODE = "per node, data only"
PER_NODE_DEFINITION = (f"{PER_NODE}: a node's bytes over its ranks' span (manifest and commit "
                       "left out), geometric mean over the node samples")
NOTE = (f"{DEFINITION}. {DATA_ONLY} (save): the same bytes over the ranks' span alone (the"
        f" manifest and the commit left out). {CONVENTION}.")


def parts(summary: Mapping[str, Any]) -> dict[str, float]:
    """The parts of a phase's wall time, in seconds (medians over iterations): the
    summary's own ``parts`` when it has them, else, for a save, the data (the ranks'
    span) and the manifest and commit after it; for a restore, the ranks' reads (each
    rank reads the manifest first, inside its span) and any manifest read before them."""
    given = summary.get("parts")
    if isinstance(given, Mapping) and given:
        return {str(k): float(v) for k, v in given.items() if isinstance(v, int | float)}
    data = summary.get("data_seconds")
    if not isinstance(data, int | float):
        return {}
    rest = max(float(summary["seconds"]) - data, 0.0)
    if summary.get("phase") == "save":
        return {"data": float(data), "manifest and commit": rest}
    manifest = summary.get("manifest_s")
    reads = "reads" + (f" (each rank's manifest read, up to {manifest:.3g} s, included)"
                       if isinstance(manifest, int | float) and manifest > 0 else "")
    return {reads: float(data), **({"manifest read before them": rest} if rest > 0 else {})}


def data_only(summary: Mapping[str, Any]) -> float | None:
    """The data-only throughput: bytes over the data part alone (None: no such part)."""
    data = parts(summary).get("data")
    return summary["bytes"] / data if data else None


def headline(summary: Mapping[str, Any]) -> str:
    """One phase's throughput in the words every command prints, e.g. 'save throughput
    0.6023 GB/s (22.47 MiB in 0.039 s, median of 5 iterations; data 0.031 s + manifest
    and commit 0.008 s; data-only throughput 0.7598 GB/s)'."""
    n = summary.get("iterations", 1)
    text = (f"{summary['phase']} {NAME} {format_rate(summary['throughput_bytes_per_s'])}"
            f" ({format_bytes(summary['bytes'])} in {summary['seconds']:.3g} s, median of {n}"
            f" iteration{'s' if n != 1 else ''}")
    split = parts(summary)
    if split:
        text += "; " + " + ".join(f"{k} {v:.3g} s" for k, v in split.items())
    rate = data_only(summary)
    if rate is not None:
        text += f"; {DATA_ONLY} {format_rate(rate)}"
    return text + ")"


def headlines(summaries: Iterable[Mapping[str, Any]]) -> list[str]:
    """The headline of each phase summarized (summary records of `ckptbench run`)."""
    return [headline(s) for s in summaries if s.get("type", "summary") == "summary"
            and "throughput_bytes_per_s" in s]
