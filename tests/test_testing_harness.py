"""harness, the service harness tests and benchmarks share (not installed): the processes it starts die
with it, its tools' output is read right, and its errors are one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import (
    FaultProxy,
    FioJob,
    MinioServer,
    ToolError,
    processes,
    require_binary,
    run,
    run_fio,
)
from harness.fio import jobfile, parse_bandwidth
from harness.warp import (
    WarpOptions,
    duration_seconds,
    parse_report,
    run_warp,
    warp_command,
)

ROOT = Path(__file__).resolve().parent.parent


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether process `pid` has exited (or is a zombie) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def read_pids(path: Path, count: int, within: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        words = path.read_text().split() if path.exists() else []
        if len(words) >= count:
            return [int(w) for w in words[:count]]
        time.sleep(0.05)
    raise AssertionError(f"{path} did not get {count} pids")


def test_stop_ends_the_whole_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    proc = processes.start(["sh", "-c", f"sleep 300 & echo $! > {pids}; sleep 300"])
    (child,) = read_pids(pids, 1)
    processes.stop(proc, timeout=5)
    assert proc.returncode is not None
    assert gone(child), "the tool's own child outlived stop()"


def test_run_ends_the_tools_group_when_interrupted(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    with pytest.raises(subprocess.TimeoutExpired):
        run(["sh", "-c", f"echo $$ > {pids}; sleep 300 & echo $! >> {pids}; wait"], timeout=1)
    shell, child = read_pids(pids, 2)
    assert gone(shell) and gone(child)


def test_run_reports_status_output_and_cpu() -> None:
    done = run([sys.executable, "-c", "import sys\nx = sum(range(3_000_000))\n"
                "print('out'); print('err: bad thing', file=sys.stderr); sys.exit(3)"])
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err: bad thing\n")
    assert done.tail() == "err: bad thing"
    assert 0 < done.cpu_seconds < 30


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_tool_dies_with_a_harness_killed_outright(tmp_path: Path) -> None:
    """SIGKILL leaves the harness no chance to clean up: the kernel ends its tools."""
    pids = tmp_path / "pids"
    harness = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom harness import processes\n"
         "p = processes.start(['sleep', '300'])\n"
         "open(sys.argv[1], 'w').write(str(p.pid))\ntime.sleep(300)", str(pids)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        (tool,) = read_pids(pids, 1)
        assert not gone(tool, within=0.2)
    finally:
        harness.kill()
        harness.wait()
    assert gone(tool), "the tool outlived its harness"


def test_minio_dies_with_a_harness_killed_outright(minio_server: MinioServer, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    harness = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom harness import MinioServer\n"
         "m = MinioServer(sys.argv[2], data_dir=sys.argv[3]).start()\n"
         "open(sys.argv[1], 'w').write(str(m.proc.pid))\ntime.sleep(300)",
         str(pids), minio_server.binary, str(tmp_path / "data")],
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        (server,) = read_pids(pids, 1, within=60)
        assert not gone(server, within=0.2)
    finally:
        harness.send_signal(signal.SIGKILL)
        harness.wait()
    assert gone(server), "MinIO outlived its harness"


def test_minio_stop_leaves_no_process(minio_server: MinioServer) -> None:
    server = MinioServer(minio_server.binary).start()
    assert server.proc is not None
    pid, data = server.proc.pid, server.data_dir
    server.stop()
    assert gone(pid) and not data.exists()


def test_missing_tools_and_bad_faults_are_one_line_errors() -> None:
    with pytest.raises(ToolError, match=r"^no `no-such-tool-ckpt` binary on PATH .*\.ci/setup"):
        require_binary("no-such-tool-ckpt")
    with pytest.raises(ValueError, match=r"faults \['404'\]: allowed are 503, 500, reset, truncate"):
        FaultProxy("http://127.0.0.1:1", ["404"])


# warp's report (a real `warp put` against MinIO, 1 MiB objects, concurrency 2, 5 s).
WARP_PUT = """

