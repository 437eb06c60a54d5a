"""What a run is asked to do: the options every process shares, and the whole request."""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ckptbench.backends import Backend
from ckptbench.errors import SpecError
from ckptbench.formats.base import FormatOptions
from ckptbench.plan import Plan
from ckptbench.plan.tiers import TierPlan
from ckptbench.runner.sequence import RunSequence, check_sequence
from ckptbench.runner.threads import MAX_INTRA_OP_THREADS
from ckptbench.runner.training import KERNELS
from ckptbench.spec import Workload
from ckptbench.tierspec import TiersSpec

if TYPE_CHECKING:
    from ckptbench.runner.cleanup import RunNames


def new_run_id() -> str:
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


MODES = ("sync", "async")
PLANNED_RESTORE = ("raw", "torch-dcp")  # formats that restore by the restore plan
MAX_STEP_S = 3600.0  # a training step; a typo (1e9) would never end
# The training loop's bound, checked before it starts: its steps (each is a record) and
# their compute time (a benchmark's loop, not a training run).
MAX_LOOP_STEPS = 1_000_000
MAX_LOOP_S = 24 * 3600.0


@dataclass(frozen=True)
class LoopOptions:
    """--mode async: the synthetic training loop the checkpoints are taken from."""

    step_seconds: float = 1.0  # one training step's compute, calibrated on this machine
    steps_per_checkpoint: int = 10
    staging_bytes: int = 0  # staging memory per process; 0: as much as the state
    kernel: str = "auto"  # auto | memory | matmul (auto: matmul on CUDA, else memory)
    device: str = "auto"  # where the state lives: auto | host | cuda

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_seconds) and 0 < self.step_seconds <= MAX_STEP_S):
            raise SpecError(f"--step-seconds {self.step_seconds} must be > 0 and at most "
                            f"{MAX_STEP_S:g} (an hour: a step, not a run)")
        if self.steps_per_checkpoint < 1:
            raise SpecError(f"--steps-per-checkpoint {self.steps_per_checkpoint} must be >= 1")
        if self.staging_bytes < 0:
            raise SpecError(f"--staging-memory {self.staging_bytes} must be >= 0 (0: the state)")
        if self.kernel not in KERNELS:
            raise SpecError(f"--step-kernel {self.kernel!r} is not allowed; allowed: "
                            f"{', '.join(KERNELS)}")
        if self.device not in ("auto", "host", "cuda"):
            raise SpecError(f"--state-device {self.device!r} is not allowed; allowed: auto, "
                            "host, cuda")

    def steps(self, iterations: int) -> int:
        """Steps the loop runs: `iterations` checkpoints and one interval more, with as
        many baseline steps again (runner.async_mode)."""
        return 2 * (iterations + 1) * self.steps_per_checkpoint

    def check_length(self, iterations: int) -> None:
        """Refuse a loop longer than MAX_LOOP_STEPS steps or MAX_LOOP_S of their compute."""
        steps = self.steps(iterations)
        if steps > MAX_LOOP_STEPS or steps * self.step_seconds > MAX_LOOP_S:
            raise SpecError(
                f"--steps-per-checkpoint {self.steps_per_checkpoint} x (--iterations "
                f"{iterations} + 1) is {steps:,} training steps with the baseline, "
                f"{steps * self.step_seconds:,.0f} s at --step-seconds {self.step_seconds:g}; "
                f"allowed: at most {MAX_LOOP_STEPS:,} steps and {MAX_LOOP_S / 3600:g} h")


def check_tier_options(o: RunOptions) -> None:
    """What a tiered run cannot combine with, refused in one line."""
    if o.mode != "sync" and (o.tiers.has("memory") or not o.tiers.has("peer")
                             or o.tiers.storage_every != 1):
        raise SpecError(f"--tiers {','.join(o.tiers.use)} with --mode {o.mode}: async mode "
                        "persists every checkpoint to storage and replicates it to peers in "
                        "the background; allowed: --tiers peer or peer,storage (--storage-every "
                        "1), or --mode sync")
    if o.checkpoint:
        raise SpecError("--tiers: restoring a kept checkpoint has no tiers; allowed: no --tiers")
    if o.sequence != "interleaved":
        raise SpecError("--tiers: the checkpoints are restored after the last one; allowed: "
                        "the interleaved sequence")


