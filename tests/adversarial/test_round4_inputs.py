"""Round 4 of the adversarial pass (issue 43, item 7): inputs that made `ckptbench run`
misbehave before any measurement.

1. A benchmark file whose `workload` names itself (or a cycle A -> B -> A): a
   RecursionError traceback. Now one line naming the file and the cycle, exit 2.
2. `--iterations 1000000000000` (flag, `[run]`, a replayed results file): a run of years
   started without a word. Now bounded (at most 1,000,000, said in --help), exit 2.
3. `run --replay` of a forged results file wrote its results where the file said
   (`../../..`, an absolute path). Now a results path comes from the command line or the
   default under the current directory; a recorded one is refused.
4. A full file system for `--results` left a 0-byte results file. Now one line naming
   the path and the errno, and the partial file (ours) is removed.
5. A results path that is not a regular file (a device, a FIFO) or huge garbage: one
   line saying what it is and what is allowed, quickly, in bounded memory.
6. A restore onto 1,048,576 ranks sat silent (then at "0 B") for minutes: the run says
   what it plans before planning it, and refuses up front what the run's own bounds
   (--stall-timeout, memory) would stop later.

Real processes, real files; no fixed sleeps.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from .helpers import WORKLOADS, Result, assert_refused, ckptbench
from .runs import env, one_line

TINY = WORKLOADS / "tiny.toml"
GiB = 1 << 30
BIG = "1000000000000"
FAST = ("--block-size", "1MiB", "--prefill", "4MiB")


# --- 1. benchmark files that name themselves ------------------------------------------


def test_a_benchmark_file_naming_itself_is_one_line(tmp_path: Path) -> None:
    bench = tmp_path / "self.toml"
    bench.write_text('[run]\nworkload = "self.toml"\n')
    result = ckptbench("run", str(bench), "--target", str(tmp_path / "t"), cwd=tmp_path,
                       timeout=60)
    assert_refused(result, f"{bench}: [run] workload makes a cycle", f"{bench} -> {bench};",
                   "allowed: a workload file")
    assert not (tmp_path / "t").exists()


def test_a_cycle_of_benchmark_files_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    a, b = tmp_path / "a.toml", tmp_path / "sub" / "b.toml"
    a.write_text('[run]\nworkload = "sub/b.toml"\niterations = 2\n')
    b.write_text('[run]\nworkload = "../a.toml"\n')
    for command in ("run", "sweep", "mlperf"):
        result = ckptbench(command, str(a), "--target", str(tmp_path / "t"), cwd=tmp_path,
                           timeout=60)
        assert_refused(result, str(a), "cycle", "a.toml -> ", "b.toml -> ", "a.toml;")


# --- 2. iterations bounded ------------------------------------------------------------


def test_iterations_flag_is_bounded_before_the_run(tmp_path: Path) -> None:
    """Refused before the run, in bounded memory (the old code set out to list 2e12
    progress segments)."""
    start = time.monotonic()
    result = ckptbench("run", str(TINY), "--iterations", BIG, "--target", str(tmp_path / "t"),
                       "--results", str(tmp_path / "r.jsonl"), cwd=tmp_path, timeout=60,
                       memory_limit=2 * GiB)
    assert_refused(result, "--iterations", BIG, "1<=x<=1000000")
    assert time.monotonic() - start < 30
    assert not (tmp_path / "t").exists() and not (tmp_path / "r.jsonl").exists()


def test_iterations_in_a_run_table_is_bounded(tmp_path: Path, tiny_text: str) -> None:
    workload = tmp_path / "w.toml"
    workload.write_text(tiny_text + f"\n[run]\niterations = {BIG}\n")
    bench = tmp_path / "bench.toml"
    bench.write_text(f'[run]\nworkload = "w.toml"\niterations = {BIG}\n')
    for path in (workload, bench):
        result = ckptbench("run", str(path), "--target", str(tmp_path / "t"), "--results",
                           str(tmp_path / "r.jsonl"), cwd=tmp_path, timeout=60,
                           memory_limit=2 * GiB)
        assert_refused(result, f"{path}: [run] iterations = {BIG} is not allowed",
                       "allowed: an integer, 1 or more, at most 1,000,000")
        assert not (tmp_path / "t").exists() and not (tmp_path / "r.jsonl").exists()


def test_iterations_maximum_is_in_the_help() -> None:
    result = ckptbench("run", "--help", timeout=60)
    assert result.rc == 0
    assert "at most 1,000,000" in " ".join(result.out.split())


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The records of a real run of the tiny workload."""
    tmp = tmp_path_factory.mktemp("recorded")
    results = tmp / "good.jsonl"
    run = ckptbench("run", str(TINY), "--target", str(tmp / "tgt"), *FAST, "--results",
                    str(results), cwd=tmp, timeout=300)
    assert run.rc == 0, run.err
    return [json.loads(line) for line in results.read_text().splitlines()]


