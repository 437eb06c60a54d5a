"""Workload files are read only when they are regular UTF-8 files under a size limit: a
FIFO must not block, /dev/zero must not fill memory, binary must not be a traceback, in
every command that reads one (issue 16, items 5 and 6).

This suite (tests/adversarial) keeps the abuse cases of issue 16 so that later features
inherit them: a new command that takes a workload file adds itself to COMMANDS.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .helpers import assert_refused, ckptbench

# Every command that reads a workload file, as argv with {} for the file.
COMMANDS = {
    "plan": ["plan", "{}"],
    "run": ["run", "{}", "--target", "tgt"],
    "cadence": ["cadence", "--workload", "{}", "--save-seconds", "10", "--restore-seconds", "20",
                "--mtbf", "3h"],
}


def _argv(command: str, path: Path) -> list[str]:
    return [str(path) if a == "{}" else a for a in COMMANDS[command]]


@pytest.fixture(params=sorted(COMMANDS))
def command(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_fifo_is_refused_without_blocking(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "w.toml"
    os.mkfifo(fifo)
    result = ckptbench(*_argv(command, fifo), cwd=tmp_path, timeout=30)
    assert_refused(result, str(fifo), "a FIFO", "allowed: a UTF-8 TOML workload file")


def test_dev_zero_is_refused_without_reading(tmp_path: Path) -> None:
    # 2 GiB of address space: the old code read /dev/zero until MemoryError.
    result = ckptbench("plan", "/dev/zero", cwd=tmp_path, timeout=60, memory_limit=2 << 30)
    assert_refused(result, "/dev/zero", "a character device", "allowed")


def test_directory_is_refused(tmp_path: Path) -> None:
    # plan's argument is a file path: click refuses a directory in one line too.
    result = ckptbench("cadence", "--workload", str(tmp_path), "--save-seconds", "1",
                       "--restore-seconds", "1", "--mtbf", "1h")
    assert_refused(result, str(tmp_path), "a directory")


def test_file_over_the_size_limit_is_refused(tmp_path: Path, tiny_text: str) -> None:
    big = tmp_path / "w.toml"
    big.write_text(tiny_text + ("# padding\n" * 110_000))  # valid TOML, 1.1 MB
    assert_refused(ckptbench("plan", str(big)), str(big), "larger than 1,048,576 bytes")


def test_binary_workload_is_one_line(tmp_path: Path, command: str) -> None:
    binary = tmp_path / "w.toml"
    binary.write_bytes(bytes(range(256)) * 8)
    result = ckptbench(*_argv(command, binary), cwd=tmp_path, timeout=120)
    assert_refused(result, str(binary), "not UTF-8 text", "allowed")


def test_latin1_workload_names_the_byte(tmp_path: Path, command: str, tiny_text: str) -> None:
    latin1 = tmp_path / "w.toml"
    latin1.write_bytes(tiny_text.replace("Tiny custom", "Tiny caf\u00e9").encode("latin-1"))
    result = ckptbench(*_argv(command, latin1), cwd=tmp_path, timeout=120)
    offset = tiny_text.index("Tiny custom") + len("Tiny caf")
    assert_refused(result, str(latin1), f"byte {offset:,} is 0xe9", "UTF-8")


def test_nul_bytes_in_utf8_text_are_one_line(tmp_path: Path, tiny_text: str) -> None:
    path = tmp_path / "w.toml"
    path.write_bytes(b"\x00" * 64 + tiny_text.encode())
    assert_refused(ckptbench("plan", str(path)), str(path), "not valid TOML")


def test_utf8_workload_with_non_ascii_description_still_plans(tmp_path: Path, tiny_text: str) -> None:
    path = tmp_path / "w.toml"
    path.write_text(tiny_text.replace("Tiny custom", "Tiny caf\u00e9"), encoding="utf-8")
    result = ckptbench("plan", str(path))
    assert result.rc == 0, result.err
