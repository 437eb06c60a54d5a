"""A store that freezes before it answers (issue 43, item 3 and an item of 7).

A real MinIO of its own on loopback is SIGSTOPped at a known point of a run, by the run
itself: the backend method the point names is wrapped (HOOK), and its first call, in
whichever process of the run makes it, stops MinIO's process group before the request is
sent and then leaves a flag file. So the store freezes before the first byte of that
request's answer every time, with no sleep racing the run. Then, with --stall-timeout 5s:

* a freeze while the launcher's parent prepares the target (claiming the run's prefix,
  after the probe that finds the bucket): the parent has no stall watch, and its control
  requests waited six tries of 60 s each (332 s with crt: the reporter's freeze 2.2 s
  into a crt run, whose slower start put it there); now one line in bounded time;
* a freeze at a rank's first save, restore or fill-in request (crt had no timeout of its
  own there), or at the manifest's commit (a control request outside the save, which no
  watch covered): the run's stall line, exit status 1.

Each transport installed here runs each point whose path is its own (the control path is
botocore's for all). The deadline is far above the stall timeout (a loaded machine ends
later, never hangs); MinIO is resumed and stopped in every case (the `server` fixture).

And a fill-in write stopped by a store that went away names the fill-ins it may have left
and the `ckptbench clean` command that removes them, which then does.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness import FaultProxy, MinioServer

from .runs import BANNER, ROOT, TINY, env, records
from .test_s3_faults import server  # noqa: F401

pytestmark = pytest.mark.s3

STALL_S = 5
DEADLINE_S = 120  # from the freeze to the run's end: the stall, the cleanup's 10 s budget,
# a loaded machine (before the fix: 109-332 s and more, or for ever)

# The run, with one backend method wrapped: its first call (in any process of the run)
# whose first argument holds NEEDLE stops MinIO's process group, then makes FLAG.
HOOK = r"""
import os, signal, sys
from importlib import import_module
root, pgid, flag, where, needle, *args = sys.argv[1:]
sys.path.insert(0, root)
from ckptbench.cli import main
module, _, attr = where.partition(":")
cls_name, method = attr.split(".")
cls = getattr(import_module(module), cls_name)
inner = getattr(cls, method)

def hooked(self, *a, **k):
    if needle in str(a[0] if a else ""):
        try:
            fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.killpg(int(pgid), signal.SIGSTOP)
            os.close(fd)
    return inner(self, *a, **k)

