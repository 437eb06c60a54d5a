"""ckptbench under a real Slurm (the session's cluster of two emulated nodes): `srun`
runs the ranks as MPI ranks through PMIx, `sbatch` runs docs/mpi.md's script as it
stands, and the record, `report` and the job model count nodes as Slurm placed the ranks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
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


def srun_ckptbench(slurm, tmp: Path, *args: str):
    """`srun -N 2 --ntasks-per-node=2 ckptbench ARGS` to its end."""
    return slurm.run("srun", "-N", "2", "--ntasks-per-node=2", f"--mpi={MPI_PLUGIN}",
                     "--kill-on-bad-exit=1", "ckptbench", *args, timeout=300, **job_env(tmp))


def test_the_peer_tier_replicates_across_the_nodes_slurm_placed(slurm, tmp_path):
    """Nodes are Slurm's (n1, n2 share one host name): each process's replica is held on
    the other node, sent by MPI point-to-point (srun runs MPI ranks), and the replaced
    node's processes fetch their shards from there, verified. (A
    --ranks-per-node that cuts across Slurm's nodes is refused: tests/plan.)"""
    memory = Path(tempfile.mkdtemp(prefix="ckb-slurm-", dir="/dev/shm"))
    try:
        done = srun_ckptbench(slurm, tmp_path, "run", str(TINY), "--target",
                              str(tmp_path / "t"), "--results", str(tmp_path / "r.jsonl"),
                              "--tiers", "memory,peer", "--memory-dir", str(memory))
        assert done.returncode == 0, done.tail(2000)
        recs = records(tmp_path / "r.jsonl")
        placed = recs[0]["options"]["tier_plan"]
        assert placed["node_source"] == "slurm nodes" and placed["node_names"] == ["n1", "n2"]
        assert placed["node_of"] == [0, 0, 1, 1] and placed["replicas"] == [[1], [0]]
        peer = {r["process"]: r["holders"] for r in recs
                if r["type"] == "tier" and r["tier"] == "peer"}
        assert peer == {0: [2], 1: [3], 2: [0], 3: [1]}
        assert {r["transport"] for r in recs if r["type"] == "tier" and r["tier"] == "peer"} \
            == {"mpi-shm"}  # MPI point-to-point, one machine under the two nodes
        node = {r["process"]: (r["tier"], r["from_node"]) for r in recs
                if r["type"] == "tier_restore" and r["scenario"] == "node"}
        assert node == {0: ("memory", 0), 1: ("memory", 0), 2: ("peer", 0), 3: ("peer", 0)}
        assert all(r["verified"] for r in recs if r["type"] == "tier_restore")
        assert not list(memory.iterdir())
    finally:
        shutil.rmtree(memory, ignore_errors=True)


def test_sweep_runs_each_point_on_every_node(slurm, tmp_path):
    """`srun ... ckptbench sweep`: the point of K ranks per node runs K MPI ranks on each
    of Slurm's nodes (the others wait), and the sweep file counts them per node."""
    out = tmp_path / "sweep"
    done = srun_ckptbench(slurm, tmp_path, "sweep", str(TINY), "--ranks-per-node", "1,2",
                          "--iterations", "1", "--target", str(tmp_path / "t"), "--out",
                          str(out), "--json")
    assert done.returncode == 0, done.tail(2000)
    assert json.loads(done.stdout)["sweep"] == str(out / "tiny-sweep.jsonl")
    for k in (1, 2):
        run = records(out / f"tiny-rpn{k}.jsonl")[0]
        assert run["launcher"] == "mpi" and run["ranks"] == list(range(2 * k))
        assert run["scheduler"]["processes_per_node"] == {"n1": k, "n2": k}
        assert run["restore_shift"]["own_node_reads"] == 0
    points = [r for r in records(out / "tiny-sweep.jsonl") if r["type"] == "point"]
    assert [(p["ranks_per_node"], p["nodes"]) for p in points] == [(1, 2), (2, 2)]
    # More ranks per node than srun started there: one line.
    done = srun_ckptbench(slurm, tmp_path, "sweep", str(TINY), "--ranks-per-node", "4",
                          "--iterations", "1", "--target", str(tmp_path / "t"), "--out",
                          str(tmp_path / "sweep4"))
    lines = [x for x in done.stderr.splitlines() if x.startswith("ckptbench: error:")]
    assert done.returncode != 0 and len(lines) == 1, done.tail(2000)
    assert "--ranks-per-node 4: the launcher started 2 process(es) on node n1" in lines[0]


EXAMPLES = ROOT / "examples" / "slurm"


