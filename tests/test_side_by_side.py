"""The side-by-side benchmark scripts run end to end against the real tools (fio, warp,
MinIO) on small sizes, and refuse bad options with a one-line usage error."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import machine_state
from benchmarks.machine_state import GIB, mem_available, parse_warm, reporting_paused, warm_size
from ckptbench.errors import SpecError

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^(\S+)\s+(save|restore|PUT|GET)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s", re.M)


def script(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # warp and minio are found on PATH or where .ci/setup builds them (tests/minio.py)
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_warm_memory_option() -> None:
    assert parse_warm("auto") is None
    assert parse_warm("0") == 0
    assert parse_warm("1GiB") == GIB
    with pytest.raises(SpecError, match="--warm-memory"):
        parse_warm("lots")
    assert warm_size(1 << 20) == min(2 * (1 << 20) + GIB, mem_available() // 2)
    assert warm_size(1 << 50) <= mem_available() // 2
    assert mem_available() - 3 * GIB <= warm_size(1 << 50, reserve=2 * GIB) <= mem_available() - 2 * GIB
    assert warm_size(1 << 50, reserve=1 << 50) == 0


def knob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None) -> Path:
    """A stand-in for the kernel's page_reporting_order file (a real file)."""
    path = tmp_path / "page_reporting_order"
    if value is not None:
        path.write_text(value + "\n")
    monkeypatch.setattr(machine_state, "REPORTING_ORDER", path)
    return path


