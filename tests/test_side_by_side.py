"""The side-by-side benchmark scripts run end to end against the real tools (fio, warp,
MinIO) on small sizes, and refuse bad options with a one-line usage error."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import machine_state
from benchmarks.machine_state import GIB, parse_warm, reporting_paused, warm_size
from ckptbench.errors import SpecError
from harness import empty_trash, find_binary

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^(\S+)\s+(save|restore|PUT|GET)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s", re.M)
# vs_warp's rows name the transport after the mode
WARP_ROW = re.compile(r"^(\S+)\s+botocore\s+(PUT|GET)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+"
                      r"([\d.]+)\s", re.M)


def script(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # warp and minio are found on PATH or where .ci/setup builds them (ckptbench.testing)
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_warm_memory_option(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_warm("auto") is None
    assert parse_warm("0") == 0
    assert parse_warm("1GiB") == GIB
    with pytest.raises(SpecError, match="--warm-memory"):
        parse_warm("lots")
    monkeypatch.setattr(machine_state, "available_memory", lambda: 20 * GIB)
    assert warm_size(1 << 20) == 2 * (1 << 20) + GIB
    assert warm_size(1 << 50) == 10 * GIB  # half the available memory
    assert warm_size(1 << 50, reserve=2 * GIB) == 18 * GIB  # all of it but the reserve
    assert warm_size(4 * GIB, reserve=2 * GIB) == 9 * GIB
    assert warm_size(1 << 50, reserve=1 << 50) == 0


def test_max_page_order_counts_buddyinfo_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "buddyinfo"
    monkeypatch.setattr(machine_state, "BUDDYINFO", info)
    info.write_text("Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3\n"
                    "Node 0, zone   Normal    737    810   1019   1087   1649   1526   1263    980    733    526   2831\n")
    assert machine_state.max_page_order() == 10  # orders 0..10
    info.write_text("Node 0, zone   Normal    1 2 3 4 5 6 7 8 9 10 11 12 13 14\n")
    assert machine_state.max_page_order() == 13
    info.write_text("")
    assert machine_state.max_page_order() == 10  # unreadable: the usual largest order


def knob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None) -> Path:
    """A stand-in for the kernel's page_reporting_order file (a real file), on a machine
    whose largest page order is 10."""
    path = tmp_path / "page_reporting_order"
    if value is not None:
        path.write_text(value + "\n")
    monkeypatch.setattr(machine_state, "REPORTING_ORDER", path)
    monkeypatch.setattr(machine_state, "max_page_order", lambda: 10)
    return path


def test_reporting_paused_turns_reporting_off_and_restores_it(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = knob(tmp_path, monkeypatch, "9")
    with reporting_paused(0) as state:
        assert path.read_text() == "11\n"  # above every order: nothing is reported
        assert state == "free page reporting off (was order 9), 0.00 GiB backed"
    assert path.read_text() == "9\n"
    with pytest.raises(RuntimeError), reporting_paused(0):  # a failed run restores it too
        raise RuntimeError("boom")
    assert path.read_text() == "9\n"
    with reporting_paused(0, pause=False) as state:
        assert path.read_text() == "9\n" and state == "free page reporting left as it is (order 9)"


def test_reporting_paused_restores_it_on_sigterm_and_sighup(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = knob(tmp_path, monkeypatch, "9")
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(SystemExit) as exited, reporting_paused(0):
            assert path.read_text() == "11\n"
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler raises before this ends
        assert exited.value.code == 128 + sig
        assert path.read_text() == "9\n"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


def test_reporting_paused_leaves_what_it_cannot_or_need_not_change(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    knob(tmp_path, monkeypatch, None)
    with reporting_paused(0) as state:
        assert state == "no free page reporting"
    path = knob(tmp_path, monkeypatch, "-1")  # built in, but no device reports pages
    with reporting_paused(0) as state:
        assert state == "no free page reporting (order -1)"
    assert path.read_text() == "-1\n"
    path.write_text("11\n")
    with reporting_paused(0) as state:
        assert state.startswith("free page reporting already off (order 11: not ours to restore")
    assert path.read_text() == "11\n"  # someone else's setting: not undone
    path.write_text("9\n")
    # A mainline kernel refuses orders above its largest (EINVAL): nothing is changed.
    real_set = machine_state._set_reporting_order
    monkeypatch.setattr(machine_state, "_set_reporting_order",
                        lambda value: "Invalid argument" if int(value) > 10 else real_set(value))
    with reporting_paused(0) as state:
        assert state.startswith("free page reporting on (order 9; could not set 11: Invalid argument)")
        assert path.read_text() == "9\n"
    assert path.read_text() == "9\n"


def test_page_reporting_is_left_alone_unless_asked(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripts' --page-reporting: by default the setting is only read; `pause`
    turns reporting off for the run and restores it after."""
    import argparse

    path = knob(tmp_path, monkeypatch, "9")
    backed: list[int] = []
    monkeypatch.setattr(machine_state, "warm_memory", backed.append)  # not the real GiBs
    monkeypatch.setattr(machine_state, "available_memory", lambda: 20 * GIB)
    ap = argparse.ArgumentParser()
    machine_state.add_reporting_option(ap)
    with machine_state.memory_for_run(ap.parse_args([]), GIB) as state:
        assert path.read_text() == "9\n" and state == "free page reporting left as it is (order 9)"
    assert backed == []
    with machine_state.memory_for_run(ap.parse_args(["--page-reporting", "pause"]), GIB) as state:
        assert path.read_text() == "11\n"
        assert state == "free page reporting off (was order 9), 3.00 GiB backed"
    assert path.read_text() == "9\n" and backed == [3 * GIB]


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
                 "--settle", "0", "--warm-memory", "64MiB")  # the machine as it is, by default
    assert out.returncode == 0, out.stderr
    assert re.search("^(" + "|".join(map(re.escape, left_as_is_states())) + ")",
                     out.stdout, re.M), out.stdout
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
    if not (find_binary("warp") and find_binary("minio")):
        if os.environ.get("CKPTBENCH_SKIP_S3") == "1":
            pytest.skip("no warp/minio binary and CKPTBENCH_SKIP_S3=1")
        pytest.fail("no warp or minio binary: run .ci/setup", pytrace=False)
    out = script("vs_warp.py", "--obj-size", "16MiB", "--concurrency", "2", "--duration", "6s",
                 "--objects", "4", "--iterations", "1", "--repeat", "2", "--mode", "single",
                 "--signing", "unsigned", "--workload", "warp")  # no warm-up by default
    assert out.returncode == 0, out.stderr + out.stdout
    rows = WARP_ROW.findall(out.stdout)
    assert [(m, p) for m, p, *_ in rows] == [("single/unsigned", "PUT"), ("single/unsigned", "GET")]
    for *_, warp, ck, _ratio, _pairs in rows:
        assert float(warp) > 0 and float(ck) > 0
    assert "2 alternating run(s), warm-up 0.00 GiB" in out.stdout
    stolen = re.search(r"^CPU stolen by the hypervisor per turn .*: single/unsigned: warp "
                       r"([\d.]+)% ([\d.]+)% \| botocore ([\d.]+)% ([\d.]+)%$", out.stdout, re.M)
    assert stolen and all(0 <= float(x) <= 100 for x in stolen.groups()), out.stdout
    assert re.search("^(" + "|".join(map(re.escape, left_as_is_states())) + ")",
                     out.stdout, re.M), out.stdout


