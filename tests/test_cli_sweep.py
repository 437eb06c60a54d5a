"""`ckptbench sweep` end to end (the tiny workload, real files): one results file per point,
a sweep file `cadence --results` reads, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ckptbench.cli as cli_module
from ckptbench import jobmodel
from ckptbench.cli.cadence_cmd import cadence_command
from ckptbench.cli.sweep_cmd import sweep_command

TINY = str(Path(__file__).resolve().parent.parent / "workloads" / "tiny.toml")


@pytest.fixture
def run(monkeypatch, capsys):
    """Call main() with only these commands registered (others may be mid-edit)."""
    def register() -> None:
        cli_module.cli.add_command(sweep_command)
        cli_module.cli.add_command(cadence_command)

    monkeypatch.setattr(cli_module, "_register", register)

    def invoke(*args: str) -> tuple[int, str, str]:
        rc = cli_module.main(list(args))
        out, err = capsys.readouterr()
        return rc, out, err

    return invoke


def test_sweep_measures_each_point_and_cadence_picks_one(run, tmp_path) -> None:
    out_dir = tmp_path / "out"
    rc, out, err = run("sweep", TINY, "--ranks-per-node", "2,1", "--iterations", "2",
                       "--target", str(tmp_path / "data"), "--out", str(out_dir),
                       "--plot", str(tmp_path / "curve.png"), "--json")
    assert rc == 0, err
    payload = json.loads(out)
    assert [p["ranks_per_node"] for p in payload["points"]] == [1, 2]
    sweep = Path(payload["sweep"])
    assert sweep == out_dir / "tiny-sweep.jsonl"
    head = json.loads(sweep.read_text().splitlines()[0])
    assert head["schema"] == jobmodel.SWEEP_SCHEMA and head["iterations"] == 2
    measured = jobmodel.read_measurements([sweep])
    assert [(m.ranks_per_node, m.samples) for m in measured] == [(1, 2), (2, 2)]
    assert all(p["save_node_bytes_per_s"] > 0 for p in payload["points"])
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert not any((tmp_path / "data").glob("run-*"))  # checkpoints removed after each point

    rc, out, err = run("cadence", "--results", str(sweep), "--gpus-per-node", "2", "--mtbf", "4h",
                       "--force", "--json")
    assert rc == 0, err
    job = json.loads(out)["job_model"]
    assert job["inputs"]["measurement"]["ranks_per_node"] == 2
    assert job["inputs"]["target"]["workload"] == "tiny"  # the run's own job by default
    assert {w["check"] for w in job["warnings"]} == {"iterations"}

    rc, out, err = run("sweep", TINY, "--ranks-per-node", "1", "--target", str(tmp_path / "d2"),
                       "--out", str(out_dir))
    assert rc == 2 and "holds a sweep already" in err


@pytest.mark.parametrize(("counts", "message"), [
    ("0,2", "0 is outside 1-4"), ("1,9", "9 is outside 1-4"), ("1,x", "'x' is not an integer"),
])
def test_bad_points_are_one_line(run, tmp_path, counts: str, message: str) -> None:
    rc, out, err = run("sweep", TINY, "--ranks-per-node", counts, "--target", str(tmp_path))
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error: --ranks-per-node")
    assert message in lines[0]