def test_reporting_paused_turns_reporting_off_and_restores_it(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    top = machine_state.max_page_order()
    assert 8 <= top <= 20  # from /proc/buddyinfo
    path = knob(tmp_path, monkeypatch, "9")
    with reporting_paused(0) as state:
        assert path.read_text() == f"{top + 1}\n"  # above every order: nothing is reported
        assert state == "free page reporting off (was order 9), 0.00 GiB backed"
    assert path.read_text() == "9\n"
    with pytest.raises(RuntimeError), reporting_paused(0):  # a failed run restores it too
        raise RuntimeError("boom")
    assert path.read_text() == "9\n"
    with reporting_paused(0, pause=False) as state:
        assert path.read_text() == "9\n" and state == "free page reporting left as it is (order 9)"


def test_reporting_paused_leaves_what_it_cannot_or_need_not_change(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    knob(tmp_path, monkeypatch, None)
    with reporting_paused(0) as state:
        assert state == "no free page reporting"
    path = knob(tmp_path, monkeypatch, "99")
    with reporting_paused(0) as state:
        assert state.startswith("free page reporting already off (order 99)")
    assert path.read_text() == "99\n"  # someone else's setting: not undone
    path.write_text("9\n")
    monkeypatch.setattr(machine_state, "_set_reporting_order", lambda value: "Permission denied")
    with reporting_paused(0) as state:
        assert state.startswith("free page reporting on (order 9; could not pause it: Permission denied)")
    assert path.read_text() == "9\n"


@pytest.mark.skipif(not (machine_state.REPORTING_ORDER.exists() and os.access(machine_state.REPORTING_ORDER, os.W_OK)),
                    reason="this kernel has no page_reporting_order that this user may set")
def test_reporting_paused_on_this_kernel() -> None:
    before = machine_state.REPORTING_ORDER.read_text()
    with reporting_paused(0) as state:
        now = int(machine_state.REPORTING_ORDER.read_text())
        assert now >= machine_state.max_page_order(), state
    assert machine_state.REPORTING_ORDER.read_text() == before


def test_vs_fio_refuses_ranks_smaller_than_a_block(tmp_path: Path) -> None:
    out = script("vs_fio.py", "--dir", str(tmp_path / "d"), "--scale", "64")
    assert out.returncode == 2 and "less than --bs" in out.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("name", ["vs_fio.py", "vs_warp.py"])
def test_bad_warm_memory_is_a_one_line_usage_error(name: str, tmp_path: Path) -> None:
    out = script(name, "--warm-memory", "lots", *(["--dir", str(tmp_path / "d")] if name == "vs_fio.py" else []))
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert "--warm-memory 'lots' is not a size" in last and "Traceback" not in out.stderr
    assert not (tmp_path / "d").exists()  # nothing made before the options are checked


@pytest.mark.skipif(not shutil.which("fio"), reason="fio not installed (.ci/setup installs it)")
def test_vs_fio_runs_both_tools_and_prints_four_ratios(tmp_path: Path) -> None:
    out = script("vs_fio.py", "--dir", str(tmp_path), "--scale", "16", "--bs", "4194304", "--repeat", "2",
                 "--settle", "0", "--warm-memory", "64MiB")
    assert out.returncode == 0, out.stderr
    rows = ROW.findall(out.stdout)
    assert [(m, p) for m, p, *_ in rows] == [("buffered", "save"), ("buffered", "restore"),
                                             ("direct", "save"), ("direct", "restore")]
    for *_, fio, ck, ratio, _pairs in rows:
        assert float(fio) > 0 and float(ck) > 0
        assert float(ratio) == pytest.approx(float(ck) / float(fio), abs=0.01)
    assert "warm-up 0.06 GiB" in out.stdout
    assert re.search(r"fio moves \d+ bytes \(9\d\.\d\d% of ckptbench's", out.stdout)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckptbench.jsonl"]  # fio's files gone


def test_vs_warp_runs_both_tools_against_its_own_minio() -> None:
    from minio import find_binary

    if not (find_binary("warp") and find_binary("minio")):
        if os.environ.get("CKPTBENCH_SKIP_S3") == "1":
            pytest.skip("no warp/minio binary and CKPTBENCH_SKIP_S3=1")
        pytest.fail("no warp or minio binary: run .ci/setup", pytrace=False)
    out = script("vs_warp.py", "--obj-size", "16MiB", "--concurrency", "2", "--duration", "6s",
                 "--objects", "4", "--iterations", "1", "--repeat", "2", "--mode", "single",
                 "--signing", "unsigned")  # no warm-up by default (vs_warp's docstring)
    assert out.returncode == 0, out.stderr + out.stdout
    rows = ROW.findall(out.stdout)
    assert [(m, p) for m, p, *_ in rows] == [("single/unsigned", "PUT"), ("single/unsigned", "GET")]
    for *_, warp, ck, _ratio, _pairs in rows:
        assert float(warp) > 0 and float(ck) > 0
    assert "2 alternating run(s), warm-up 0.00 GiB" in out.stdout
    assert re.search(r"^(no free page reporting|free page reporting (off|at order \d+ only|already off|on) )",
                     out.stdout, re.M), out.stdout


def test_vs_warp_checkpoints_move_whole_waves_of_objects() -> None:
    from benchmarks.vs_warp import model_layers, workload

    assert model_layers(32, 4) == 6  # 44 objects: 11 per thread, not 37 (9, 9, 9, 10)
    assert model_layers(64, 8) == 10  # 72
    assert model_layers(4, 2) == 2  # 16
    assert model_layers(32, 7) == 5  # 7n + 2 is never a multiple of 7: at least 32 (37)
    for objects, c in ((1, 1), (32, 4), (20, 3), (64, 8), (100, 6)):
        n = 7 * model_layers(objects, c) + 2
        assert n >= objects and (n % c == 0 or c == 7)
    assert "layers = 6\n" in workload(64 << 20, 6) and "dim = 4096\n" in workload(64 << 20, 6)


def test_empty_trash_removes_only_minios_trash(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from benchmarks.vs_warp import empty_trash

    trash = tmp_path / ".minio.sys" / "tmp" / ".trash"
    (trash / "a1" / "part").mkdir(parents=True)
    (trash / "a1" / "part" / "part.1").write_bytes(b"x" * 10)
    (trash / "b2").write_bytes(b"y")
    kept = tmp_path / "bucket" / "obj" / "xl.meta"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"z")
    assert empty_trash(SimpleNamespace(data_dir=tmp_path)) == 2  # type: ignore[arg-type]
    assert trash.is_dir() and not any(trash.iterdir())
    assert kept.read_bytes() == b"z"
    assert empty_trash(None) == 0
