"""The Slurm harness (harness.slurm): a cluster of its own, ended on every exit.

A stopped cluster leaves no process and no directory; a harness killed outright leaves
slurmstepd and its tasks (slurmd detaches them), which the sweep ends by the cluster's
marker, and nothing else.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from harness import processes
from harness.slurm import MARKER, SlurmCluster, processes_of, unavailable

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def wait_for(ready, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not ready():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.05)


def test_the_session_cluster_runs_steps_on_its_own_nodes(slurm):
    """Both emulated nodes run tasks of one step, and the commands read this cluster's
    configuration only (its own SLURM_CONF and controller port)."""
    assert slurm.node_states() == {"n1": "idle", "n2": "idle"}
    done = slurm.run("srun", "-N", "2", "--ntasks-per-node=2", "-l", "printenv",
                     "SLURMD_NODENAME", "SLURM_CONF", timeout=60)
    assert done.returncode == 0, done.tail()
    lines = sorted(done.stdout.split("\n"))
    nodes = sorted(line.split(": ")[1] for line in lines if line.endswith(("n1", "n2")))
    assert nodes == ["n1", "n1", "n2", "n2"]
    assert f"{slurm.conf}" in done.stdout
    config = slurm.run("scontrol", "show", "config", timeout=30).stdout
    assert f"SlurmctldPort           = {slurm.ports['slurmctld']}" in config


def test_stop_ends_every_process_and_removes_the_directory():
    """A running job's slurmstepd and task are detached from slurmd: stop() still ends them."""
    cluster = SlurmCluster(nodes=1, cpus=1).start()
    base = cluster.base
    try:
        job = processes.start(["srun", "-N1", "sleep", "300"], env=cluster.env())
        wait_for(lambda: any("sleep 300" in a and "srun" not in a
                             for a in cluster.processes().values()), 30, "the task runs")
    finally:
        cluster.stop()
    assert processes_of(base) == {}
    assert not base.exists()
    job.wait(timeout=10)


def test_the_sweep_ends_what_a_killed_harness_left_and_nothing_else():
    """SIGKILL the harness's process mid-job: munged and the daemons go with it (the
    death signal), slurmstepd and the task stay; the sweep kills those only."""
    under = Path(tempfile.mkdtemp(prefix="ckb-sweep-"))
    script = textwrap.dedent("""
        import sys, time
        from harness import processes
        from harness.slurm import SlurmCluster
        c = SlurmCluster(nodes=1, cpus=1).start()
        processes.start(["srun", "-N1", "sleep", "300"], env=c.env())
        while "sleep 300" not in " ".join(a for a in c.processes().values() if "srun" not in a):
            time.sleep(0.05)
        print("running", flush=True)
        time.sleep(300)
    """)
    env = {**os.environ, "CKPTBENCH_SLURM_DIR": str(under), "PYTHONPATH": str(ROOT)}
    harness = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                               text=True, start_new_session=True)
    # Not the cluster's, though it names a directory next to it: the sweep leaves it alone.
    bystander = subprocess.Popen(["sleep", "300"], env={**os.environ, MARKER: f"{under}-other"})
    try:
        assert harness.stdout is not None and harness.stdout.readline() == "running\n"
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait()
        wait_for(lambda: not any(a.startswith(("/usr/sbin/slurm", "/usr/sbin/munged"))
                                 for a in processes_of(under).values()), 15, "daemons gone")
        left = processes_of(under)
        assert any(a.startswith("slurmstepd") for a in left.values()), left
        assert any(a.endswith("bin/sleep 300") for a in left.values()), left
        done = subprocess.run([sys.executable, "-m", "harness.slurm", str(under)],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert processes_of(under) == {}
        assert "killed" in done.stderr
        assert bystander.poll() is None
    finally:
        for p in (harness, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run([sys.executable, "-m", "harness.slurm", str(under)], env=env,
                       capture_output=True, timeout=60)
        shutil.rmtree(under, ignore_errors=True)


def test_the_sweep_refuses_a_missing_directory(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness.slurm", str(tmp_path / "no")],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2
    assert "is not a directory" in done.stderr
