"""Workload names end up in file names (results/<name>-<run id>.jsonl): a name is a plain
file-name-safe word, never a path, checked before anything runs (issue 16, item 2).

This suite (tests/adversarial) keeps the abuse cases of issue 16 so that later features
inherit them: a new command or option that reads a workload must pass these too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptbench.errors import SpecError
from ckptbench.spec import parse_workload

from .helpers import assert_refused, ckptbench


def _workload(tmp_path: Path, tiny_text: str, name_line: str) -> Path:
    path = tmp_path / "w.toml"
    path.write_text(tiny_text.replace('name = "tiny"', name_line, 1))
    return path


def _written_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and p.name != "w.toml"]


def test_name_with_parent_dirs_cannot_put_results_outside_results(tmp_path: Path, tiny_text: str) -> None:
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    workload = _workload(cwd, tiny_text, 'name = "../../escaped"')
    result = ckptbench("run", str(workload), "--target", "tgt", cwd=cwd, timeout=300)
    assert_refused(result, "[workload] name", "'../../escaped'", "allowed")
    assert _written_files(tmp_path) == []  # no results file anywhere, no target made


def test_absolute_name_cannot_write_anywhere(tmp_path: Path, tiny_text: str) -> None:
    elsewhere = tmp_path / "any" / "dir"
    elsewhere.mkdir(parents=True)
    workload = _workload(tmp_path, tiny_text, f'name = "{elsewhere / "x"}"')
    result = ckptbench("run", str(workload), "--target", "tgt", cwd=tmp_path, timeout=300)
    assert_refused(result, "[workload] name", "allowed")
    assert list(elsewhere.iterdir()) == []
    assert not (tmp_path / "results").exists()


def test_nul_in_name_is_one_line_not_a_traceback(tmp_path: Path, tiny_text: str) -> None:
    workload = _workload(tmp_path, tiny_text, r'name = "a\u0000b"')
    result = ckptbench("run", str(workload), "--target", "tgt", cwd=tmp_path, timeout=300)
    assert_refused(result, "[workload] name", r"'a\x00b'")
    assert _written_files(tmp_path) == []


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "a/b", "a\\b", "x" * 129, "tab\tname",
                                  "new\nline", "é"])
def test_plan_refuses_names_that_are_not_plain_file_names(tmp_path: Path, tiny_text: str,
                                                           name: str) -> None:
    toml_name = name.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
    workload = _workload(tmp_path, tiny_text, f'name = "{toml_name}"')
    assert_refused(ckptbench("plan", str(workload)), "[workload] name", "allowed")


@pytest.mark.parametrize("value", [5, True, ["a"]])
def test_name_must_be_a_string(value: object) -> None:
    with pytest.raises(SpecError, match=r"\[workload\] name = .* is not allowed"):
        parse_workload({"workload": {"name": value}, "model": {"name": "llama3-8b"}})


@pytest.mark.parametrize("name", ["tiny", "llama3.1-405b-tp8-pp16-fsdp-16384", "A_b+c", "x" * 128])
def test_plain_names_still_work(name: str) -> None:
    w = parse_workload({"workload": {"name": name}, "model": {"name": "llama3-8b"}})
    assert w.name == name


def test_the_message_says_what_is_allowed() -> None:
    with pytest.raises(SpecError) as info:
        parse_workload({"workload": {"name": "../x"}, "model": {"name": "llama3-8b"}})
    message = str(info.value)
    assert "letters, digits" in message and "starting with a letter or digit" in message
    assert "\n" not in message
