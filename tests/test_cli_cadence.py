"""`ckptbench cadence` end to end through `ckptbench.cli.main`: JSON, table, plot, errors."""

from __future__ import annotations

import json
import math

import pytest

import ckptbench.cli as cli_module
from ckptbench.cli.cadence_cmd import cadence_command
from ckptbench.errors import SpecError
from ckptbench.units import parse_duration, parse_fraction, parse_rate, parse_size

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


def _results_file(tmp_path) -> str:
    records = [
        {"type": "run", "workload": {"name": "tiny"}},
        {"type": "summary", "phase": "save", "bytes": 8e9, "seconds": 2.0,
         "throughput_bytes_per_s": 4e9, "ranks": 8, "nodes": 1},
        {"type": "summary", "phase": "restore", "bytes": 8e9, "seconds": 1.0,
         "throughput_bytes_per_s": 8e9, "ranks": 8, "nodes": 1},
    ]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_results_are_scaled_to_the_target(run, tmp_path) -> None:
    results = _results_file(tmp_path)
    # 4 GB/s per node x 256 nodes = 1.024 TB/s save; restore capped at 1.5 TB/s
    payload = _json(run, "--results", results, "--checkpoint-size", "2TB", "--gpus", "2048",
                    "--aggregate-bandwidth", "1.5TB/s", "--mtbf", "4h",
                    "--restart-overhead", "3min")
    assert payload["cost"]["save_s"] == pytest.approx(2e12 / 1.024e12)
    assert payload["cost"]["restore_s"] == pytest.approx(2e12 / 1.5e12 + 180)
    assert payload["bandwidth"]["target_nodes"] == 256
    assert "capped" in payload["bandwidth"]["assumption"]
    # a number given directly wins over the measured one
    payload = _json(run, "--results", results, "--checkpoint-size", "2TB", "--gpus", "2048",
                    "--mtbf", "4h", "--save-seconds", "30")
    assert payload["cost"]["save_s"] == 30.0
    assert payload["cost"]["restore_s"] == pytest.approx(2e12 / (8e9 * 256))


def test_table_output(run, tmp_path) -> None:
    rc, out, err = run("--results", _results_file(tmp_path), "--checkpoint-size", "2TB",
                       "--gpus", "2048", "--failure-preset", "rsc1", "--gpu-hour-price", "2")
    assert rc == 0, err
    for text in ("Young (1974)", "Daly (2006)", "exact optimum", "goodput", "GPU-h lost/d",
                 "cost/day", "bandwidth assumption", "per node", "x 256 nodes",
                 "95 % goodput at 2048 GPUs needs saves of at most"):
        assert text in out


def test_plot(run, tmp_path) -> None:
    path = tmp_path / "goodput.png"
    rc, out, err = run(*DALY, "--mtbf", "6h", "--interval", "2h", "--plot", str(path))
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
    path = tmp_path / "saves-only.jsonl"
    path.write_text(json.dumps({"type": "summary", "phase": "save", "bytes": 1e9, "seconds": 1.0,
                                "throughput_bytes_per_s": 1e9, "ranks": 8, "nodes": 1}) + "\n")
    rc, _, err = run("--results", str(path), "--checkpoint-size", "1TB", "--gpus", "8",
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
