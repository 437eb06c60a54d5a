"""What a restart costs besides reading the checkpoint, by the mechanism that follows a failure.

A restart is made of parts: noticing the failure (*detect*), getting the GPUs back
(*reschedule*: nothing, a warm spare swapped in, or waiting for a replacement node),
starting again (*start*: processes, imports, CUDA and collective initialisation) and
getting back to full speed (*warmup*: compilation, caches, the first steps). The
mechanisms differ by orders of magnitude, and which one follows a failure depends on
its reach: a software fault can be handled inside the running processes, a lost node
needs a spare, a lost switch may need new nodes. Each mechanism's parts are stated
defaults with the source they lean on; every part can be overridden.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ckptbench.cadence.classes import SCOPES, FailureClass, assign
from ckptbench.errors import SpecError
from ckptbench.units import parse_duration

PARTS = ("detect", "reschedule", "start", "warmup")


@dataclass(frozen=True)
class Mechanism:
    """A way to restart, in parts (seconds), with where its figures come from."""

    name: str
    detect: float
    reschedule: float
    start: float
    warmup: float
    source: str

    @property
    def seconds(self) -> float:
        return self.detect + self.reschedule + self.start + self.warmup

    def parts(self) -> dict[str, float]:
        return {part: getattr(self, part) for part in PARTS}


MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (
    Mechanism("in-process", 10.0, 0.0, 5.0, 5.0,
              "in-process restart (NVIDIA resiliency extension): the processes, CUDA context "
              "and imports are kept, only the process groups are rebuilt; TrainMover (Lao et "
              "al., arXiv 2412.12636) reports about 20 s of downtime at 1,024 GPUs"),
    Mechanism("warm-spare", 30.0, 30.0, 60.0, 30.0,
              "in-job relaunch onto a warm spare: new processes, imports, CUDA and NCCL "
              "initialisation; FlashRecovery (arXiv 2509.03047) restores 4,800 devices in "
              "150 s"),
    Mechanism("replacement", 60.0, 300.0, 120.0, 120.0,
              "relaunch that waits for a replacement node: Meta's FT-HSDP paper (arXiv "
              "2602.00277) reports 10 min of stall per failure for synchronous training at "
              "O(100K) GPUs; Daly's worked example also uses 600 s"),
    Mechanism("none", 0.0, 0.0, 0.0, 0.0,
              "no restart cost beyond the restore (the level's restore time includes it)"),
)}
DEFAULT_BY_SCOPE: dict[str, str] = {"process": "in-process", "node": "warm-spare",
                                    "group": "replacement", "job": "replacement"}


# Mechanisms that start new processes: their `start` is what a run measures of it.
RELAUNCHES = ("warm-spare", "replacement")


def with_measured_start(startup: Mapping[str, Any], where: str) -> dict[str, Mechanism]:
    """The mechanisms with the relaunches' `start` set to what a run measured (its
    ``startup`` record, runner.startup): a fresh process's start and imports plus the
    set-up of the run's ranks. What it leaves out is said in the source."""
    imports, set_up = (startup.get(k) for k in ("process_start_and_imports_s",
                                                "ranks_set_up_s"))
    if not all(isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < 1e6
               for x in (imports, set_up)):
        raise SpecError(f"--measured-start {where}: its startup record holds no measured "
                        "start; allowed: a results file of `ckptbench run` that ran its ranks")
    assert isinstance(imports, int | float) and isinstance(set_up, int | float)
    out = dict(MECHANISMS)
    for name in RELAUNCHES:
        out[name] = replace(out[name], start=float(imports + set_up), source=(
            f"{out[name].source}; start measured by {where}: process start and imports "
            f"{imports:.2f} s + {startup.get('ranks_set_up', 'the ranks set up')} "
            f"{set_up:.3f} s (not included: {startup.get('not_measured', 'CUDA, NCCL')})"))
    return out


def with_overrides(part_texts: Sequence[str],
                   base: Mapping[str, Mechanism] = MECHANISMS) -> dict[str, Mechanism]:
    """The mechanisms with parts overridden: ``MECHANISM.PART=DUR`` (bare number: s)."""
    out = dict(base)
    for text in part_texts:
        key, sep, value = text.partition("=")
        name, dot, part = key.strip().partition(".")
        if not sep or not dot or name not in out or part not in PARTS:
            raise SpecError(f"--restart-part {text!r}: allowed: MECHANISM.PART=DUR with "
                            f"MECHANISM {'|'.join(MECHANISMS)} and PART {'|'.join(PARTS)}, "
                            "e.g. warm-spare.reschedule=2min")
        seconds = 0.0 if value.strip() in ("0", "0s") else parse_duration(
            value, f"--restart-part {key.strip()}", "s")
        parts = {**out[name].parts(), part: seconds}
        out[name] = replace(out[name], detect=parts["detect"], reschedule=parts["reschedule"],
                            start=parts["start"], warmup=parts["warmup"],
                            source=out[name].source + f"; {part} given")
    return out


def by_scope(texts: Sequence[str]) -> dict[str, str]:
    """Which mechanism follows a failure of each scope: defaults, then ``SCOPE=MECHANISM``."""
    out = dict(DEFAULT_BY_SCOPE)
    for text in texts:
        scope, sep, name = (s.strip() for s in text.partition("="))
        if not sep or scope not in SCOPES or name not in MECHANISMS:
            raise SpecError(f"--restart {text!r}: allowed: SCOPE=MECHANISM with SCOPE "
                            f"{'|'.join(SCOPES)} and MECHANISM {'|'.join(MECHANISMS)}")
        out[scope] = name
    return out


def per_level(level_scopes: Sequence[str], classes: Sequence[FailureClass], gpus: int,
              gpus_per_host: int, mechanisms: Mapping[str, Mechanism],
              chosen: Mapping[str, str]) -> list[float]:
    """Restart seconds added to each level's restore: the mean over the failures that need
    that level, weighted by their rates (the multi-level model has one restore cost per
    level; a level no class needs gets the mechanism of its own scope)."""
    totals = [0.0] * len(level_scopes)
    weights = [0.0] * len(level_scopes)
    for c, level in zip(classes, assign(level_scopes, classes), strict=True):
        rate = c.per_second(gpus, gpus_per_host)
        totals[level] += rate * mechanisms[chosen[c.scope]].seconds
        weights[level] += rate
    return [t / w if w > 0 else mechanisms[chosen[scope]].seconds
            for t, w, scope in zip(totals, weights, level_scopes, strict=True)]
