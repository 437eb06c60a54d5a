"""Run options declared once (ckptbench.runspec): a new option is one declaration and shows
in --help, in a [run] table and in the results file; the command line overrides [run];
`run --replay` runs again exactly what a results file records; bad input is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptbench import runspec
from ckptbench.errors import SpecError

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "workloads" / "tiny.toml"
FAST = ("--block-size", "1MiB", "--prefill", "4MiB")

# A process that declares one more run option, then runs the CLI: the declaration is all.
DECLARE = """
import sys
from ckptbench import runspec
runspec.OPTIONS.append(runspec.RunOption(
    "label", "A free-text label recorded with the run (a test's option).", "output",
    commands=("run",), default="none"))
from ckptbench.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}


def ckptbench(*args: str, cwd: Path, declare: bool = False) -> subprocess.CompletedProcess[str]:
    head = ["-c", DECLARE] if declare else ["-m", "ckptbench"]
    return subprocess.run([sys.executable, *head, *args], capture_output=True, text=True,
                          timeout=300, env=_env(), cwd=cwd, check=False)


def run_record(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text().splitlines()[0]))


def workload_with_run(tmp_path: Path, run_table: str, name: str = "bench.toml") -> Path:
    path = tmp_path / name
    path.write_text(TINY.read_text() + "\n[run]\n" + run_table)
    return path


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error: "), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


def test_a_new_option_is_one_declaration(tmp_path: Path) -> None:
    """Declared in a fixture process: a flag in its --help group, a key of [run], and a
    field of the results file's run_options; the command line wins over [run]."""
    help_text = ckptbench("run", "--help", cwd=tmp_path, declare=True).stdout
    output = " ".join(help_text[help_text.index("Output:"):].split())
    assert "--label TEXT" in output and "a test's option" in output
    bench = workload_with_run(tmp_path, 'label = "from-the-table"\n'
                              f'target = "{tmp_path / "t"}"\n')
    p = ckptbench("run", str(bench), "--results", str(tmp_path / "a.jsonl"), *FAST,
                  cwd=tmp_path, declare=True)
    assert p.returncode == 0, p.stderr
    assert run_record(tmp_path / "a.jsonl")["run_options"]["label"] == "from-the-table"
    p = ckptbench("run", str(bench), "--label", "typed", "--results", str(tmp_path / "b.jsonl"),
                  *FAST, cwd=tmp_path, declare=True)
    assert p.returncode == 0, p.stderr
    assert run_record(tmp_path / "b.jsonl")["run_options"]["label"] == "typed"
    # without the declaration the key is no run option: one line naming it
    line = one_line_error(ckptbench("run", str(bench), cwd=tmp_path))
    assert "[run] label: no such run option" in line and str(bench) in line


