"""Progress on stderr (ckptbench.progress): real commands in real processes, stderr and
stdout real pipes. CKPTBENCH_PROGRESS_INTERVAL=0 prints a line at every change, so a test
never waits for the 5 s interval nor races it; an async run whose training loop lasts
seconds by construction shows the periodic lines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckptbench.errors import SpecError
from ckptbench.progress import Segment, Settings, Status, line, locate, slowest_rank

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "workloads" / "tiny.toml")
TINY_MIB = "22.5 MiB"  # tiny.toml's checkpoint, all 4 ranks


def ckptbench(*args: str, cwd: Path, progress: str = "plain", interval: str = "0",
              timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CKPTBENCH_PROGRESS": progress,
           "CKPTBENCH_PROGRESS_INTERVAL": interval}
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def progress_lines(err: str, command: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith(f"ckptbench {command}: ")]


# --- the pieces ---

def test_locate_follows_the_segments_in_order() -> None:
    segs = [Segment("save 1", 10), Segment("restore 1", 5), Segment("save 2", 10)]
    assert locate(segs, 0) == (0, 0)
    assert locate(segs, 9) == (0, 9)
    assert locate(segs, 10) == (1, 0)  # at a boundary: the next one, at 0
    assert locate(segs, 14) == (1, 4)
    assert locate(segs, 25) == (2, 10)
    assert locate(segs, 99) == (2, 10)  # never past the end


def test_line_names_phase_bytes_rate_and_eta() -> None:
    text = line("run", "save checkpoint 1/2", 3.0, done=3 * 2**20, total=8 * 2**20,
                rate=2**20, of_phase=(3 * 2**20, 4 * 2**20))
    assert text == ("ckptbench run: save checkpoint 1/2: 3 MiB of 4 MiB (75%), 1 MiB/s, "
                    "ETA 5 s; 38% of all; 3 s")


def test_slowest_rank_is_by_its_own_share() -> None:
    """Rank 5 moved fewer bytes than rank 4 but holds fewer: rank 4 is behind."""
    assert slowest_rank([4, 5], [50, 40], [200, 50]) == "rank 4 at 25%"
    assert slowest_rank([4, 5], [200, 50], [200, 50]) == ""  # all done
    assert slowest_rank([4], [0], [10]) == ""  # one rank: the line says it already


@pytest.mark.parametrize(("env", "needle"), [
    ({"CKPTBENCH_PROGRESS": "sometimes"}, "CKPTBENCH_PROGRESS='sometimes': allowed: auto"),
    ({"CKPTBENCH_PROGRESS_INTERVAL": "soon"}, "CKPTBENCH_PROGRESS_INTERVAL='soon'"),
    ({"CKPTBENCH_PROGRESS_INTERVAL": "-1"}, "0 to 86400"),
])
def test_bad_settings_are_one_line(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SpecError, match=re.escape(needle)):
        Settings.from_env(env)


def test_settings_read_seconds_and_off() -> None:
    assert Settings.from_env({"CKPTBENCH_PROGRESS_INTERVAL": "2.5s"}).interval == 2.5
    assert Settings.from_env({"CKPTBENCH_PROGRESS": "0"}).mode == "off"
    assert Settings.from_env({}) == Settings("auto", 5.0)


def test_advance_from_many_threads_loses_nothing(tmp_path: Path) -> None:
    """advance() is called from I/O threads (MPI rank 0): every byte counts."""
    import threading

    with (tmp_path / "err").open("w") as stream:
        status = Status("run", [Segment("save", 8 * 10_000)],
                        settings=Settings("plain", 3600), stream=stream)
        with status:
            threads = [threading.Thread(target=lambda: [status.advance(1) for _ in range(10_000)])
                       for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    assert status._done == 80_000


def test_a_segment_passed_between_two_looks_still_gets_its_line() -> None:
    """At every change (interval 0) each segment is named, even one that began and ended
    between two looks of the thread (a fast save on a busy machine)."""
    import io

    stream = io.StringIO()
    status = Status("run", [Segment("save 1", 10), Segment("restore 1", 10),
                            Segment("save 2", 10), Segment("restore 2", 10)],
                    settings=Settings("plain", 0), stream=stream)
    status.phase("")
    status.advance(5)
    status._tick()
    status.advance(30)  # restore 1 and save 2 both done unseen; restore 2 half done
    status._tick()
    status.advance(5)
    status._tick(final=True)
    shown = stream.getvalue().splitlines()
    assert [x.split(":")[1].strip() for x in shown] == [
        "save 1", "restore 1 (done)", "save 2 (done)", "restore 2", "restore 2 (done)"], shown
    assert "10 B of 10 B (100%)" in shown[2] and "75% of all" in shown[2], shown[2]


# --- the commands ---

def test_run_in_a_pipe_prints_phase_bytes_and_rate_and_json_stays_pure(tmp_path: Path) -> None:
    r = ckptbench("run", TINY, "--target", str(tmp_path / "t"), "--iterations", "2",
                  "--results", str(tmp_path / "r.jsonl"), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # stdout: the JSON alone
    assert out["summary"]
    lines = progress_lines(r.stderr, "run")
    for phase in ("save checkpoint 1/2", "restore checkpoint 1/2", "save checkpoint 2/2",
                  "restore checkpoint 2/2"):
        assert any(f": {phase}" in x for x in lines), (phase, r.stderr)
    assert all(f" of {TINY_MIB} (" in x for x in lines), lines
    assert any(re.search(r", [\d.]+ [KMG]iB/s", x) for x in lines), lines
    assert any(re.search(r"; slowest: rank \d at \d+%", x) for x in lines), lines
    assert lines[-1].startswith("ckptbench run: restore checkpoint 2/2 (done): "
                                f"{TINY_MIB} of {TINY_MIB} (100%)"), lines[-1]


def test_progress_off_prints_none(tmp_path: Path) -> None:
    r = ckptbench("run", TINY, "--target", str(tmp_path / "t"), "--results",
                  str(tmp_path / "r.jsonl"), "--json", cwd=tmp_path, progress="off")
    assert r.returncode == 0, r.stderr
    assert not progress_lines(r.stderr, "run"), r.stderr


def test_a_long_run_prints_a_line_every_interval(tmp_path: Path) -> None:
    """An async run's training loop lasts 40 steps of 0.1 s at least (20 of them the
    baseline): with a 0.5 s interval, lines keep coming while it runs."""
    r = ckptbench("run", TINY, "--target", str(tmp_path / "t"), "--results",
                  str(tmp_path / "r.jsonl"), "--mode", "async", "--step-seconds", "0.1",
                  "--steps-per-checkpoint", "20", "--iterations", "1", cwd=tmp_path,
                  interval="0.5")
    assert r.returncode == 0, r.stderr
    lines = [x for x in progress_lines(r.stderr, "run") if "(done)" not in x]
    assert len(lines) >= 3, r.stderr
    assert any(": persist checkpoint 1/1: " in x for x in lines), lines
    assert "results:" in r.stdout and "ckptbench run:" not in r.stdout


def test_restore_json_is_pure_and_shows_its_reads(tmp_path: Path) -> None:
    r = ckptbench("run", TINY, "--target", str(tmp_path / "t"), "--results",
                  str(tmp_path / "r.jsonl"), "--keep", "--no-restore", cwd=tmp_path,
                  progress="off")
    assert r.returncode == 0, r.stderr
    ckpt = next((tmp_path / "t").glob("*/checkpoint-1"))
    r = ckptbench("restore", str(ckpt), "--results", str(tmp_path / "x.jsonl"), "--json",
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]  # nothing but the JSON on stdout
    lines = progress_lines(r.stderr, "restore")
    assert any(": restore checkpoint 1/1: " in x for x in lines), r.stderr


def test_mlperf_prints_its_banner_before_its_work(tmp_path: Path) -> None:
    r = ckptbench("mlperf", str(ROOT / "workloads" / "mlperf-llama3-8b.toml"), "--scale", "32",
                  "--ranks", "0-1", "--iterations", "2", "--target", str(tmp_path / "t"),
                  "--results", str(tmp_path / "m.jsonl"), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)
    err = r.stderr.splitlines()
    assert err[0].startswith("mlperf: mlperf-llama3-8b, 2 checkpoint(s) (writes-then-reads)"), err
    lines = progress_lines(r.stderr, "mlperf")
    # a segment that began and ended between two looks has its line marked "(done)"
    assert any(re.search(r": save checkpoint 2/2( \(done\))?: ", x) for x in lines), r.stderr
    assert any(re.search(r": restore checkpoint 1/2( \(done\))?: ", x) for x in lines), \
        r.stderr  # all saves first


def test_plan_cadence_report_name_their_phases(tmp_path: Path) -> None:
    r = ckptbench("plan", TINY, cwd=tmp_path)
    assert r.returncode == 0 and "ckptbench plan: building the plan" in r.stderr, r.stderr
    assert "ckptbench plan:" not in r.stdout
    run = ckptbench("run", TINY, "--target", str(tmp_path / "t"), "--iterations", "2",
                    "--results", str(tmp_path / "r.jsonl"), cwd=tmp_path, progress="off")
    assert run.returncode == 0, run.stderr
    r = ckptbench("report", str(tmp_path / "r.jsonl"), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)
    assert "ckptbench report: reading the results" in r.stderr, r.stderr
    r = ckptbench("cadence", "--results", str(tmp_path / "r.jsonl"), "--failure-preset",
                  "llama3", "--force", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)
    assert "ckptbench cadence: modelling the job" in r.stderr, r.stderr


def test_quick_commands_print_nothing_at_the_default_interval(tmp_path: Path) -> None:
    """Progress is for work that takes long: a plan of tiny.toml ends long before 5 s."""
    r = ckptbench("plan", TINY, cwd=tmp_path, interval="3600")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_bad_setting_is_refused_in_one_line(tmp_path: Path) -> None:
    r = ckptbench("plan", TINY, cwd=tmp_path, progress="loud")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "ckptbench: error: CKPTBENCH_PROGRESS='loud': allowed: auto, live, plain, off"]