Report: PUT. Concurrency: 2. Ran: 2s
 * Average: 111.45 MiB/s, 111.45 obj/s
 * Reqs: Avg: 20.4ms, 50%: 14.8ms, 90%: 35.5ms, 99%: 103.1ms, Fastest: 5.3ms, Slowest: 166.1ms, StdDev: 18.4ms

Throughput, split into 2 x 1s:
 * Fastest: 116.5MiB/s, 116.47 obj/s
 * 50% Median: 116.5MiB/s, 116.47 obj/s
 * Slowest: 106.4MiB/s, 106.43 obj/s
"""


def test_warp_report_and_command_line() -> None:
    rate, seconds = parse_report(WARP_PUT) or (0.0, 0.0)
    assert rate == pytest.approx(111.45 * (1 << 20)) and seconds == 2
    assert parse_report(WARP_PUT.replace("MiB/s", "GiB/s"))[0] == pytest.approx(111.45 * (1 << 30))  # type: ignore[index]
    assert parse_report("warp: <ERROR> connection refused") is None
    assert duration_seconds("1m5s") == 65 and duration_seconds("1h0m0.5s") == 3600.5
    opts = WarpOptions("127.0.0.1:9000", "b", 16 << 20, 4, "6s", multipart=False, signed=False)
    put = warp_command("warp", "put", opts, Path("/tmp/x"))
    assert put[:2] == ["warp", "put"] and "--disable-multipart" in put
    assert "--disable-sha256-payload" in put and put[put.index("--obj.size") + 1] == str(16 << 20)
    get = warp_command("warp", "get", WarpOptions("h:1", "b", 1 << 20, 4), Path("/tmp/x"))
    assert get[get.index("--objects") + 1] == "8" and "--disable-multipart" not in get
    with pytest.raises(ValueError, match="allowed are put, get"):
        warp_command("warp", "delete", opts, Path("/tmp/x"))


def test_warp_keys_go_through_the_environment_only(tmp_path: Path) -> None:
    opts = WarpOptions("127.0.0.1:1", "b", 1 << 20, 1)
    with pytest.raises(ToolError, match="WARP_ACCESS_KEY is not set"):
        run_warp("put", opts, {}, tmp_path)


def test_fio_job_file_and_its_json() -> None:
    job = FioJob(Path("/data/x"), [10 << 20, (5 << 20) + 7], 4 << 20, direct=True)
    assert job.moved_bytes() == (8 << 20) + (4 << 20)  # whole blocks only
    text = jobfile(job, "write")
    for line in ("directory=/data/x", "rw=write", f"bs={4 << 20}", "direct=1", "end_fsync=1",
                 "fallocate=none", "[rank1]", "filename=rank1.fio", f"size={(5 << 20) + 7}"):
        assert line in text.splitlines()
    assert "invalidate=1" in jobfile(job, "read").splitlines()
    with pytest.raises(ValueError, match="allowed are write, read"):
        jobfile(job, "randrw")
    out = "fio: warning: something\n" + json.dumps({"jobs": [{"read": {"bw_bytes": 1234},
                                                              "write": {"bw_bytes": 99}}]})
    assert parse_bandwidth(out, "read") == 1234.0 and parse_bandwidth(out, "write") == 99.0


@pytest.mark.skipif(not shutil.which("fio"), reason="fio not installed (.ci/setup installs it)")
def test_run_fio_writes_and_reads_its_files(tmp_path: Path) -> None:
    job = FioJob(tmp_path, [2 << 20, 3 << 20], 1 << 20, direct=False)
    assert run_fio(job, "write") > 0
    assert sorted((p.name, p.stat().st_size) for p in tmp_path.glob("*.fio") if "job" not in p.name) == [
        ("rank0.fio", 2 << 20), ("rank1.fio", 3 << 20)]
    assert run_fio(job, "read") > 0
    broken = tmp_path / "broken"
    (broken / "rank0.fio").mkdir(parents=True)  # where its file should be
    with pytest.raises(ToolError, match=r"^fio read failed \(1\): .*Is a directory"):
        run_fio(FioJob(broken, [1 << 20], 1 << 20, direct=False), "read")