def docs_sbatch_script() -> str:
    text = (ROOT / "docs" / "mpi.md").read_text()
    found = re.search(r"<!-- the sbatch template[^>]*-->\n```sh\n(.*?)```", text, re.S)
    assert found, "docs/mpi.md has no sbatch template"
    return found.group(1)


@pytest.fixture(scope="module")
def templates(slurm, minio_server, tmp_path_factory):
    """examples/slurm's templates submitted at once, as written, with what each needs in
    the environment sbatch passes on: name -> (job id, its directory, its results)."""
    jobs = {}
    s3 = minio_server.env()
    env = {"local-nvme": {"TARGET": "target"},
           "parallel-fs": {"TARGET": "target"},
           "s3": {"S3_TARGET": f"s3://{minio_server.bucket}/slurm-template",
                  "AWS_ENDPOINT_URL_S3": minio_server.endpoint,
                  **{k: s3[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                        "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE",
                                        "AWS_SHARED_CREDENTIALS_FILE")}}}
    for name, extra in env.items():
        tmp = tmp_path_factory.mktemp(name)
        given = {k: str(tmp / v) if v == "target" else v for k, v in extra.items()}
        results = tmp / ("results" if name == "local-nvme" else "r.jsonl")
        done = slurm.run("sbatch", "--parsable", f"--chdir={ROOT}", f"--output={tmp}/job.out",
                         str(EXAMPLES / f"{name}.sbatch"), timeout=60, RESULTS=str(results),
                         **given, **job_env(tmp))
        assert done.returncode == 0, done.tail()
        jobs[name] = (done.stdout.strip().split(";")[0], tmp, results)
    return jobs


def finished(slurm, jobs, name: str) -> tuple[str, Path, Path]:
    job_id, tmp, results = jobs[name]
    state = slurm.wait_job(job_id, timeout=300)
    assert state == "COMPLETED", (tmp / "job.out").read_text()[-3000:]
    return job_id, tmp, results


def test_the_docs_template_is_the_parallel_fs_one():
    assert docs_sbatch_script() == (EXAMPLES / "parallel-fs.sbatch").read_text()


def test_the_parallel_fs_template_runs_as_written(slurm, templates):
    job_id, tmp, results = finished(slurm, templates, "parallel-fs")
    run = records(results)[0]
    assert run["scheduler"]["job_id"] == int(job_id) and run["scheduler"]["step_id"] == 0
    assert run["scheduler"]["processes_per_node"] == {"n1": 2, "n2": 2}
    assert not (tmp / "target").exists() or not any((tmp / "target").iterdir())


def test_the_local_nvme_template_runs_each_nodes_share_on_its_own_disk(slurm, templates):
    """One srun task per node, local processes: node i's plan ranks into TARGET/<node>,
    one results file per node, and the report of both at the end of the job."""
    job_id, tmp, results = finished(slurm, templates, "local-nvme")
    runs = {p.stem: records(p) for p in sorted(results.glob("*.jsonl"))}
    assert set(runs) == {"n1", "n2"}
    for i, (node, recs) in enumerate(sorted(runs.items())):
        run = recs[0]
        assert run["launcher"] == "local" and run["ranks"] == [2 * i, 2 * i + 1]
        assert run["scheduler"]["job_id"] == int(job_id)
        assert [p["node"] for p in run["scheduler"]["processes"]] == [node]
        assert {r["host"] for r in recs if r["type"] == "rank"} == {node}
        phases = {r["phase"]: r for r in recs if r["type"] == "phase"}
        assert phases["save"]["ok"] and phases["restore"]["ok"]
    out = (tmp / "job.out").read_text()  # the job's last line: the report of both nodes
    assert f"#1: {results / 'n1.jsonl'}" in out and f"#2: {results / 'n2.jsonl'}" in out
    assert not any((tmp / "target").rglob("*.bin"))


def test_the_s3_template_runs_against_minio(slurm, templates, minio_server):
    job_id, _, results = finished(slurm, templates, "s3")
    recs = records(results)
    run = recs[0]
    assert run["scheduler"]["job_id"] == int(job_id)
    assert run["scheduler"]["processes_per_node"] == {"n1": 2, "n2": 2}
    assert run["run_options"]["target"] == f"s3://{minio_server.bucket}/slurm-template"
    phases = {r["phase"]: r for r in recs if r["type"] == "phase"}
    assert phases["save"]["ok"] and phases["restore"]["ok"]
    assert minio_server.list_keys(minio_server.bucket, "slurm-template/run-") == []
