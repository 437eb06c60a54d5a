"""`cadence --results` takes what is cold and refuses what is not, saying what would fix
it and never suggesting what the run already used; its plot shows the table's C and R.

Real runs: the tiny workload on a real MinIO (an object store has no page cache to
evict: its restores are cold by construction) and on local files with --cache none.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from PIL import Image

from harness import MinioServer
from tests import synthetic

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "workloads" / "tiny.toml")
# the tiny workload's own job, 4 ranks on one node: only the cache can be refused
JOB = ("--gpus", "4", "--gpus-per-node", "4", "--mtbf", "4h")


def ckptbench(*args: str, cwd: Path, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env=env)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.s3
def test_an_s3_restore_is_cold_and_cadence_takes_it(minio_server: MinioServer,
                                                    tmp_path: Path) -> None:
    target = f"s3://{minio_server.bucket}/cadence-{uuid.uuid4().hex[:8]}"
    env = minio_server.env()
    runs = {}
    for cache in ("auto", "none"):
        results = tmp_path / f"{cache}.jsonl"
        r = ckptbench("run", TINY, "--target", target, "--endpoint-url", minio_server.endpoint,
                      "--iterations", "5", "--cache", cache, "--results", str(results),
                      cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        runs[cache] = results
    assert '"cache": "none (object store)"' in runs["auto"].read_text().replace('":"', '": "')
    r = ckptbench("cadence", "--results", str(runs["auto"]), *JOB, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "restore throughput" in r.stdout and "warnings" not in r.stdout
    # --cache none on S3 is refused, and the run it names is the one that was not made
    line = one_line_error(ckptbench("cadence", "--results", str(runs["none"]), *JOB,
                                    cwd=tmp_path))
    assert "caches were not avoided (--cache none)" in line
    assert "--cache auto" in line


def test_a_local_run_with_cache_none_is_refused_with_the_run_to_make(tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", TINY, "--iterations", "5", "--cache", "none", "--target",
                  str(tmp_path / "t"), "--results", str(results), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    line = one_line_error(ckptbench("cadence", "--results", str(results), *JOB, cwd=tmp_path))
    assert "caches were not avoided (--cache none)" in line
    assert "`ckptbench run workloads/tiny.toml --ranks 0-3 --scale 1 --iterations 5 --cache auto" \
           in line


def _synthetic(tmp_path: Path, cache: str, option: str | None) -> str:
    """4 ranks on one node, 5 iterations, the tiny workload's own job; the restore's
    cache as recorded and the run's --cache (None: a run record without it)."""
    recs = synthetic.records(bytes_per_rank=5_900_000, save_s=[0.05] * 5, restore_s=[0.05] * 5,
                             ranks_per_node=4, cache=cache, chunks_per_rank=20)
    if option is not None:
        recs[0]["options"]["cache"] = option
    name = re.sub(r"[^a-z]+", "-", f"{cache}-{option}")
    return synthetic.write(tmp_path / f"{name}.jsonl", recs)


SIZE = ("--checkpoint-size", "23.6MB")


@pytest.mark.parametrize(("cache", "option"), [
    ("none (object store)", "auto"),  # S3: nothing to evict
    ("none", "auto"),  # a target without a cache of its own (memory://, fsspec remote)
    ("fadvise+drop_caches", "auto"), ("direct", "auto"), ("fadvise", None),
])
def test_cold_restores_are_accepted(tmp_path: Path, cache: str, option: str | None) -> None:
    r = ckptbench("cadence", "--results", _synthetic(tmp_path, cache, option), *SIZE, *JOB,
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(("cache", "option", "needle"), [
    ("none", "none", "caches were not avoided (--cache none)"),
    ("none", None, "caches were not avoided (--cache none)"),  # results without the option
    ("warm: client cache not evictable (GPFS pagepool)", "auto", "recorded warm"),
])
def test_refusals_never_suggest_what_the_run_used(tmp_path: Path, cache: str,
                                                  option: str | None, needle: str) -> None:
    results = _synthetic(tmp_path, cache, option)
    line = one_line_error(ckptbench("cadence", "--results", results, *SIZE, *JOB, cwd=tmp_path))
    assert needle in line
    commands = re.findall(r"\[measure: ([^\]]*)\]|Measure it with `([^`]*)`", line)
    suggested = {c for pair in commands for c in pair if c}
    if option is not None:
        assert not any(f"--cache {option}" in c for c in suggested), line
    if option != "auto" and not cache.startswith("warm"):
        assert suggested and all("--cache auto" in c for c in suggested), line
    if cache.startswith("warm"):  # --cache auto ran already: no run of ckptbench's is named
        assert "measure:" not in line and "Measure it with" not in line
        assert "--force" in line
        forced = ckptbench("cadence", "--results", results, *SIZE, *JOB, "--force", cwd=tmp_path)
        assert forced.returncode == 0, forced.stderr
        assert "! restore: recorded warm" in forced.stdout
        assert "measure it with" not in forced.stdout


def test_the_plot_title_shows_the_table_s_c_and_r(tmp_path: Path) -> None:
    """An asynchronous run: C is the blocking part, the persist is apart from R (the model
    charges R + persist); the title and the table print the same three numbers."""
    node = 8 * 2 * 10**12 // 2048
    recs = synthetic.records(bytes_per_rank=2 * 10**12 // 2048, save_s=[node / 4e9] * 5,
                             restore_s=[node / 8e9] * 5, save_meta_s=0.0, restore_meta_s=0.0)
    recs.append({"type": "async_summary", "blocking_without_wait_s": {"median": 0.5},
                 "bytes_per_process": 2_000_000_000, "interference": 0.1})
    results = synthetic.write(tmp_path / "async.jsonl", recs)
    plot = tmp_path / "goodput.png"
    r = ckptbench("cadence", "--results", results, "--checkpoint-size", "2TB", "--gpus", "2048",
                  "--mtbf", "4h", "--plot", str(plot), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    table = re.search(r"^save \(blocking\) .*? s, restart \+ restore .*? s, persist .*? s",
                      r.stdout, re.MULTILINE)
    assert table is not None, r.stdout
    title = Image.open(plot).text["Title"]
    assert table.group(0) in title
    numbers = [float(x) for x in re.findall(r"([0-9.]+) s\b", table.group(0))]
    assert [float(x) for x in re.findall(r"([0-9.]+) s\b", title)][-3:] == numbers
