"""`ckptbench run --mode async`: the mode and the training loop's options (its table is
the report step's: ``report.table.async_grid``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ckptbench.errors import SpecError
from ckptbench.runner.options import MODES, LoopOptions
from ckptbench.runner.training import KERNELS
from ckptbench.units import parse_size

# click parameter -> its flag
_LOOP_FLAGS: dict[str, str] = {
    "step_seconds": "--step-seconds", "steps_per_checkpoint": "--steps-per-checkpoint",
    "staging_memory": "--staging-memory", "step_kernel": "--step-kernel",
    "state_device": "--state-device"}


def async_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The --mode flag and the training loop's flags (async only)."""
    options = [
        click.option("--mode", type=click.Choice(MODES), default="sync", show_default=True,
                     help="sync: save, then restore. async: a training loop checkpoints every "
                          "--steps-per-checkpoint steps (ITERATIONS checkpoints): blocking "
                          "snapshot, background persist, interference with the steps."),
        click.option("--step-seconds", type=float, default=1.0, show_default=True,
                     help="async: one training step's compute, calibrated on this machine."),
        click.option("--steps-per-checkpoint", type=click.IntRange(min=1), default=10,
                     show_default=True, help="async: steps between checkpoints."),
        click.option("--staging-memory", default="state", show_default=True,
                     help="async: staging memory per process for the snapshot, e.g. 512MiB "
                          "(state: as much as the state); less makes the loop wait for the "
                          "pieces that do not fit."),
        click.option("--step-kernel", type=click.Choice(KERNELS), default="auto",
                     show_default=True,
                     help="async: the step's work: memory (a STREAM triad), matmul; auto: "
                          "matmul on a GPU, memory on the host."),
        click.option("--state-device", type=click.Choice(["auto", "host", "cuda"]),
                     default="auto", show_default=True,
                     help="async: where the state lives; cuda: torch CUDA tensors, pinned "
                          "staging, device-to-host snapshots (auto: when torch has CUDA)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def loop_options(values: dict[str, Any], mode: str, ctx: click.Context) -> LoopOptions:
    """The loop's options from the flags (taken out of `values`); a loop flag given with
    --mode sync is refused, it would change nothing."""
    given = [flag for name, flag in _LOOP_FLAGS.items()
             if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    loop = {name: values.pop(name) for name in _LOOP_FLAGS}
    if mode != "async" and given:
        raise SpecError(f"{given[0]} needs --mode async (a sync run has no training loop)")
    return LoopOptions(step_seconds=loop["step_seconds"],
                       steps_per_checkpoint=loop["steps_per_checkpoint"],
                       staging_bytes=0 if loop["staging_memory"] == "state" else
                       parse_size(loop["staging_memory"], "--staging-memory"),
                       kernel=loop["step_kernel"], device=loop["state_device"])