def _forged(path: Path, records: list[dict[str, Any]], **run_options: Any) -> Path:
    head = json.loads(json.dumps(records[0]))
    head["run_options"].update(run_options)
    path.write_text("\n".join(json.dumps(r) for r in [head, *records[1:]]) + "\n")
    return path


def test_iterations_of_a_replayed_results_file_is_bounded(tmp_path: Path,
                                                          recorded: list[dict[str, Any]]
                                                          ) -> None:
    forged = _forged(tmp_path / "f.jsonl", recorded, iterations=int(BIG),
                     target=str(tmp_path / "t"))
    result = ckptbench("run", "--replay", str(forged), "--results", str(tmp_path / "r.jsonl"),
                       cwd=tmp_path, timeout=60, memory_limit=2 * GiB)
    assert_refused(result, f"{forged}: run_options iterations = {BIG} is not allowed",
                   "at most 1,000,000")
    assert not (tmp_path / "t").exists() and not (tmp_path / "r.jsonl").exists()


# --- 3. a replay writes its results where the command line says -----------------------


@pytest.mark.parametrize("where", ["../../../escaped.jsonl", "{abs}"])
def test_a_replay_never_takes_the_results_path_from_the_file(
        tmp_path: Path, recorded: list[dict[str, Any]], where: str) -> None:
    cwd = tmp_path / "a" / "b" / "c"
    cwd.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = where.replace("{abs}", str(elsewhere / "escaped.jsonl"))
    forged = _forged(tmp_path / "f.jsonl", recorded, results=path, target=str(tmp_path / "t"))
    result = ckptbench("run", "--replay", str(forged), cwd=cwd, timeout=120)
    assert_refused(result, f"{forged}: run_options results", "allowed: --results")
    assert not (tmp_path / "escaped.jsonl").exists()
    assert not (elsewhere / "escaped.jsonl").exists()
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("option, value", [("json", True), ("launcher", "mpi"),
                                           ("width", 40)])
def test_a_replay_takes_no_output_option_from_the_file(
        tmp_path: Path, recorded: list[dict[str, Any]], option: str, value: Any) -> None:
    forged = _forged(tmp_path / "f.jsonl", recorded, **{option: value})
    result = ckptbench("run", "--replay", str(forged), cwd=tmp_path, timeout=120)
    assert_refused(result, f"{forged}: run_options {option}")


def test_a_replay_writes_under_the_current_directory_by_default(
        tmp_path: Path, recorded: list[dict[str, Any]]) -> None:
    forged = _forged(tmp_path / "f.jsonl", recorded, target=str(tmp_path / "t"))
    cwd = tmp_path / "here"
    cwd.mkdir()
    result = ckptbench("run", "--replay", str(forged), cwd=cwd, timeout=300)
    assert result.rc == 0, result.err
    written = list((cwd / "results").glob("tiny-*.jsonl"))
    assert len(written) == 1
    assert f"results: {Path('results') / written[0].name}" in result.out


# --- 4. a full file system for --results ----------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Any:
    """A 64 KiB tmpfs (needs root: mount)."""
    small = tmp_path / "small"
    small.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a 64 KiB tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield small
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_a_full_results_file_system_leaves_no_results_file(tmp_path: Path,
                                                           small_fs: Path) -> None:
    neighbour = small_fs / "neighbour.txt"
    neighbour.write_text("someone else's file\n")
    results = small_fs / "r.jsonl"
    r = subprocess.run([sys.executable, "-m", "ckptbench", "run", str(TINY), "--target",
                        str(tmp_path / "t"), "--results", str(results)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env())
    assert r.returncode != 0
    one_line(r, r.returncode, str(results), "No space left on device", "ENOSPC")
    assert not results.exists()  # no empty or partial file that looks like results
    assert sorted(p.name for p in small_fs.iterdir()) == ["neighbour.txt"]
    assert neighbour.read_text() == "someone else's file\n"
    assert not (tmp_path / "t").exists()


# --- 5. results paths that are not results files --------------------------------------


def _fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "r.jsonl")
    return tmp_path / "r.jsonl"


def _zeros(tmp_path: Path) -> Path:
    """Just under the 1 GiB bound, no newline, no room on disk (a sparse file)."""
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.truncate(1000 << 20)
    return path


