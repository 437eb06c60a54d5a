"""One throughput, named the same in every command, and one unit convention.

Real runs of the tiny workload (real files, real subprocesses): `run`, `report`,
`cadence`, `sweep` and `mlperf` print the same "save throughput X GB/s" for the same
results, and sizes are printed in binary units, rates in decimal ones, whatever the
command.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "workloads" / "tiny.toml")
HEADLINE = re.compile(r"\b(save|restore) throughput ([0-9.]+ [GT]B/s) \(")
# A size in decimal units (a rate is followed by /s), or a rate in binary units: the
# convention is binary sizes, decimal rates (ckptbench.units.CONVENTION).
DECIMAL_SIZE = re.compile(r"\b[0-9.]+ ?[KMGTP]B\b(?!/s)")
BINARY_RATE = re.compile(r"\b[0-9.]+ ?[KMGTP]iB/s")


def ckptbench(*args: str, cwd: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                       text=True, timeout=600, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return r.stdout


def headlines(text: str) -> dict[str, str]:
    """{phase: 'X GB/s'} from a command's output; each phase named once."""
    found = HEADLINE.findall(text)
    assert found, text
    out = dict(found)
    assert len(out) == len(found), found
    return out


def assert_one_convention(text: str) -> None:
    assert not DECIMAL_SIZE.findall(text), DECIMAL_SIZE.findall(text)
    assert not BINARY_RATE.findall(text), BINARY_RATE.findall(text)


CADENCE = ("--gpus", "4", "--gpus-per-node", "4", "--mtbf", "4h", "--force")


def test_run_report_and_cadence_print_the_same_throughput(tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    run_out = ckptbench("run", TINY, "--iterations", "5", "--target", str(tmp_path / "t"),
                        "--results", str(results), cwd=tmp_path)
    shown = headlines(run_out)
    assert set(shown) == {"save", "restore"}
    summary = {json.loads(line)["phase"]: json.loads(line) for line in
               results.read_text().splitlines() if '"type":"summary"' in line.replace(" ", "")}
    for phase, text in shown.items():
        value = summary[phase]["throughput_bytes_per_s"]
        assert text == f"{value / 1e9:.4g} GB/s"
    report_out = ckptbench("report", str(results), "--wide", cwd=tmp_path)
    cadence_out = ckptbench("cadence", "--results", str(results), *CADENCE, cwd=tmp_path)
    assert headlines(report_out) == shown
    assert headlines(cadence_out) == shown
    # the other rates are named by what they are, never "throughput" alone
    assert "per node, data only" in cadence_out and "data-only throughput" in report_out
    for text in (run_out, report_out, cadence_out):
        assert_one_convention(text)


def test_sweep_prints_the_throughput_run_and_cadence_print(tmp_path: Path) -> None:
    out_dir = tmp_path / "sweep"
    sweep_out = ckptbench("sweep", TINY, "--ranks-per-node", "4", "--iterations", "5",
                          "--target", str(tmp_path / "t"), "--out", str(out_dir), cwd=tmp_path)
    shown = headlines(sweep_out)
    assert set(shown) == {"save", "restore"}
    point = out_dir / "tiny-rpn4.jsonl"
    assert headlines(ckptbench("report", str(point), "--wide", cwd=tmp_path)) == shown
    cadence_out = ckptbench("cadence", "--results", str(out_dir / "tiny-sweep.jsonl"),
                            *CADENCE, cwd=tmp_path)
    assert headlines(cadence_out) == shown
    # the sweep file carries the same figure, and the per-node figure is the job model's
    sweep_lines = [json.loads(x) for x in (out_dir / "tiny-sweep.jsonl").read_text().splitlines()]
    p = next(x for x in sweep_lines if x["type"] == "point")
    assert f"{p['save_bytes_per_s'] / 1e9:.4g} GB/s" == shown["save"]
    node = re.search(r"save: per node, data only ([0-9.]+) GB/s", cadence_out)
    assert node is not None
    assert f"{p['save_node_bytes_per_s'] / 1e9:.4g}" == node.group(1)
    for text in (sweep_out, cadence_out):
        assert_one_convention(text)


def test_mlperf_prints_the_throughput_report_prints(tmp_path: Path) -> None:
    results = tmp_path / "m.jsonl"
    out = ckptbench("mlperf", str(ROOT / "workloads" / "mlperf-llama3-8b.toml"), "--scale", "32",
                    "--ranks", "0-1", "--iterations", "2", "--target", str(tmp_path / "t"),
                    "--results", str(results), cwd=tmp_path)
    shown = headlines(out)
    assert headlines(ckptbench("report", str(results), "--wide", cwd=tmp_path)) == shown
    assert "GiB/s mean" in out  # MLPerf's own figure keeps MLPerf's unit


@pytest.mark.parametrize("args", [
    ("plan", TINY),
    ("plan", str(ROOT / "workloads" / "llama3.1-405b-tp8-pp16-fsdp-16384.toml")),
    ("plan", str(ROOT / "workloads" / "llama3-8b-hsdp2-8.toml"), "--restore",
     "--restore-world-size", "6"),
    ("cadence", "--workload", str(ROOT / "workloads" / "llama3.1-405b-tp8-pp16-fsdp-16384.toml"),
     "--save-seconds", "51", "--restore-seconds", "129", "--failure-preset", "llama3",
     "--aggregate-bandwidth", "2TB/s", "--interval", "30min"),
    ("cadence", "--checkpoint-size", "5.2TB", "--gpus", "16384", "--save-seconds", "51",
     "--restore-seconds", "129", "--mtbf", "3h", "--aggregate-bandwidth", "800GB/s"),
])
def test_sizes_binary_rates_decimal(tmp_path: Path, args: tuple[str, ...]) -> None:
    out = ckptbench(*args, cwd=tmp_path)
    assert re.search(r"[KMGTP]iB\b", out) or "GB/s" in out or "TB/s" in out, out
    assert_one_convention(out)
