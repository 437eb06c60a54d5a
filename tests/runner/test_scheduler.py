"""Slurm's facts from the environment (no Slurm needed; tests/test_slurm_runs.py runs them
under a real one)."""

from __future__ import annotations

import socket

from ckptbench.runner.scheduler import (
    job_text,
    node_name,
    placement,
    process_facts,
    step_facts,
)

STEP = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3", "SLURM_STEP_NODELIST": "gpu[01-02]",
        "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1",
        "SLURM_MPI_TYPE": "pmix", "SLURM_CLUSTER_NAME": "c", "SLURM_JOB_PARTITION": "p"}


def test_outside_slurm_there_are_no_facts_and_the_host_name_stands():
    assert step_facts({}) is None
    assert node_name({}) == socket.gethostname()
    assert placement(None, [{"node": "x"}], [[0]]) is None


def test_the_step_the_job_and_the_node_come_from_slurm():
    assert step_facts(STEP) == {
        "scheduler": "slurm", "job_id": 42, "step_id": 3, "cluster": "c", "partition": "p",
        "nodelist": "gpu[01-02]", "nodes": 2, "tasks": 3, "tasks_per_node": "2,1",
        "mpi_plugin": "pmix"}
    # The batch script itself: the job's facts, no step.
    assert step_facts({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[01-04]"}) == {
        "scheduler": "slurm", "job_id": 42, "nodelist": "gpu[01-04]"}
    env = {**STEP, "SLURMD_NODENAME": "gpu02", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
           "SLURM_NODEID": "1"}
    assert node_name(env) == "gpu02"
    assert job_text(env) == " (Slurm job 42, step 3)" and job_text({}) == ""
    assert process_facts(env) == {"node": "gpu02", "host": socket.gethostname(), "task": 2,
                                  "local_task": 0, "node_index": 1}


def test_placement_counts_processes_and_plan_ranks_per_node():
    procs = [{"node": "a"}, {"node": "a"}, {"node": "b"}]
    out = placement({"scheduler": "slurm", "job_id": 1}, procs, [[0, 1], [2, 3], [4]])
    assert out is not None
    assert out["processes_per_node"] == {"a": 2, "b": 1}
    assert out["plan_ranks_per_node"] == {"a": 4, "b": 1}
    assert [p["mpi_rank"] for p in out["processes"]] == [0, 1, 2]
