"""`report` refuses what is not a complete results file, in one line: garbage, lines
that are JSON but not records, an empty file, and the file of a run that was killed
(no summary and no error record: an empty table would read as success). Issue 16,
item 6.

This suite (tests/adversarial) keeps the abuse cases of issue 16 so that later features
inherit them: every reader of results files should refuse these the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import WORKLOADS, Result, assert_refused, ckptbench


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The results file of a real run of the tiny workload."""
    tmp = tmp_path_factory.mktemp("run")
    results = tmp / "good.jsonl"
    run = ckptbench("run", str(WORKLOADS / "tiny.toml"), "--target", str(tmp / "tgt"),
                    "--results", str(results), timeout=300)
    assert run.rc == 0, run.err
    return results.read_bytes()


def _report(tmp_path: Path, content: bytes, *flags: str) -> tuple[Result, Path]:
    path = tmp_path / "r.jsonl"
    path.write_bytes(content)
    return ckptbench("report", str(path), *flags), path


def test_the_good_file_reports(tmp_path: Path, good: bytes) -> None:
    result, _ = _report(tmp_path, good, "--json")
    assert result.rc == 0, result.err
    (loaded,) = json.loads(result.out)
    assert {s["phase"] for s in loaded["summary"]} == {"save", "restore"}


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"\x89PNG\r\n\x1a\n\x00\x00"],
                         ids=["binary", "png"])
def test_binary_garbage_is_one_line(tmp_path: Path, content: bytes) -> None:
    result, path = _report(tmp_path, content)
    assert_refused(result, f"{path}:1: not")  # not UTF-8 text, or not a JSON line


@pytest.mark.parametrize("line", [b"[1,2]", b"null", b"\"text\"", b"42", b"true"])
def test_json_that_is_not_a_record_is_one_line(tmp_path: Path, line: bytes) -> None:
    result, path = _report(tmp_path, line + b"\n")
    assert_refused(result, f"{path}:1:", "not a record", "one JSON object per line")


@pytest.mark.parametrize("line", [b"[1,2]", b"null", b"garbage", b"\xff\xfe", b"[" * 100_000])
def test_good_records_then_garbage_is_one_line_naming_the_line(tmp_path: Path, good: bytes,
                                                                line: bytes) -> None:
    lines = good.splitlines(keepends=True)
    mixed = b"".join(lines[:3]) + line + b"\n" + b"".join(lines[3:])
    result, path = _report(tmp_path, mixed)
    assert_refused(result, f"{path}:4:")


def test_records_without_the_fields_a_report_needs_are_one_line(tmp_path: Path, good: bytes) -> None:
    run_record = good.splitlines(keepends=True)[0]
    result, path = _report(tmp_path, run_record + b'{"type": "rank"}\n{"type": "phase"}\n')
    assert_refused(result, str(path), "not a results file")


def test_a_summary_without_its_fields_is_one_line(tmp_path: Path, good: bytes) -> None:
    run_record = good.splitlines(keepends=True)[0]
    result, path = _report(tmp_path, run_record + b'{"type": "summary"}\n')
    assert_refused(result, str(path), "summary record lacks phase")


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["empty", "blank-lines"])
def test_empty_file_is_refused(tmp_path: Path, content: bytes) -> None:
    result, path = _report(tmp_path, content)
    assert_refused(result, str(path), "empty")


@pytest.mark.parametrize("keep", ["run", "run+ops"])
def test_run_killed_before_its_summary_is_incomplete(tmp_path: Path, good: bytes, keep: str) -> None:
    """What a killed run leaves: its run record and the ops measured so far, but no
    rank, phase, summary or error records."""
    records = [json.loads(line) for line in good.splitlines()]
    kept = [r for r in records if r["type"] == "run" or (keep == "run+ops" and r["type"] == "op")]
    assert len(kept) > (1 if keep == "run+ops" else 0)
    content = b"".join(json.dumps(r).encode() + b"\n" for r in kept)
    for flags in ((), ("--json",)):
        result, path = _report(tmp_path, content, *flags)
        assert_refused(result, str(path), "incomplete", "no summary")
        assert result.out == ""  # no table that would read as success
