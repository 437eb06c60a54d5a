"""The job model: from a run on a few nodes to the whole job's checkpoint cost.

A step of the data flow after the report and before the cadence calculator: it reads
what a run measured (``measured``: per node and per rank, from the results' rank,
phase and op records), describes the job the answer is for (``target``: nodes, ranks
per node, bytes per node from the planner, the storage ceiling), refuses measurements
that cannot stand for that job and names the run that would (``checks``), and turns
the one into the other with the slowest of N nodes estimated from the measured spread
(``stragglers``, ``model``). Sweeps over ranks per node are read and written by
``sweep``. It measures nothing itself.
"""

from ckptbench.jobmodel.checks import MIN_SAMPLES, Finding, findings
from ckptbench.jobmodel.measured import (
    AsyncMeasurement,
    Measurement,
    NodeSample,
    PhaseMeasurement,
    choose,
    measurement_of,
    read_results,
    workload_of,
)
from ckptbench.jobmodel.model import JobEstimate, PhaseEstimate, estimate
from ckptbench.jobmodel.stragglers import LogNormalFit, expected_max
from ckptbench.jobmodel.sweep import (
    SWEEP_SCHEMA,
    SweepPoint,
    read_measurements,
    saturation,
    write_sweep,
)
from ckptbench.jobmodel.target import Target, from_plan, uniform

__all__ = [
    "MIN_SAMPLES", "SWEEP_SCHEMA", "AsyncMeasurement", "Finding", "JobEstimate", "LogNormalFit", "Measurement",
    "NodeSample", "PhaseEstimate", "PhaseMeasurement", "SweepPoint", "Target", "choose",
    "estimate", "expected_max", "findings", "from_plan", "measurement_of", "read_measurements",
    "read_results", "saturation", "uniform", "workload_of", "write_sweep",
]