@pytest.mark.parametrize("make, says", [
    (lambda tmp: Path("/dev/zero"), "/dev/zero: is a character device, not a regular file"),
    (_fifo, "r.jsonl: is a FIFO, not a regular file"),
], ids=["dev-zero", "fifo"])
def test_replay_of_what_is_not_a_regular_file_is_one_line(tmp_path: Path, make: Any,
                                                          says: str) -> None:
    path = make(tmp_path)
    result = ckptbench("run", "--replay", str(path), cwd=tmp_path, timeout=30,
                       memory_limit=2 * GiB)
    assert_refused(result, says, "allowed: a results file of `ckptbench run`")


def test_replay_of_huge_garbage_is_refused_quickly(tmp_path: Path) -> None:
    """1,000 MiB of zeros without a newline: the first line of a results file (its run
    record) is small, so this is refused without reading it all (it was a MemoryError
    traceback under a 2 GiB address-space limit)."""
    path = _zeros(tmp_path)
    start = time.monotonic()
    result = ckptbench("run", "--replay", str(path), cwd=tmp_path, timeout=60,
                       memory_limit=2 * GiB)
    assert_refused(result, str(path), "not a ckptbench results file",
                   "allowed: a results file of `ckptbench run`")
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("make, says", [
    (lambda tmp: Path("/dev/zero"), "is a character device"),
    (_fifo, "is a FIFO"),
], ids=["dev-zero", "fifo"])
def test_cadence_results_that_is_not_a_regular_file_without_workload(
        tmp_path: Path, make: Any, says: str) -> None:
    path = make(tmp_path)
    result = ckptbench("cadence", "--results", str(path), "--interval", "30min", cwd=tmp_path,
                       timeout=30, memory_limit=2 * GiB)
    assert_refused(result, str(path), says, "allowed: a results file of `ckptbench run`")


@pytest.mark.parametrize("command", ["cadence", "report"])
def test_huge_garbage_results_are_refused_in_bounded_memory(tmp_path: Path,
                                                            command: str) -> None:
    path = _zeros(tmp_path)
    args = (["cadence", "--results", str(path), "--workload", str(TINY)] if command == "cadence"
            else ["report", str(path)])
    result = ckptbench(*args, cwd=tmp_path, timeout=60, memory_limit=2 * GiB)
    assert_refused(result, str(path))


# --- 6. a restore onto 1,048,576 ranks --------------------------------------------------


def _stderr_lines(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """The process's stderr, line by line as written (None at its end)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for text in proc.stderr:
            lines.put(text.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def test_a_large_restore_says_what_it_plans_before_planning(tmp_path: Path) -> None:
    """The tiny workload restored onto 1,048,576 ranks: its DCP restore plan takes seconds
    of CPU and a GiB (minutes on a loaded machine), in silence before. The line naming it
    comes before any of that work: before the run's banner and its first progress line.
    (Progress as a user sees it in a pipe: the suite turns it off, conftest.py.)"""
    proc = subprocess.Popen([sys.executable, "-m", "ckptbench", "run", str(TINY),
                             "--restore-world-size", "1048576", "--target", str(tmp_path / "t"),
                             "--results", str(tmp_path / "r.jsonl")],
                            cwd=tmp_path, env=env({**os.environ, "CKPTBENCH_PROGRESS": "auto"}),
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        said = _stderr_lines(proc).get(timeout=120)  # the first thing said
        assert said is not None and said.startswith(
            "ckptbench run: planning the restore of 1,048,576 ranks"), said
        assert "reads at most, an estimated" in said, said
        assert proc.poll() is None  # said while it works
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _refused_after_notes(result: Result, *needles: str) -> str:
    """One error line (exit 2, no traceback), after at most the planning notes."""
    assert "Traceback" not in result.err, result.err[-3000:]
    errors = [line for line in result.err.splitlines()
              if line.strip() and not line.startswith("ckptbench run: planning")]
    assert result.rc == 2, (result.rc, result.err[-3000:])
    assert len(errors) == 1, result.err[-3000:]
    assert errors[0].startswith("ckptbench: error: "), errors[0]
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


def test_a_restore_the_stall_timeout_would_stop_is_refused_up_front(tmp_path: Path) -> None:
    """Four processes restoring 1,048,576 ranks each set up millions of reads before their
    first byte: the run sat at "0 B" until --stall-timeout called it stalled. A set-up that
    the run's own --stall-timeout would stop is refused before anything is written."""
    results = tmp_path / "r.jsonl"
    result = ckptbench("run", str(TINY), "--restore-world-size", "1048576", "--stall-timeout",
                       "1s", "--target", str(tmp_path / "t"), "--results", str(results),
                       cwd=tmp_path, timeout=300)
    _refused_after_notes(result, "1,048,576 restore ranks", "reads before its first byte",
                         "--stall-timeout 1 s", "allowed: ")
    assert not (tmp_path / "t").exists() and not results.exists()
