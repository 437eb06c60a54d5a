"""`ckptbench cadence` end to end through `ckptbench.cli.main`: JSON, table, plot, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import ckptbench.cli as cli_module
from ckptbench import cadence, jobmodel
from ckptbench.cli.cadence_cmd import cadence_command
from ckptbench.errors import SpecError
from ckptbench.units import parse_duration, parse_fraction, parse_rate, parse_size
from tests import synthetic

DALY = ["--save-seconds", "5min", "--restore-seconds", "10min"]


@pytest.fixture
def run(monkeypatch, capsys):
    """Call main() with only this command registered (other commands may be mid-edit)."""
    monkeypatch.setattr(cli_module, "_register", lambda: cli_module.cli.add_command(cadence_command))

    def invoke(*args: str) -> tuple[int, str, str]:
        rc = cli_module.main(["cadence", *args])
        out, err = capsys.readouterr()
        return rc, out, err

    return invoke


def _json(run, *args: str) -> dict:
    rc, out, err = run(*args, "--json")
    assert rc == 0, err
    return json.loads(out)


def _point(payload: dict, label: str) -> dict:
    return next(p for p in payload["points"] if p["label"].startswith(label))


@pytest.mark.parametrize(("mtbf", "minutes"), [("24h", 117), ("6h", 57), ("15min", 9.1)])
def test_daly_examples_through_the_cli(run, mtbf: str, minutes: float) -> None:
    payload = _json(run, *DALY, "--mtbf", mtbf)
    assert _point(payload, "Daly")["interval_s"] / 60 == pytest.approx(minutes, abs=0.5)
    assert payload["cost"] == {"save_s": 300.0, "restore_s": 600.0, "persist_s": 0.0,
                               "interference": 0.0}


def test_json_has_the_answer(run) -> None:
    payload = _json(run, "--save-seconds", "51", "--restore-seconds", "129",
                    "--failure-preset", "llama3", "--gpus", "16384", "--interval", "30",
                    "--gpu-hour-price", "2.5", "--checkpoint-size", "5.2TB")
    mtbf = 3600 / (16384 * 1.97e-5)
    assert payload["mtbf_s"] == pytest.approx(mtbf)
    assert "llama3" in payload["mtbf_source"]
    labels = [p["label"] for p in payload["points"]]
    assert labels == ["Young (1974)", "Daly (2006)", "exact optimum", "current"]
    assert _point(payload, "Young")["interval_s"] == pytest.approx(math.sqrt(2 * 51 * mtbf))
    current = _point(payload, "current")
    assert current["interval_s"] == 1800  # a bare --interval is minutes
    best = payload["recommended"]
    assert best["goodput"] > current["goodput"]
    assert best["gpu_hours_lost_per_day"] == pytest.approx(16384 * 24 * (1 - best["goodput"]))
    assert best["cost_per_day"] == pytest.approx(2.5 * best["gpu_hours_lost_per_day"])
    target = payload["target"]
    assert target["goodput"] == 0.95
    assert target["save_bandwidth_bytes_per_s"] == pytest.approx(5.2e12 / target["max_save_s"])


def test_target_goodput_and_no_failures(run) -> None:
    payload = _json(run, *DALY, "--mtbf", "inf", "--target-goodput", "0.9")
    assert payload["mtbf_s"] is None  # infinite, as plain JSON
    assert payload["recommended"]["interval_s"] is None
    assert payload["recommended"]["goodput"] == 1.0
    assert payload["target"]["max_save_s"] is None


def test_asynchronous_saves(run) -> None:
    payload = _json(run, "--save-seconds", "20min", "--blocking-seconds", "1",
                    "--restore-seconds", "2min", "--mtbf", "3h")
    assert payload["cost"] == {"save_s": 1.0, "restore_s": 120.0, "persist_s": 1199.0,
                               "interference": 0.0}
    assert payload["floor_s"] == 1199.0
    assert payload["recommended"]["interval_s"] == 1199.0
    assert _point(payload, "exact")["interval_s"] < 1199.0


def test_components(run) -> None:
    payload = _json(run, *DALY, "--gpus", "64", "--component", "gpu=1e-5",
                    "--component", "host=4e-5", "--gpus-per-node", "4")
    assert payload["mtbf_s"] == pytest.approx(3600 / (64 * 1e-5 + 16 * 4e-5))


PER_RANK = 2 * 10**12 // 2048  # a 2 TB checkpoint on 2,048 GPUs


def _results_file(tmp_path, name: str = "run.jsonl", **shape) -> str:
    """8 ranks on one node, 5 iterations without spread: 4 GB/s save and 8 GB/s restore
    per node, no metadata time (the job model's answer is then per-node scaling)."""
    node = 8 * PER_RANK
    shape = {"bytes_per_rank": PER_RANK, "save_s": [node / 4e9] * 5,
             "restore_s": [node / 8e9] * 5, "save_meta_s": 0.0, "restore_meta_s": 0.0, **shape}
    return synthetic.write(tmp_path / name, synthetic.records(**shape))


def test_results_are_scaled_to_the_target(run, tmp_path) -> None:
    results = _results_file(tmp_path)
    # 4 GB/s per node x 256 nodes = 1.024 TB/s save; restore capped at 1.5 TB/s
    payload = _json(run, "--results", results, "--checkpoint-size", "2TB", "--gpus", "2048",
                    "--aggregate-bandwidth", "1.5TB/s", "--mtbf", "4h",
                    "--restart-overhead", "3min")
    assert payload["cost"]["save_s"] == pytest.approx(2e12 / 1.024e12)
    assert payload["cost"]["restore_s"] == pytest.approx(2e12 / 1.5e12 + 180)
    job = payload["job_model"]
    assert job["inputs"]["target"]["nodes"] == 256
    assert job["restore"]["capped"] and not job["save"]["capped"]
    assert any("capped at the aggregate ceiling" in a for a in job["assumptions"])
    # a number given directly wins over the measured one; a measured restore gets the
    # default restart overhead (issue 19: not 0)
    payload = _json(run, "--results", results, "--checkpoint-size", "2TB", "--gpus", "2048",
                    "--mtbf", "4h", "--save-seconds", "30")
    assert payload["cost"]["save_s"] == 30.0
    assert payload["cost"]["restore_s"] == pytest.approx(
        2e12 / (8e9 * 256) + cadence.DEFAULT_RESTART_OVERHEAD_S)
    assert payload["job_model"]["restart_overhead_source"] == cadence.RESTART_OVERHEAD_SOURCE


def test_given_restore_keeps_its_meaning(run, tmp_path) -> None:
    """--restore-seconds includes the restart (no default added); --restart-overhead adds."""
    payload = _json(run, "--results", _results_file(tmp_path), "--checkpoint-size", "2TB",
                    "--gpus", "2048", "--mtbf", "4h", "--restore-seconds", "100")
    assert payload["cost"]["restore_s"] == 100.0
    payload = _json(run, *DALY, "--mtbf", "4h", "--restart-overhead", "1min")
    assert payload["cost"]["restore_s"] == 660.0
    assert payload["job_model"] is None
    payload = _json(run, "--results", _results_file(tmp_path, "zero.jsonl"), "--checkpoint-size",
                    "2TB", "--gpus", "2048", "--mtbf", "4h", "--restart-overhead", "0s")
    assert payload["cost"]["restore_s"] == pytest.approx(2e12 / (8e9 * 256))  # 0 is allowed


def test_a_run_that_cannot_stand_for_the_job_is_refused(run, tmp_path) -> None:
    """2 ranks per node, one iteration, for a job of 8 per node: refused in one line that
    names the run to make; --force answers, with the warnings in the output."""
    node = 2 * PER_RANK
    results = _results_file(tmp_path, "small.jsonl", ranks_per_node=2, save_s=[node / 4e9],
                            restore_s=[node / 8e9])
    args = ("--results", results, "--checkpoint-size", "2TB", "--gpus", "2048", "--mtbf", "4h")
    rc, out, err = run(*args)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error: --results")
    assert "ranks per node: the run had 2, the target has 8" in lines[0]
    assert "--ranks 0-7 --scale 1 --iterations 5" in lines[0] and "--force" in lines[0]
    payload = _json(run, *args, "--force")
    assert {w["check"] for w in payload["job_model"]["warnings"]} == {"ranks-per-node",
                                                                      "iterations"}
    rc, out, err = run(*args, "--force")
    assert rc == 0, err
    assert "warnings (used anyway: --force)" in out and "measure it with: ckptbench run" in out


def test_a_sweep_answers_with_the_matching_point(run, tmp_path) -> None:
    points = []
    for k, rate in ((2, 3e9), (8, 4e9)):
        name = f"rpn{k}.jsonl"
        m = jobmodel.read_results(_results_file(
            tmp_path, name, ranks_per_node=k, save_s=[k * PER_RANK / rate] * 5))
        points.append(jobmodel.SweepPoint.of(m, name))
    jobmodel.write_sweep(tmp_path / "sweep.jsonl", {"workload": "synthetic"}, points)
    payload = _json(run, "--results", str(tmp_path / "sweep.jsonl"), "--checkpoint-size", "2TB",
                    "--gpus", "2048", "--mtbf", "4h")
    assert payload["job_model"]["inputs"]["measurement"]["ranks_per_node"] == 8
    assert payload["cost"]["save_s"] == pytest.approx(2e12 / 1.024e12)


def test_table_output(run, tmp_path) -> None:
    rc, out, err = run("--results", _results_file(tmp_path), "--checkpoint-size", "2TB",
                       "--gpus", "2048", "--failure-preset", "rsc1", "--gpu-hour-price", "2")
    assert rc == 0, err
    for text in ("Young (1974)", "Daly (2006)", "exact optimum", "goodput", "GPU-h lost/d",
                 "cost/day", "job model", "per node", "= 256 nodes x 8 ranks",
                 "slowest of 256 nodes", "assumptions:", "restart overhead: 600 s",
                 "95 % goodput at 2048 GPUs needs saves of at most"):
        assert text in out


def test_plot(run, tmp_path) -> None:
    path = tmp_path / "goodput.png"
    rc, _out, err = run(*DALY, "--mtbf", "6h", "--interval", "2h", "--plot", str(path))
    assert rc == 0, err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_help_cites_the_presets(run) -> None:
    rc, out, _ = run("--help")
    assert rc == 0
    for name in ("llama3", "rsc1", "rsc2", "opt175b", "bloom"):
        assert name in out
    assert "Kokolis" in out and "Llama 3" in out and "BigScience" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--save-seconds", "0", "--restore-seconds", "1", "--mtbf", "2"], "--save-seconds must be > 0"),
        (["--save-seconds", "-3", "--restore-seconds", "1", "--mtbf", "2"], "--save-seconds must be > 0"),
        (["--save-seconds", "inf", "--restore-seconds", "1", "--mtbf", "2"],
         "--save-seconds 'inf': inf is not allowed"),
        (["--save-seconds", "3", "--restore-seconds", "0s", "--mtbf", "2"], "--restore-seconds must be > 0"),
        ([*DALY, "--mtbf", "0"], "--mtbf must be > 0"),
        ([*DALY, "--mtbf", "3 fortnights"], "--mtbf"),
        ([*DALY, "--failure-preset", "llama4", "--gpus", "8"], "'llama4' is not known"),
        ([*DALY, "--failure-preset", "llama3"], "--gpus is required"),
        ([*DALY], "failure model is required"),
        (["--save-seconds", "3", "--mtbf", "2"], "--restore-seconds is required"),
        (["--restore-seconds", "3", "--mtbf", "2"], "--save-seconds is required"),
        ([*DALY, "--mtbf", "2", "--interval", "0"], "--interval must be > 0"),
        ([*DALY, "--mtbf", "2", "--target-goodput", "120%"], "--target-goodput"),
        ([*DALY, "--mtbf", "2", "--gpus", "0"], "--gpus"),
        ([*DALY, "--mtbf", "2", "--gpu-hour-price", "-1"], "--gpu-hour-price"),
        ([*DALY, "--mtbf", "2", "--blocking-seconds", "10min"], "--blocking-seconds must be <="),
        ([*DALY, "--gpus", "8", "--component", "gpu"], "--component"),
        (["--results", "missing.jsonl", "--checkpoint-size", "1TB", "--gpus", "8", "--mtbf", "2"],
         "no such file"),
        (["--results", "x.jsonl", "--gpus", "8", "--mtbf", "2"], "--workload or --checkpoint-size"),
        ([*DALY, "--mtbf", "2", "--checkpoint-size", "1TB", "--workload", "w.toml"], "not both"),
        ([*DALY, "--mtbf", "2", "--aggregate-bandwidth", "fast"], "--aggregate-bandwidth"),
        ([*DALY, "--mtbf", "2", "--no-such-option"], "No such option"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run, args: list[str], message: str) -> None:
    rc, out, err = run(*args)
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("ckptbench: error:")
    assert message in lines[0]


def test_missing_measurements_in_results(run, tmp_path) -> None:
    path = _results_file(tmp_path, "saves-only.jsonl", restore_s=None)
    rc, _, err = run("--results", path, "--checkpoint-size", "1TB", "--gpus", "8",
                     "--mtbf", "2")
    assert rc == 2
    assert "no restore summary" in err


@pytest.mark.parametrize(
    ("text", "unit", "seconds"),
    [("51", "s", 51.0), ("51s", "s", 51.0), ("3.1h", "s", 3.1 * 3600), ("3.1", "h", 3.1 * 3600),
     ("30 min", "h", 1800.0), ("1d", "min", 86400.0), ("250ms", "s", 0.25), ("2e3", "s", 2000.0)],
)
def test_parse_duration(text: str, unit: str, seconds: float) -> None:
    assert parse_duration(text, "--x", unit) == pytest.approx(seconds)


def test_parse_duration_infinity_only_where_allowed() -> None:
    assert parse_duration("inf", "--mtbf", "h", allow_inf=True) == math.inf
    with pytest.raises(SpecError, match="--save-seconds 'inf': inf is not allowed"):
        parse_duration("inf", "--save-seconds", "s")


def test_parse_size_and_fraction() -> None:
    assert parse_size("5.2TB", "--x", default_unit="GB") == 5.2e12
    assert parse_size("800GiB", "--x", default_unit="GB") == 800 * 2**30
    assert parse_size("3", "--x", default_unit="GB") == 3e9  # a bare number is GB
    assert parse_rate("2TB/s", "--x") == 2e12
    assert parse_rate("2.5", "--x") == 2.5e9
    with pytest.raises(SpecError, match="unknown unit"):
        parse_size("2 furlongs", "--x", default_unit="GB")
    assert parse_fraction("95%", "--x") == pytest.approx(0.95)
    assert parse_fraction("0.9", "--x") == 0.9
    for bad in ("95", "0", "1", "abc", "100%"):
        with pytest.raises(SpecError, match="--x"):
            parse_fraction(bad, "--x")


def test_the_restore_layout_scales_r(run, tmp_path) -> None:
    """R is the job restarting on the restore layout: given on the command line, or the
    one the measured run restored onto (its run record)."""
    from ckptbench.plan import build_plan
    from ckptbench.plan.restore import restore_plan_of
    from ckptbench.spec import load_workload, with_restore

    tiny_path = str(Path(__file__).parent.parent / "workloads" / "tiny.toml")
    tiny = load_workload(tiny_path)
    per_rank = build_plan(tiny).total_bytes // 4
    shape = {"bytes_per_rank": per_rank, "ranks_per_node": 2, "save_s": [1.0] * 5,
             "restore_s": [0.5] * 5, "save_meta_s": 0.0, "restore_meta_s": 0.0}
    plain = synthetic.write(tmp_path / "plain.jsonl", synthetic.records(**shape))
    common = ["--gpus-per-node", "2", "--mtbf", "4h", "--restart-overhead", "0", "--force"]
    hsdp = {"world_size": 8, "dp_replicate": 2}
    rplan = restore_plan_of(build_plan(with_restore(tiny, hsdp, "test")))
    node_max = rplan.rank_bytes().reshape(4, 2).sum(axis=1).max()
    expected = node_max * 0.5 / (2 * per_rank)
    given = _json(run, "--results", plain, "--workload", tiny_path,
                  "--restore-layout", "world_size=8,dp_replicate=2", *common)
    assert given["cost"]["restore_s"] == pytest.approx(expected, rel=2e-3)
    target = given["job_model"]["inputs"]["target"]
    assert target["restore"]["layout"] == "world_size=8,tp=2,dp_replicate=2"
    assert target["restore"]["nodes"] == 4 and target["restore"]["amplification"] > 1.9
    # HSDP reads the checkpoint twice over twice the nodes: the same per node; restarting
    # on one node of 2 ranks, that node reads it all: twice as long
    same = _json(run, "--results", plain, "--workload", tiny_path, *common)
    assert same["cost"]["restore_s"] == pytest.approx(given["cost"]["restore_s"], rel=2e-3)
    assert target["restore"]["read_bytes"] == pytest.approx(
        2 * same["job_model"]["inputs"]["target"]["restore"]["read_bytes"], rel=1e-3)
    fewer = _json(run, "--results", plain, "--workload", tiny_path, "--restore-world-size", "2",
                  "--restore-layout", "tp=1", *common)
    assert fewer["cost"]["restore_s"] == pytest.approx(2 * same["cost"]["restore_s"], rel=2e-3)
    # the run's own record: it restored onto HSDP 8, so its job restarts there
    recorded = synthetic.write(tmp_path / "hsdp.jsonl", synthetic.records(
        **shape, workload=with_restore(tiny, hsdp, "test").to_dict()))
    own = _json(run, "--results", recorded, *common)
    assert own["cost"]["restore_s"] == pytest.approx(expected, rel=2e-3)
    assert own["job_model"]["inputs"]["target"]["restore"]["gpus"] == 8


def test_a_restore_layout_needs_a_plan(run) -> None:
    code, _, err = run("--save-seconds", "1", "--restore-seconds", "2", "--mtbf", "3h",
                       "--checkpoint-size", "2TB", "--restore-world-size", "6")
    assert code == 2 and "--restore-world-size and --restore-layout need the target's plan" \
        in err and err.count("\n") == 1
