"""Results files given to `report` and `cadence --results` (issue 29, items 5 and 9):
only a regular file of a stated size is read (a FIFO blocked forever, /dev/zero grew
without bound), a summary field of the wrong type is one line naming it (`bytes: null`
was a TypeError), and control characters in a results file's strings are printed
escaped, never raw (an escape sequence would drive the terminal).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .helpers import WORKLOADS, Result, assert_refused, ckptbench

GiB = 1 << 30
RULE = "allowed: a results file of `ckptbench run` (a regular file of at most 1,073,741,824 bytes)"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The records of a real run of the tiny workload."""
    tmp = tmp_path_factory.mktemp("run")
    results = tmp / "good.jsonl"
    run = ckptbench("run", str(WORKLOADS / "tiny.toml"), "--target", str(tmp / "tgt"),
                    "--results", str(results), timeout=300)
    assert run.rc == 0, run.err
    return [json.loads(line) for line in results.read_text().splitlines()]


def _fifo(tmp_path: Path) -> str:
    os.mkfifo(tmp_path / "r.jsonl")
    return str(tmp_path / "r.jsonl")


def _sparse(tmp_path: Path) -> str:
    """A file one byte over the limit that takes no room on disk."""
    with open(tmp_path / "r.jsonl", "wb") as f:
        f.truncate(GiB + 1)
    return str(tmp_path / "r.jsonl")


def _read(command: str, path: str) -> Result:
    if command == "report":
        return ckptbench("report", path, timeout=30, memory_limit=2 * GiB)
    return ckptbench("cadence", "--results", path, "--workload", str(WORKLOADS / "tiny.toml"),
                     timeout=30, memory_limit=2 * GiB)


@pytest.mark.parametrize("command", ["report", "cadence"])
@pytest.mark.parametrize("make, needle", [
    (lambda tmp: "/dev/zero", "/dev/zero: is a character device, not a regular file"),
    (_fifo, "r.jsonl: is a FIFO, not a regular file"),
    (_sparse, "r.jsonl: larger than 1,073,741,824 bytes"),
], ids=["dev-zero", "fifo", "over-the-limit"])
def test_only_a_regular_file_of_a_stated_size_is_read(tmp_path: Path, command: str,
                                                      make: Callable[[Path], str],
                                                      needle: str) -> None:
    """Within seconds and under a 2 GiB address-space limit: refused before reading
    (`cadence --results /dev/zero` said "no such file")."""
    line = assert_refused(_read(command, make(tmp_path)), needle, RULE)
    assert "no such file" not in line
    if command == "cadence":
        assert line.startswith("ckptbench: error: --results ")


def _write(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _summaries(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of the records, with summary records (a run writes them at its end)."""
    copied = json.loads(json.dumps(records))
    assert any(r["type"] == "summary" for r in copied)
    return copied


@pytest.mark.parametrize("field, value, allowed", [
    ("bytes", None, "a number"),  # a TypeError traceback before
    ("seconds", "1", "a number"),
    ("iterations", 1.5, "an integer"),
    ("throughput_min", "fast", "a number or null"),
    ("throughput_bytes_per_s", None, "a number"),
    ("latency", {"read": 3}, "an object of {p50_s, p99_s} objects"),
    ("cache", 7, "a string, a list of strings or null"),
])
def test_a_summary_field_of_the_wrong_type_is_one_line(tmp_path: Path,
                                                       good: list[dict[str, Any]], field: str,
                                                       value: Any, allowed: str) -> None:
    records = _summaries(good)
    for r in records:
        if r["type"] == "summary":
            r[field] = value
    path = _write(tmp_path, records)
    assert_refused(ckptbench("report", str(path)), f"{path}: a summary record's {field} is "
                   f"{json.dumps(value)}", f"allowed: {allowed}")


def test_a_summary_without_seconds_is_one_line(tmp_path: Path, good: list[dict[str, Any]]
                                               ) -> None:
    records = _summaries(good)
    for r in records:
        r.pop("seconds", None) if r["type"] == "summary" else None
    path = _write(tmp_path, records)
    assert_refused(ckptbench("report", str(path)), "a summary record lacks seconds")


ESCAPES = "\x1b[31mRED\x1b]0;title\x07\x9b2J\x7f"


def test_control_characters_are_printed_escaped(tmp_path: Path, good: list[dict[str, Any]]
                                                ) -> None:
    """A workload name, a host and an error message holding escape sequences: every
    string printed from the file shows them as \\x1b..., never the raw bytes."""
    records = _summaries(good)
    run = records[0]
    run["workload"] = {**run["workload"], "name": f"w{ESCAPES}"}
    run["environment"] = {**run["environment"], "host": f"h{ESCAPES}"}
    records.append({"type": "error", "iteration": 1, "phase": "restore", "kind": "backend",
                    "message": f"m{ESCAPES}"})
    path = _write(tmp_path, records)
    result = ckptbench("report", str(path), "--wide")
    assert result.rc == 0, result.err
    shown = result.out + result.err
    for raw in ("\x1b", "\x07", "\x9b", "\x7f"):
        assert raw not in shown
    assert "w\\x1b[31mRED\\x1b]0;title\\x07\\x9b2J\\x7f" in result.out
    assert "m\\x1b[31mRED" in result.out