def test_cpu_ticks_reads_steal_from_proc_stat() -> None:
    stat = "cpu  100 5 50 800 20 3 2 20 0 0\ncpu0 50 2 25 400 10 1 1 10 0 0\n"
    assert machine_state.cpu_ticks(stat) == (20, 1000)
    assert machine_state.stolen_share((20, 1000), (70, 2000)) == 0.05
    assert machine_state.stolen_share((20, 1000), (20, 1000)) == 0.0
    stolen, total = machine_state.cpu_ticks()  # this machine's, counted up since boot
    assert 0 <= stolen <= total and total > 0


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


@pytest.mark.parametrize(("layers", "threads"), [(6, 4), (2, 2), (10, 8), (5, 7)])
def test_vs_warp_prefill_makes_every_object_before_the_clock(tmp_path: Path, layers: int,
                                                              threads: int) -> None:
    """The engine gives each writer thread a buffer for every block of its share (norm
    vectors included) when the prefill holds it: none is made on the clock. A smaller
    prefill bounds the buffers by bytes, as before."""
    from benchmarks.vs_warp import prefill_bytes, workload
    from ckptbench.backends.local import LocalBackend
    from ckptbench.formats.base import file_jobs
    from ckptbench.formats.pipeline import assign_threads
    from ckptbench.formats.raw import RawFormat, by_size
    from ckptbench.plan import build_plan
    from ckptbench.runner.comm import SingleComm
    from ckptbench.runner.options import RunOptions
    from ckptbench.spec import load_workload

    obj = 16 << 20
    (tmp_path / "w.toml").write_text(workload(obj, layers))
    plan = build_plan(load_workload(tmp_path / "w.toml"))
    jobs = file_jobs(plan, [0], "ck", 1, 0)
    groups = assign_threads(jobs, threads, by_size)

    def engine(prefill: int) -> RawFormat:
        return RawFormat(plan, [0], LocalBackend(str(tmp_path / "t")), SingleComm(),
                         RunOptions(run_id="x", threads=threads, block_size=obj,
                                    prefill_bytes=prefill).format_options())

    whole = engine(prefill_bytes(layers, threads, obj))
    for group in groups:
        assert whole.buffers_for(group) == sum(-(-j.size // obj) for j in group)
    small = engine(4 * obj * threads)  # 4 objects' bytes per thread: 4 buffers, reused
    assert [small.buffers_for(g) for g in groups] == [4] * threads


def left_as_is_states() -> tuple[str, ...]:
    """How a script's machine-state line can start on this machine by default
    (--page-reporting leave): it only says what it found. (The order itself may be
    another program's to change meanwhile, so it is not matched.)"""
    try:
        old = machine_state.REPORTING_ORDER.read_text().strip()
    except OSError:
        return ("no free page reporting",)
    if not old.isdigit():
        return ("no free page reporting (",)
    return ("free page reporting left as it is (order ",)


def test_empty_trash_removes_only_minios_trash(tmp_path: Path) -> None:
    trash = tmp_path / ".minio.sys" / "tmp" / ".trash"
    (trash / "a1" / "part").mkdir(parents=True)
    (trash / "a1" / "part" / "part.1").write_bytes(b"x" * 10)
    (trash / "b2").write_bytes(b"y")
    kept = tmp_path / "bucket" / "obj" / "xl.meta"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"z")
    assert empty_trash(tmp_path) == 2
    assert trash.is_dir() and not any(trash.iterdir())
    assert kept.read_bytes() == b"z"
    assert empty_trash(tmp_path / "no-minio-here") == 0
