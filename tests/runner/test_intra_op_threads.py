"""--intra-op-threads (runner.threads): parsed and bounded in one line, resolved as torchrun
would set it (1 when a node runs several processes, else the process's cores), and
recorded in the run record and in every rank's records, for formats that ignore it (raw)
too. Without torch: the torch-dcp runs that apply it are tests/formats/
test_torch_dcp_restore.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptbench import runspec
from ckptbench.errors import SpecError
from ckptbench.records import read_records
from ckptbench.runner import threads
from ckptbench.runner.options import RunOptions

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "workloads" / "tiny.toml"
FAST = ("--block-size", "1MiB", "--prefill", "4MiB")


def ckptbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, check=False)


def _run(tmp_path: Path, name: str, *extra: str) -> list[dict[str, Any]]:
    results = tmp_path / f"{name}.jsonl"
    p = ckptbench("run", str(TINY), "--target", str(tmp_path / name), "--results",
                  str(results), *FAST, *extra, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    return list(read_records(results))


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1025", "1.5", ""])
def test_bad_values_are_one_line_exit_2(tmp_path: Path, value: str) -> None:
    target = tmp_path / "t"
    p = ckptbench("run", str(TINY), "--target", str(target), "--intra-op-threads", value,
                  cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith("ckptbench: error: --intra-op-threads")
    assert "allowed: an integer, 1 or more, at most 1024, or auto" in lines[0]
    assert not target.exists()  # refused before anything was created


def test_a_bad_run_table_value_is_one_line(tmp_path: Path) -> None:
    bench = tmp_path / "bench.toml"
    bench.write_text(TINY.read_text() + "\n[run]\nintra_op_threads = 2048\n")
    p = ckptbench("run", str(bench), "--target", str(tmp_path / "t"), cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "[run] intra_op_threads = 2048 is not allowed" in lines[0]


def test_the_option_parses_its_words_and_numbers() -> None:
    opt = runspec.option("intra_op_threads")
    assert opt.parse("auto", "x") == "auto" and opt.parse(" AUTO ", "x") == "auto"
    assert opt.parse("8", "x") == 8 and opt.parse(8, "x") == 8 and opt.parse(1024, "x") == 1024
    for bad in (0, -1, 1025, True, 2.0, "eight", "0x10", "٣"):
        with pytest.raises(SpecError, match="allowed: an integer, 1 or more, at most 1024"):
            opt.parse(bad, "--intra-op-threads")
    with pytest.raises(SpecError, match="--intra-op-threads 2000 is not allowed"):
        RunOptions(intra_op_threads=2000)


def test_auto_is_what_torchrun_sets() -> None:
    one = threads.resolve(0, ["a"] * 4, available=2)
    assert (one.value, one.source, one.processes_per_node) == (1, "auto", 4)
    assert "OMP_NUM_THREADS=1" in one.why
    alone = threads.resolve(0, ["a", "b"], available=6)  # one process per node: its cores
    assert (alone.value, alone.processes_per_node) == (6, 1)
    given = threads.resolve(3, ["a"] * 4)
    assert (given.value, given.source) == (3, "option")
    assert threads.resolve(0, ["a", "b", "b"], available=8).value == 1  # the busiest node


def test_applied_sets_and_puts_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(threads.ENV, "7")
    with threads.applied(3, "raw"):
        assert os.environ[threads.ENV] == "3"
        if "torch" not in sys.modules:
            assert threads.in_effect() == 3
    assert os.environ[threads.ENV] == "7"
    with threads.applied(0, "raw"):  # not resolved: left as it is
        assert os.environ[threads.ENV] == "7"


def test_raw_records_the_default_and_a_given_value(tmp_path: Path) -> None:
    """raw ignores the threads but records them: in the run record (resolved, and why), in
    its options and run options (as asked), and in every rank's records."""
    recs = _run(tmp_path, "auto")
    run = recs[0]
    assert run["run_options"]["intra_op_threads"] == "auto"
    assert run["options"]["intra_op_threads"] == 1  # 4 local processes on one node
    assert run["intra_op_threads"]["value"] == 1 and run["intra_op_threads"]["source"] == "auto"
    assert run["intra_op_threads"]["processes_per_node"] == 4
    ranks = [x for x in recs if x["type"] == "rank"]
    assert {x["phase"] for x in ranks} == {"save", "restore"}
    assert {x["intra_op_threads"] for x in ranks} == {1}

    recs = _run(tmp_path, "three", "--intra-op-threads", "3", "--no-restore")
    run = recs[0]
    assert run["run_options"]["intra_op_threads"] == 3 and run["options"]["intra_op_threads"] == 3
    assert run["intra_op_threads"]["source"] == "option"
    ranks = [x for x in recs if x["type"] == "rank"]
    assert len(ranks) == 4 and {x["intra_op_threads"] for x in ranks} == {3}


def test_replay_of_auto_runs_auto_again(tmp_path: Path) -> None:
    first = tmp_path / "first.jsonl"
    p = ckptbench("run", str(TINY), "--target", str(tmp_path / "t"), "--ranks", "0-1",
                  "--no-restore", *FAST, "--results", str(first), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    again = tmp_path / "again.jsonl"
    p = ckptbench("run", "--replay", str(first), "--results", str(again), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    a, b = (next(read_records(x)) for x in (first, again))
    assert a["run_options"]["intra_op_threads"] == b["run_options"]["intra_op_threads"] == "auto"
    assert a["intra_op_threads"] == b["intra_op_threads"]