setattr(cls, method, hooked)
sys.exit(main(args))
"""

S3 = "ckptbench.backends.s3.backend:S3Backend"
# point: (method, needle, extra run options, exit status, what the error line says)
POINTS: dict[str, tuple[str, str, list[str], int, str]] = {
    "prepare": ("create_dir", "", [], 2, "did not answer within 10"),
    "save": ("open_write", "", [], 1, "during the save of checkpoint-1"),
    "commit": ("put_atomic", "checkpoint-1/", [], 1, "during a request to the storage (put "),
    "restore": ("open_read_planned", "", [], 1, "during the restore of checkpoint-1"),
    "fill-ins": ("open_write", "-fill-in/", ["--ranks", "0-1"], 1,
                 "during the writing of the fill-ins in"),
}
# transport: the package it needs; the points whose requests go through it (the control
# requests, at 'prepare' and 'commit', are botocore's whatever the transport)
TRANSPORTS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "botocore": (None, tuple(POINTS)),
    "crt": ("awscrt", ("prepare", "save", "restore", "fill-ins")),
    "obstore": ("obstore", ("prepare", "save", "restore", "fill-ins")),
}
CASES = [pytest.param(t, p, id=f"{t}-{p}") for t, (_, points) in TRANSPORTS.items()
         for p in points]
CASES += [
    pytest.param("s3torchconnector", "save", id="s3torchconnector-save", marks=pytest.mark.skip(
        reason=("s3torchconnector is not installed here; and " if not
                importlib.util.find_spec("s3torchconnector") else "")
        + "it moves bytes only for --format torch-dcp, whose saves report no bytes as they "
          "move and are not stall-watched (runner.stall: its storage calls' own timeouts)")),
    pytest.param("fsspec", "save", id="fsspec-s3a-save", marks=pytest.mark.xfail(
        run=False, reason="s3a:// (fsspec + s3fs) fails every multi-rank run here with "
                          "'This class is not fork-safe', and its parent's requests have "
                          "no bound against a frozen store: ckptbench/backends/"
                          "fsspec_backend.py, not this change")),
]


def _run_frozen(server: MinioServer, tmp_path: Path, transport: str,  # noqa: F811
                point: str) -> tuple[subprocess.CompletedProcess[str], float]:
    method, needle, extra, _, _ = POINTS[point]
    assert server.proc is not None
    flag = tmp_path / "frozen"
    results = tmp_path / "r.jsonl"
    args = ["run", str(TINY), "--target", f"s3://{server.bucket}/{transport}-{point}",
            "--endpoint-url", server.endpoint, "--s3-transport", transport,
            "--stall-timeout", f"{STALL_S}s", "--results", str(results), *extra]
    proc = subprocess.Popen(
        [sys.executable, "-c", HOOK, str(ROOT), str(server.proc.pid), str(flag),
         f"{S3}.{method}", needle, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=env(server.env()))
    try:
        start = time.monotonic()
        while not flag.exists():  # the run freezes the store itself: no race to win
            if proc.poll() is not None or time.monotonic() - start > DEADLINE_S:
                proc.kill()
                pytest.fail(f"the run never reached '{point}': {proc.communicate()[1][-3000:]}")
            time.sleep(0.02)
        frozen_at = time.monotonic()
        try:
            out, err = proc.communicate(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run was still going {DEADLINE_S} s after the store froze at "
                        f"'{point}' (--stall-timeout {STALL_S}s)")
        return (subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                time.monotonic() - frozen_at)
    finally:
        if proc.poll() is None:
            proc.kill()  # its ranks die with it (PR_SET_PDEATHSIG)
            proc.communicate()
        os.killpg(server.proc.pid, signal.SIGCONT)


def _error_line(r: subprocess.CompletedProcess[str]) -> str:
    """The one error line; besides it only the banner and the cleanup's note that the
    store did not answer (the run's intent kept for --clean-debris) may be there."""
    lines = [line for line in r.stderr.splitlines() if line.strip() and not BANNER.match(line)
             and not ("unfinished upload(s)" in line and "--clean-debris" in line)]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("ckptbench: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize(("transport", "point"), CASES)
def test_store_frozen_before_its_answer_ends_the_run(server: MinioServer,  # noqa: F811
                                                     tmp_path: Path, transport: str,
                                                     point: str) -> None:
    package = TRANSPORTS[transport][0]
    if package and not importlib.util.find_spec(package):
        pytest.skip(f"--s3-transport {transport} needs {package}, not installed here")
    r, elapsed = _run_frozen(server, tmp_path, transport, point)
    _, _, _, status, says = POINTS[point]
    line = _error_line(r)
    assert r.returncode == status, (r.returncode, r.stderr[-3000:])
    assert says in line, line
    if status == 1:  # the run's usual stall line: the rank, the timeout, the option
        assert f"stalled: no byte moved for {STALL_S} s" in line, line
        assert f"(--stall-timeout {STALL_S}s)" in line, line
    assert elapsed < DEADLINE_S


class FillInsGone:
    """Matches nothing up to the first fill-in's upload (forwarded: the store keeps it),
    then every request: the store is gone from then on (the proxy resets each one)."""

    def __init__(self) -> None:
        self.gone = threading.Event()

    def __call__(self, method: str, path: str) -> bool:
        if self.gone.is_set():
            return True
        if method == "PUT" and "-fill-in/" in path:
            self.gone.set()
        return False


def test_fill_ins_a_gone_store_kept_are_named_with_their_clean_command(
        server: MinioServer, tmp_path: Path) -> None:  # noqa: F811
    """A subset run's fill-in writes fail because the store went away (connections reset
    once its first fill-in is written); their removal fails too. The error names the fill-ins that
    may be left and the command that removes them, and that command, run once the store
    is back, does."""
    assert server.bucket
    results = tmp_path / "r.jsonl"
    target = f"s3://{server.bucket}/gone"
    gone = FillInsGone()
    with FaultProxy(server.endpoint, ["reset"] * 10_000, gone) as proxy:
        r = subprocess.run(
            [sys.executable, "-m", "ckptbench", "run", str(TINY), "--target", target,
             "--endpoint-url", proxy.endpoint, "--ranks", "0-1", "--s3-max-attempts", "1",
             "--stall-timeout", f"{STALL_S}s", "--results", str(results)],
            capture_output=True, text=True, cwd=tmp_path, env=env(server.env()),
            timeout=DEADLINE_S)
        assert gone.gone.is_set(), r.stderr[-3000:]
        line = _error_line(r)
        assert r.returncode == 2 and "writing the fill-ins in" in line, line
        left = [k for k in server.list_keys(server.bucket, "gone/") if "-fill-in/" in k]
        assert left, "no fill-in reached the store: nothing was left to name"
        for key in left:  # each one the store holds, by name
            assert key.rsplit("/", 1)[-1] in line.split("fill-ins maybe left in", 1)[1], line
        command = line.split("`", 2)[1]
        assert command == f"ckptbench clean {target} --endpoint-url {proxy.endpoint} --yes"
        error: Any = next(x for x in records(results) if x["type"] == "error")
        assert error["message"] in line  # the results say it too
        with proxy.lock:
            proxy.faults.clear()  # the store is back
        again = subprocess.run([sys.executable, "-m", "ckptbench", *command.split()[1:]],
                               capture_output=True, text=True, cwd=tmp_path,
                               env=env(server.env()), timeout=DEADLINE_S)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [k for k in server.list_keys(server.bucket, "gone/") if "-fill-in/" in k] == []


def test_a_control_request_the_store_never_answers_is_a_stall() -> None:
    """The seam the S3 control requests arm (runner.stall.StallWatch.request): no answer
    for the timeout is one stall report naming the request, from the watchdog."""
    from ckptbench.runner.stall import StallWatch

    said: list[str] = []
    fired = threading.Event()

    def on_stall(message: str) -> None:
        said.append(message)
        fired.set()

    watch = StallWatch(0.5, on_stall, "rank 3")
    with watch.request("a request to the storage (put run-1/checkpoint-1/.metadata)"):
        assert fired.wait(30), "the watch never fired"
    (message,) = said
    assert message.startswith("rank 3 stalled: no byte moved for 0.5 s during a request to "
                              "the storage (put run-1/checkpoint-1/.metadata)"), message


def test_control_requests_are_bounded_where_no_watch_is(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """The process that prepared a run and has no stall watch (the launcher's parent) gets
    the short 'control' client for the target's control requests; a rank, whose watch is
    handed to the backend (Backend.watch_requests), keeps the patient 'main' one, its watch armed
    for each request."""
    from ckptbench.backends.s3 import S3Backend, S3Options
    from ckptbench.backends.s3 import client as s3client
    from ckptbench.runner.stall import StallWatch

    monkeypatch.setattr(s3client, "_WATCH", {})
    for k, v in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    b = S3Backend("s3://bucket/x", S3Options(endpoint_url="http://127.0.0.1:9"))
    assert b._control()[1] == "main"  # `ckptbench clean`: prepares nothing
    b.process().prepared = True
    assert b._control()[1] == "control"
    assert b.clients.read_timeout("control") == s3client.SHORT_CLIENTS["control"][1]
    watch = StallWatch(60, lambda message: None)
    assert s3client.request_watch() is None  # not handed over until the driver does
    b.watch_requests(watch)  # the driver hands a rank's watch to its backend
    assert s3client.request_watch() is watch
    assert b._control()[1] == "main"