def test_run_table_sets_options_and_the_command_line_overrides(tmp_path: Path) -> None:
    bench = workload_with_run(tmp_path, f'iterations = 2\nblock_size = "1MiB"\nprefill = '
                              f'"4MiB"\nrestore = false\ntarget = "{tmp_path / "t"}"\n')
    p = ckptbench("run", str(bench), "--iterations", "1", "--results",
                  str(tmp_path / "r.jsonl"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    run = run_record(tmp_path / "r.jsonl")
    assert run["options"]["iterations"] == 1  # typed: over the table's 2
    assert run["options"]["block_size"] == 1 << 20 and run["options"]["restore"] is False
    assert run["run_options"]["block_size"] == 1 << 20


def test_a_benchmark_file_names_its_workload(tmp_path: Path) -> None:
    """[run] alone with workload = "path" (relative to the file), as fio job files are kept."""
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "tiny.toml").write_text(TINY.read_text() + '\n[run]\nseed = 7\n')
    bench = tmp_path / "save-only.toml"
    bench.write_text(f'[run]\nworkload = "w/tiny.toml"\nrestore = false\nblock_size = "1MiB"\n'
                     f'target = "{tmp_path / "t"}"\n')
    p = ckptbench("run", str(bench), "--results", str(tmp_path / "r.jsonl"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    run = run_record(tmp_path / "r.jsonl")
    assert run["workload"]["name"] == "tiny"
    assert run["options"]["restore"] is False and run["options"]["seed"] == 7


def test_replay_reproduces_the_recorded_options(tmp_path: Path) -> None:
    first = tmp_path / "first.jsonl"
    p = ckptbench("run", str(TINY), "--target", str(tmp_path / "t"), "--iterations", "2",
                  "--scale", "2", "--ranks", "0-2", "--restore-world-size", "2",
                  "--payload", "realistic", "--seed", "3", "--cache", "none", *FAST,
                  "--results", str(first), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    again = tmp_path / "again.jsonl"
    p = ckptbench("run", "--replay", str(first), "--results", str(again), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"replay of {first} (run, ckptbench " in p.stderr
    a, b = run_record(first), run_record(again)
    assert a["run_options"] == b["run_options"]
    assert a["run_options"]["ranks"] == "0-2" and a["run_options"]["seed"] == 3
    drop = {"run_id"}
    assert {k: v for k, v in a["options"].items() if k not in drop} == \
        {k: v for k, v in b["options"].items() if k not in drop}
    for key in ("workload", "scale", "ranks", "run_workload", "command"):
        assert a[key] == b[key], key
    assert a["environment"]["target"]["options"] == b["environment"]["target"]["options"]


def test_replay_says_what_differs(tmp_path: Path) -> None:
    """A field of the recorded environment that is not this machine's, and a flag given
    over the record, are each one line."""
    first = tmp_path / "first.jsonl"
    assert ckptbench("run", str(TINY), "--target", str(tmp_path / "t"), *FAST, "--results",
                     str(first), cwd=tmp_path).returncode == 0
    lines = first.read_text().splitlines()
    run = json.loads(lines[0])
    run["environment"]["ckptbench"] = "0.0.1"
    run["environment"]["host"] = "elsewhere"
    altered = tmp_path / "altered.jsonl"
    altered.write_text("\n".join([json.dumps(run), *lines[1:]]) + "\n")
    p = ckptbench("run", "--replay", str(altered), "--iterations", "2", "--results",
                  str(tmp_path / "b.jsonl"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "ckptbench 0.0.1): 3 difference(s) from the record" in p.stderr
    assert "given: iterations: 1 recorded, 2 given" in p.stderr
    assert "host: 'elsewhere' recorded" in p.stderr
    assert "ckptbench: '0.0.1' recorded" in p.stderr
    assert run_record(tmp_path / "b.jsonl")["options"]["iterations"] == 2


@pytest.mark.parametrize("table, field, rule", [
    ("blocksize = 4", "[run] blocksize: no such run option", "allowed: "),
    ("iterations = \"2\"", "[run] iterations = '2' is not allowed", "an integer, 1 or more"),
    ("iterations = 0", "[run] iterations = 0 is not allowed", "an integer, 1 or more"),
    ("keep = 1", "[run] keep = 1 is not allowed", "true or false"),
    ("format = \"tar\"", "[run] format = 'tar' is not allowed", "raw, zarr"),
    ("block_size = \"8 parsecs\"", "[run] block_size", "8 parsecs"),
    ("replicas = 2", "[run] replicas: no such run option", "allowed: "),
    ("peer_replicas = 0", "[run] peer_replicas = 0 is not allowed", "an integer, 1 or more"),
    ("peer_placement = \"star\"", "[run] peer_placement = 'star' is not allowed", "ring, clique"),
])
def test_bad_run_table_is_one_line(tmp_path: Path, table: str, field: str, rule: str) -> None:
    bench = workload_with_run(tmp_path, table + "\n")
    line = one_line_error(ckptbench("run", str(bench), cwd=tmp_path))
    assert field in line and rule in line and str(bench) in line


def test_a_key_the_command_does_not_take_is_named(tmp_path: Path) -> None:
    bench = workload_with_run(tmp_path, 'mode = "async"\n')
    line = one_line_error(ckptbench("sweep", str(bench), cwd=tmp_path))
    assert "[run] mode: `ckptbench sweep` does not take it" in line


@pytest.mark.parametrize("content, says", [
    ("garbage\n", "not a JSON line"),
    ('{"type": "summary"}\n', "not a ckptbench results file"),
    ('{"type": "run", "schema": "ckptbench.results/1"}\n', "run record field run_options"),
])
def test_replay_of_what_is_not_a_results_file_is_one_line(tmp_path: Path, content: str,
                                                          says: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    assert says in one_line_error(ckptbench("run", "--replay", str(path), cwd=tmp_path))


def test_replay_names_a_recorded_option_this_version_lacks(tmp_path: Path) -> None:
    first = tmp_path / "first.jsonl"
    assert ckptbench("run", str(TINY), "--target", str(tmp_path / "t"), *FAST, "--results",
                     str(first), cwd=tmp_path).returncode == 0
    lines = first.read_text().splitlines()
    run = json.loads(lines[0])
    run["run_options"]["warp_drive"] = True
    first.write_text("\n".join([json.dumps(run), *lines[1:]]) + "\n")
    line = one_line_error(ckptbench("run", "--replay", str(first), cwd=tmp_path))
    assert f"{first}: run_options warp_drive: no such run option" in line


def test_workload_and_replay_together_are_refused(tmp_path: Path) -> None:
    line = one_line_error(ckptbench("run", str(TINY), "--replay", "x.jsonl", cwd=tmp_path))
    assert "--replay" in line


def test_every_declaration_parses_its_own_default() -> None:
    """Declarations are checked where made: each default passes its option's parse, and a
    value of the wrong type names the option."""
    for command in runspec.COMMANDS:
        assert set(runspec.defaults(command)) == {o.name for o in runspec.declared(command)}
    with pytest.raises(SpecError, match=r"--threads = True is not allowed; allowed: an integer"):
        runspec.option("threads").parse(True, "--threads")
    assert runspec.option("stall_timeout").parse("off", "x") == 0.0
    assert runspec.option("staging_memory").parse("state", "x") == 0
    assert runspec.option("block_size").parse("1MiB", "x") == 1 << 20
