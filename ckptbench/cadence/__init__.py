"""How often to checkpoint: Young, Daly and the exact optimum against the job's MTBF.

* ``formulas``: Daly's exponential-failure model (FGCS 22, 2006): the intervals (Young,
  Daly, the exact optimum through Lambert W) and what an interval costs.
* ``failures``: the job's MTBF, given or from published failure rates per GPU-hour.
* ``answer``: one checkpoint's cost (blocking save, restart and restore, an asynchronous
  persist and the interference it causes), the recommended interval, goodput, the
  inverse question.

Pure arithmetic; nothing here imports backends or the runner. C and R from a measured
run come from the job model (``ckptbench.jobmodel``), the step before this one.
"""

from ckptbench.cadence.answer import (
    DEFAULT_RESTART_OVERHEAD_S,
    RESTART_OVERHEAD_SOURCE,
    CadenceReport,
    CheckpointCost,
    OperatingPoint,
    analyze,
    best_goodput,
    goodput_curve,
    interval_floor,
    operating_point,
    plotted_curve,
    required_save_seconds,
    workload_checkpoint_bytes,
)
from ckptbench.cadence.failures import (
    FAILURE_PRESETS,
    Component,
    FailureModel,
    FailurePreset,
    failure_model,
    parse_component,
    series_mtbf_s,
)
from ckptbench.cadence.formulas import (
    SECONDS_PER_DAY,
    SECONDS_PER_HOUR,
    daly_interval,
    efficiency,
    failure_fraction,
    failure_loss,
    lambert_w0,
    loss_per_day,
    loss_per_failure,
    optimal_interval,
    young_interval,
)

__all__ = [
    "DEFAULT_RESTART_OVERHEAD_S",
    "FAILURE_PRESETS",
    "RESTART_OVERHEAD_SOURCE",
    "SECONDS_PER_DAY",
    "SECONDS_PER_HOUR",
    "CadenceReport",
    "CheckpointCost",
    "Component",
    "FailureModel",
    "FailurePreset",
    "OperatingPoint",
    "analyze",
    "best_goodput",
    "daly_interval",
    "efficiency",
    "failure_fraction",
    "failure_loss",
    "failure_model",
    "goodput_curve",
    "interval_floor",
    "lambert_w0",
    "loss_per_day",
    "loss_per_failure",
    "operating_point",
    "optimal_interval",
    "parse_component",
    "plotted_curve",
    "required_save_seconds",
    "series_mtbf_s",
    "workload_checkpoint_bytes",
    "young_interval",
]
