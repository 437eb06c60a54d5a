"""The synthetic training step of ``--mode async``: real work that takes a set time.

A step is ``layers`` layers; a layer runs ``units`` units of a kernel, then the loop's
collective (as FSDP gathers and reduces per layer). The unit is timed once per run on
every process together, before anything else runs, and the processes agree on the
median; the number of units is then fixed, so a step that runs slower later (a persist
competing for the CPU, memory bandwidth or PCIe) shows as a longer step: the
interference.

Kernels: ``memory`` (host default): a STREAM triad over arrays far larger than the
caches: memory bandwidth, what a persist's copies and writes compete for. ``matmul``:
float32 matrix products (on the GPU with CUDA, the default there): compute.
"""

from __future__ import annotations

import math
import statistics
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptbench.errors import SpecError

KERNELS = ("auto", "memory", "matmul")
LAYER_S = 0.025  # one collective per this much compute (FSDP-like), at most one per unit


class Kernel(ABC):
    name = "?"

    @abstractmethod
    def unit(self) -> None:
        """One unit of work, finished when it returns."""

    def run(self, units: int) -> None:
        for _ in range(units):
            self.unit()


class MemoryKernel(Kernel):
    """a = b + s * c over three 8 MiB float64 arrays (STREAM's triad, 24 MiB per unit;
    numpy releases the GIL inside, as a GPU kernel would not hold the interpreter)."""

    name = "memory"

    def __init__(self, words: int = 1 << 20) -> None:
        self.a = np.zeros(words)
        self.b = np.full(words, 1.0)
        self.c = np.full(words, 2.0)

    def unit(self) -> None:
        np.multiply(self.c, 1.0000001, out=self.a)
        np.add(self.a, self.b, out=self.a)


class MatmulKernel(Kernel):
    """C = A @ B, float32, 256 x 256 on the host."""

    name = "matmul"

    def __init__(self, n: int = 256) -> None:
        rng = np.random.default_rng(0)
        self.a = rng.standard_normal((n, n), dtype=np.float32)
        self.b = rng.standard_normal((n, n), dtype=np.float32)
        self.c = np.empty((n, n), dtype=np.float32)

    def unit(self) -> None:
        np.matmul(self.a, self.b, out=self.c)


class CudaMatmulKernel(Kernel):
    """C = A @ B, float32, 4096 x 4096 on the GPU, synchronized per unit."""

    name = "matmul"

    def __init__(self, device: Any, n: int = 4096) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.a = torch.randn(n, n, device=device)
        self.b = torch.randn(n, n, device=device)
        self.c = torch.empty(n, n, device=device)

    def unit(self) -> None:
        self.torch.matmul(self.a, self.b, out=self.c)
        self.torch.cuda.synchronize(self.device)


def open_kernel(name: str, device: str, cuda_device: Any = None) -> Kernel:
    """Kernel `name` for a state on `device` ('host' or 'cuda'); auto: matmul on the GPU,
    the memory kernel on the host."""
    if name not in KERNELS:
        raise SpecError(f"--step-kernel {name!r} is not allowed; allowed: {', '.join(KERNELS)}")
    if device == "cuda" and name in ("auto", "matmul"):
        return CudaMatmulKernel(cuda_device)
    return MatmulKernel() if name == "matmul" else MemoryKernel()


def unit_seconds(kernel: Kernel, budget_s: float = 0.3) -> float:
    """Median time of one unit, over about `budget_s` of units (after one warm-up)."""
    kernel.unit()
    times: list[float] = []
    t_end = time.perf_counter() + budget_s
    while time.perf_counter() < t_end or len(times) < 5:
        t0 = time.perf_counter()
        kernel.unit()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass(frozen=True)
class Schedule:
    """Units per layer and layers per step for a step of `step_s` (nominal)."""

    unit_s: float
    units: int  # per layer
    layers: int  # per step
    step_s: float  # asked for

    @property
    def nominal_s(self) -> float:
        return self.unit_s * self.units * self.layers

    def to_dict(self) -> dict[str, Any]:
        return {"unit_s": self.unit_s, "units_per_layer": self.units, "layers": self.layers,
                "step_seconds": self.step_s, "calibrated_step_s": self.nominal_s}


def schedule(unit_s: float, step_s: float, layer_s: float = LAYER_S) -> Schedule:
    """Units and layers so that a step takes about `step_s` on the machine as calibrated."""
    total = max(1, round(step_s / unit_s))
    per_layer = max(1, min(total, round(layer_s / unit_s)))
    return Schedule(unit_s, per_layer, max(1, math.ceil(total / per_layer)), step_s)
