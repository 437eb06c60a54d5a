"""Three real runs of the tiny workload (buffered, O_DIRECT, zarr), made once for the
report tests: the results files, and what each `ckptbench run` printed."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "workloads" / "tiny.toml"
# (results stem, extra run options); the first two print JSON, the last its table.
RUNS = (("buffered", ("--json",)), ("direct", ("--io", "direct", "--json")),
        ("zarr", ("--format", "zarr")))


def ckptbench(*args: str, cwd: Path | None = None, timeout: int = 300,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m ckptbench ARGS` with stdout and stderr kept apart (a pipe: not a terminal)."""
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, env=env)


@dataclass(frozen=True)
class Runs:
    paths: tuple[Path, ...]
    printed: tuple[subprocess.CompletedProcess[str], ...]


@pytest.fixture(scope="session")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    work = tmp_path_factory.mktemp("report-runs")
    paths, printed = [], []
    for stem, extra in RUNS:
        results = work / f"{stem}.jsonl"
        done = ckptbench("run", str(TINY), "--target", str(work / f"target-{stem}"),
                         "--iterations", "2", "--results", str(results), *extra)
        assert done.returncode == 0, done.stderr
        paths.append(results)
        printed.append(done)
    return Runs(tuple(paths), tuple(printed))


@pytest.fixture(scope="session")
def mixed_runs(tmp_path_factory: pytest.TempPathFactory, minio_server) -> Runs:
    """Three runs a user compares (issue 31): local sync, local --mode async, and S3 on a
    real MinIO; results files local.jsonl, async.jsonl, s3.jsonl."""
    work = tmp_path_factory.mktemp("mixed-runs")
    loop = ("--mode", "async", "--step-seconds", "0.02", "--steps-per-checkpoint", "2")
    s3 = ("--target", f"s3://{minio_server.bucket}/mixed-runs", "--endpoint-url",
          minio_server.endpoint)
    paths, printed = [], []
    for stem, extra in (("local", ("--target", str(work / "local"))),
                        ("async", ("--target", str(work / "async"), *loop)), ("s3", s3)):
        results = work / f"{stem}.jsonl"
        done = ckptbench("run", str(TINY), "--iterations", "2", "--results", str(results),
                         "--json", *extra, env=minio_server.env())
        assert done.returncode == 0, done.stderr
        paths.append(results)
        printed.append(done)
    return Runs(tuple(paths), tuple(printed))
