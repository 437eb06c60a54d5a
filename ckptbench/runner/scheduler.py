"""What the batch scheduler says about where a run's processes are (Slurm).

A process that `srun` started carries its job, its step and its node in the environment
(SLURM_JOB_ID, SLURM_STEP_ID, SLURMD_NODENAME, SLURM_PROCID...). Those are the facts the
run record keeps and the node each rank is counted on: the scheduler's node name, not a
host name guessed from the machine (several nodes can share a host, a host can have
several names). Without Slurm's variables nothing here applies and the host name stands.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Mapping
from typing import Any

# The step's facts and the variable each comes from (the job's when the step has none).
STEP_VARS = {
    "job_id": ("SLURM_JOB_ID", "SLURM_JOBID"),
    "step_id": ("SLURM_STEP_ID", "SLURM_STEPID"),
    "cluster": ("SLURM_CLUSTER_NAME",),
    "partition": ("SLURM_JOB_PARTITION",),
    "nodelist": ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "nodes": ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    "tasks": ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
    "tasks_per_node": ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
    "mpi_plugin": ("SLURM_MPI_TYPE",),
}
INT_FACTS = ("job_id", "step_id", "nodes", "tasks")


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def slurm_node(environ: Mapping[str, str] | None = None) -> str | None:
    """The Slurm node this process runs on (SLURMD_NODENAME), None outside a Slurm step."""
    return _env(environ).get("SLURMD_NODENAME") or None


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """The node a rank is counted on: Slurm's node name, else the host name."""
    return slurm_node(environ) or socket.gethostname()


def _int(value: str) -> int | str:
    try:
        return int(value)
    except ValueError:
        return value


def step_facts(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The Slurm job and step this process belongs to (job and step id, node list,
    tasks per node as Slurm writes it, e.g. '2(x2)'), None outside Slurm."""
    env = _env(environ)
    if not env.get("SLURM_JOB_ID") and not env.get("SLURM_JOBID"):
        return None
    facts: dict[str, Any] = {"scheduler": "slurm"}
    for key, names in STEP_VARS.items():
        value = next((env[n] for n in names if env.get(n)), None)
        if value is not None:
            facts[key] = _int(value) if key in INT_FACTS else value
    return facts


def job_text(environ: Mapping[str, str] | None = None) -> str:
    """' (Slurm job 12, step 0)' inside a Slurm job, '' outside: for one-line messages."""
    step = step_facts(environ)
    if step is None:
        return ""
    return f" (Slurm job {step.get('job_id', '?')}, step {step.get('step_id', 'batch')})"


def process_facts(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This process's place in the step: its node, task id, task id on the node, the
    node's index; and the machine's host name (which emulated nodes share)."""
    env = _env(environ)
    out: dict[str, Any] = {"node": node_name(env), "host": socket.gethostname()}
    for key, var in (("task", "SLURM_PROCID"), ("local_task", "SLURM_LOCALID"),
                     ("node_index", "SLURM_NODEID")):
        if env.get(var):
            out[key] = _int(env[var])
    return out


def placement(step: dict[str, Any] | None, processes: list[dict[str, Any]],
              groups: list[list[int]]) -> dict[str, Any] | None:
    """The run record's `scheduler`: the step's facts, each MPI process's place (its node,
    its Slurm task id) and the processes and plan ranks on each node, as the scheduler
    placed them. None when no process ran under Slurm."""
    if step is None:
        return None
    nodes = [p["node"] for p in processes]
    per_node = Counter(nodes)
    plan_ranks: dict[str, list[int]] = {}
    for node, group in zip(nodes, groups, strict=True):
        plan_ranks.setdefault(node, []).extend(group)
    return {**step,
            "processes": [{"mpi_rank": i, **p} for i, p in enumerate(processes)],
            "processes_per_node": dict(per_node),
            "plan_ranks_per_node": {n: len(r) for n, r in plan_ranks.items()}}
