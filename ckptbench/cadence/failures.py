"""How often the job is interrupted: its MTBF given, from a published failure rate per
GPU-hour (the presets, with their sources), or from component rates in series."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ckptbench.cadence.formulas import SECONDS_PER_HOUR, positive
from ckptbench.errors import SpecError


@dataclass(frozen=True)
class FailurePreset:
    """A published job-interruption rate, per GPU-hour, with where it comes from."""

    name: str
    rate_per_gpu_hour: float
    citation: str


FAILURE_PRESETS: dict[str, FailurePreset] = {
    p.name: p
    for p in (
        FailurePreset(
            "llama3", 1.97e-5,
            "Llama 3 Herd of Models (Meta, 2024): 419 unexpected interruptions in 54 days"
            " on 16,384 H100",
        ),
        FailurePreset(
            "rsc1", 3.39e-5,
            "Kokolis et al. 2024, Revisiting Reliability in Large-Scale ML Research"
            " Clusters: Meta RSC-1, 16k A100, 6.50 failures per 1k node-days",
        ),
        FailurePreset(
            "rsc2", 1.22e-5,
            "Kokolis et al. 2024 (same paper): Meta RSC-2, 8k A100, 2.34 failures per 1k"
            " node-days",
        ),
        FailurePreset(
            "opt175b", 7.4e-5,
            "OPT-175B logbook (Meta, 2022): ~105 restarts in ~2 months on 992 A100",
        ),
        FailurePreset(
            "bloom", 2.3e-5,
            "BLOOM-176B training (BigScience, 2022): 1-2 GPU failures a week on 384 A100",
        ),
    )
}


@dataclass(frozen=True)
class Component:
    """One kind of part that can interrupt the job: its rate per unit-hour and count.

    ``per_host`` is how many units each host has; None means one per GPU.
    """

    name: str
    rate_per_hour: float
    per_host: float | None = None

    def units(self, gpus: int, gpus_per_host: int) -> float:
        if self.per_host is None:
            return float(gpus)
        return self.per_host * math.ceil(gpus / gpus_per_host)


_HOST_NAMES = ("host", "node")


def parse_component(text: str) -> Component:
    """``NAME=RATE[:PER_HOST]`` (rate per unit-hour); no PER_HOST = one per GPU
    (``host`` and ``node`` default to one per host)."""
    usage = f"--component {text!r} must be NAME=RATE[:PER_HOST], e.g. gpu=1.2e-5 or nic=1e-6:8"
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise SpecError(usage)
    rate_text, colon, count_text = rest.partition(":")
    try:
        rate = float(rate_text)
        per_host = float(count_text) if colon else (1.0 if name in _HOST_NAMES else None)
    except ValueError:
        raise SpecError(usage) from None
    if not math.isfinite(rate) or rate < 0:
        raise SpecError(f"--component {name}: rate {rate_text} must be >= 0 per unit-hour")
    if per_host is not None and (not math.isfinite(per_host) or per_host <= 0):
        raise SpecError(f"--component {name}: PER_HOST {count_text} must be > 0")
    return Component(name, rate, per_host)


@dataclass(frozen=True)
class FailureModel:
    """The job MTBF and, for the printout, how it was arrived at."""

    mtbf_s: float
    source: str


def series_mtbf_s(gpus: int, components: Iterable[Component], gpus_per_host: int = 8) -> float:
    """Job MTBF of a series system: 1 / sum(n_i lambda_i); inf when nothing fails."""
    if gpus < 1:
        raise SpecError(f"--gpus = {gpus} must be an integer >= 1")
    if gpus_per_host < 1:
        raise SpecError(f"--gpus-per-node = {gpus_per_host} must be an integer >= 1")
    rate = sum(c.rate_per_hour * c.units(gpus, gpus_per_host) for c in components)
    return math.inf if rate == 0 else SECONDS_PER_HOUR / rate


def failure_model(*, mtbf_s: float | None = None, preset: str | None = None,
                  components: Iterable[Component] = (), gpus: int | None = None,
                  gpus_per_host: int = 8) -> FailureModel:
    """One MTBF from exactly one source: given directly, or from a preset and/or parts."""
    components = tuple(components)
    if mtbf_s is not None:
        if preset is not None or components:
            raise SpecError("--mtbf cannot be combined with --failure-preset or --component")
        mtbf_s = positive("--mtbf", mtbf_s, allow_inf=True)
        return FailureModel(mtbf_s, "given" if math.isfinite(mtbf_s) else "given: no failures")
    if preset is None and not components:
        raise SpecError("a failure model is required: --mtbf, --failure-preset or --component")
    if preset is not None and preset not in FAILURE_PRESETS:
        raise SpecError(
            f"--failure-preset {preset!r} is not known; allowed: {', '.join(FAILURE_PRESETS)}"
        )
    if gpus is None:
        raise SpecError("--gpus is required to turn failure rates into a job MTBF")
    parts = [f"{c.name} {c.rate_per_hour:.3g}/h x {c.units(gpus, gpus_per_host):g}"
             for c in components]
    if preset is not None:
        rate = FAILURE_PRESETS[preset].rate_per_gpu_hour
        components = (Component(preset, rate), *components)
        parts.insert(0, f"{preset} preset {rate:.3g}/GPU-h")
    mtbf = series_mtbf_s(gpus, components, gpus_per_host)
    return FailureModel(mtbf, f"{' + '.join(parts)} at {gpus} GPUs")
