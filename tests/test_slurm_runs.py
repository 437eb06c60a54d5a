"""ckptbench under a real Slurm (the session's cluster of two emulated nodes): `srun`
runs the ranks as MPI ranks through PMIx, `sbatch` runs docs/mpi.md's script as it
stands, and the record, `report` and the job model count nodes as Slurm placed the ranks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckptbench.jobmodel.measured import read_results
from harness.slurm import MPI_PLUGIN, unavailable

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "workloads" / "tiny.toml"
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(unavailable() is not None,
                                                  reason=str(unavailable()))]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def job_env(tmp: Path) -> dict[str, str]:
    """The job's environment: this checkout's ckptbench as `ckptbench` on PATH."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "ckptbench"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m ckptbench \"$@\"\n")
    shim.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def srun_run(slurm, tmp_path_factory):
    """One `srun -N 2 --ntasks-per-node=2 ckptbench run` of the tiny workload (4 ranks,
    a save and a verified restore)."""
    tmp = tmp_path_factory.mktemp("srun")
    results = tmp / "r.jsonl"
    done = slurm.run("srun", "-N", "2", "--ntasks-per-node=2", f"--mpi={MPI_PLUGIN}",
                     "--kill-on-bad-exit=1", "ckptbench", "run", str(TINY),
                     "--target", str(tmp / "target"), "--results", str(results),
                     timeout=300, **job_env(tmp))
    assert done.returncode == 0, done.tail(2000)
    return records(results), results


def test_srun_runs_the_ranks_as_mpi_ranks_on_two_nodes(srun_run):
    recs, _ = srun_run
    run = recs[0]
    assert run["launcher"] == "mpi" and run["mpi"]["world_size"] == 4
    sched = run["scheduler"]
    assert sched["scheduler"] == "slurm" and sched["step_id"] == 0
    assert isinstance(sched["job_id"], int)
    assert sched["nodelist"] == "n[1-2]" and sched["nodes"] == 2 and sched["tasks"] == 4
    assert sched["tasks_per_node"] == "2(x2)" and sched["mpi_plugin"] == MPI_PLUGIN
    assert [(p["mpi_rank"], p["node"], p["task"], p["local_task"]) for p in sched["processes"]] \
        == [(0, "n1", 0, 0), (1, "n1", 1, 1), (2, "n2", 2, 0), (3, "n2", 3, 1)]
    assert sched["processes_per_node"] == {"n1": 2, "n2": 2}
    assert sched["plan_ranks_per_node"] == {"n1": 2, "n2": 2}
    # One machine, two nodes: the clocks, the shift and the rank records follow Slurm's nodes.
    assert [n["host"] for n in run["clock"]["nodes"]] == ["n1", "n2"]
    assert run["restore_shift"]["value"] == 2 and run["restore_shift"]["own_node_reads"] == 0
    saves = {r["rank"]: r["host"] for r in recs if r["type"] == "rank" and r["phase"] == "save"}
    assert saves == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    phases = {r["phase"]: r for r in recs if r["type"] == "phase"}
    assert phases["save"]["ok"] and phases["restore"]["ok"]
    assert all(r.get("verified", True) for r in recs if r["type"] == "rank"
               and r["phase"] == "restore")


def test_report_and_the_job_model_count_the_nodes_slurm_placed(srun_run):
    _, results = srun_run
    done = subprocess.run([sys.executable, "-m", "ckptbench", "report", str(results), "--json"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert re.findall(r'"nodes": (\d+)', text) and set(re.findall(r'"nodes": (\d+)', text)) == {"2"}
    measured = read_results(results)
    assert measured.nodes == 2 and measured.ranks_per_node == 2


def docs_sbatch_script() -> str:
    text = (ROOT / "docs" / "mpi.md").read_text()
    found = re.search(r"<!-- the sbatch template[^>]*-->\n```sh\n(.*?)```", text, re.S)
    assert found, "docs/mpi.md has no sbatch template"
    return found.group(1)


def test_sbatch_runs_the_docs_script(slurm, tmp_path):
    script = tmp_path / "ckpt.sbatch"
    script.write_text(docs_sbatch_script())
    results = tmp_path / "r.jsonl"
    done = slurm.run("sbatch", "--parsable", f"--chdir={ROOT}", f"--output={tmp_path}/job.out",
                     str(script), timeout=60, TARGET=str(tmp_path / "target"),
                     RESULTS=str(results), **job_env(tmp_path))
    assert done.returncode == 0, done.tail()
    job_id = done.stdout.strip().split(";")[0]
    state = slurm.wait_job(job_id, timeout=300)
    assert state == "COMPLETED", (tmp_path / "job.out").read_text()[-2000:]
    run = records(results)[0]
    assert run["scheduler"]["job_id"] == int(job_id) and run["scheduler"]["step_id"] == 0
    assert run["scheduler"]["processes_per_node"] == {"n1": 2, "n2": 2}
    assert not (tmp_path / "target").exists() or not any((tmp_path / "target").iterdir())