@dataclass(frozen=True)
class RunOptions:
    iterations: int = 1
    threads: int = 1
    block_size: int = 8 << 20
    payload: str = "random"
    seed: int = 0
    keep: bool = False
    restore: bool = True
    prefill_bytes: int = 64 << 20  # per process: generated before the clock starts
    cache: str = "auto"  # auto: evict after save; none: leave caches alone
    run_id: str = "run"
    restore_shift: int = 0  # read the files of rank (r + shift) % world (IOR -C)
    format: str = "raw"  # raw | zarr | torch-dcp (ckptbench.formats)
    codec: str = "none"  # zarr only: NAME[:k=v,...] (ckptbench.formats.codecs)
    verify: bool = True  # False: a diagnostic (raw format): restores recorded as unverified
    stall_timeout: float = 120.0  # s without a byte moved while saving/restoring; 0: off
    # dcp: each rank of the restore layout reads what DCP's load planner reads (raw format);
    # files: each rank reads back the files it wrote, whole
    restore_plan: str = "dcp"
    # `ckptbench restore`: restore this kept checkpoint (key prefix) instead of saving one;
    # the iteration it was saved as (its payload's stream keys)
    checkpoint: str = ""
    checkpoint_iteration: int = 1
    clean_debris: bool = False  # remove what interrupted runs left on the target (by name)
    mode: str = "sync"  # sync: save then restore; async: checkpoints of a training loop
    loop: LoopOptions = field(default_factory=LoopOptions)  # --mode async only
    sequence: RunSequence = "interleaved"  # or writes-then-reads (runner.sequence)
    tiers: TiersSpec = field(default_factory=TiersSpec)  # recovery tiers (runner.tiers)
    tier_plan: TierPlan | None = None  # placed by the session once the hosts are known
    # torch's intra-op threads per rank process (runner.threads); 0: auto, which the
    # session resolves once it knows how many processes each node runs
    intra_op_threads: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.intra_op_threads <= MAX_INTRA_OP_THREADS:
            raise SpecError(f"--intra-op-threads {self.intra_op_threads} is not allowed; "
                            f"allowed: 1 to {MAX_INTRA_OP_THREADS}, or auto")
        if self.mode not in MODES:
            raise SpecError(f"--mode {self.mode!r} is not allowed; allowed: {', '.join(MODES)}")
        if self.tiers.enabled:
            check_tier_options(self)
        check_sequence(self.sequence)
        if self.mode == "async":
            self.loop.check_length(self.iterations)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def uses_restore_plan(self) -> bool:
        """Restores run the DCP restore plan: asked for, with the raw format (its ranged
        reads) or torch-dcp (dcp.load on the restore layout); the others read back their
        own files."""
        return self.restore and self.restore_plan == "dcp" and self.format in PLANNED_RESTORE

    def format_options(self) -> FormatOptions:
        return FormatOptions(threads=self.threads, block_size=self.block_size,
                             payload=self.payload, seed=self.seed,
                             prefill_bytes=self.prefill_bytes, codec=self.codec,
                             verify=self.verify)


@dataclass(frozen=True)
class RunRequest:
    workload: Workload  # as written in the workload file (full size)
    plan: Plan  # of the workload as run (after --scale)
    ranks: list[int]
    backend: Backend
    options: RunOptions
    scale: int = 1
    # options.restore_shift was not given: 0 locally and on one node, the plan ranks per
    # node under MPI on several nodes (so no node reads back what it wrote).
    restore_shift_auto: bool = False
    # Every name the run writes (the session fills it in on the process that cleans up).
    names: RunNames | None = None
    # The command and the declared run options it was made of (ckptbench.runspec), as the
    # results file records them for `run --replay`.
    command: str = "run"
    settings: dict[str, Any] = field(default_factory=dict)
