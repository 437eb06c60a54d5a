"""Uploads left by a frozen server are named and found again (issue 29, family 7).

The S3 endpoint freezes while a save's multipart uploads are in flight, through every
transport (botocore, crt, obstore) and a botocore --mode async persist. The run fails (its
ranks stall); once the server thaws, every upload still pending is one the run recorded
before starting it: the cleanup record's `left` names it by key, and a later run with
--clean-debris finds it by those names and aborts it. A real MinIO of its own, behind a
proxy that freezes at the first upload's second part: a SIGSTOPped MinIO would work
through what reached its socket while stopped once it thawed (a completion or an abort),
so whether an upload was left would be a race; behind the proxy it is certain.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import FaultProxy, MinioServer

from .runs import env, records
from .test_s3_faults import (  # noqa: F401
    BOUND_S,
    WORKLOAD,
    assert_stall_reported,
    pending_uploads,
    server,
)

pytestmark = pytest.mark.s3

CASES = {
    "botocore": [],
    "crt": ["--s3-transport", "crt"],
    "obstore": ["--s3-transport", "obstore"],
    "botocore-async": ["--mode", "async", "--step-seconds", "0.01",
                       "--steps-per-checkpoint", "2"],
}
NEEDS = {"crt": "awscrt", "obstore": "obstore"}


def second_part(method: str, path: str) -> bool:
    """The freeze's request: an upload begun, one part sent, the next one on its way."""
    return method == "PUT" and "partNumber=2&" in path + "&"


@pytest.mark.parametrize("case", CASES)
def test_frozen_server_uploads_named_and_cleaned_as_debris(server: MinioServer,  # noqa: F811
                                                           tmp_path: Path, case: str) -> None:
    if case in NEEDS and not importlib.util.find_spec(NEEDS[case]):
        pytest.skip(f"{NEEDS[case]} is not installed")
    workload = tmp_path / "freeze.toml"
    workload.write_text(WORKLOAD)
    results = tmp_path / "r.jsonl"
    def base(endpoint: str) -> list[str]:
        return [sys.executable, "-m", "ckptbench", "run", str(workload), "--target",
                f"s3://{server.bucket}/frozen", "--endpoint-url", endpoint]

    with FaultProxy(server.endpoint, ["freeze"], second_part) as proxy:
        proc = subprocess.Popen(
            [*base(proxy.endpoint), "--part-size", "5MiB", "--s3-concurrency", "2",
             "--stall-timeout", "5s", "--results", str(results), *CASES[case]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
            env=env(server.env()))
        deadline = time.monotonic() + 300
        while not proxy.frozen.wait(0.05):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"no second part was sent: {proc.communicate()[1][-3000:]}")
        frozen_at = time.monotonic()
        try:
            if "--mode" in CASES[case]:  # the persist fails in the background: its own line
                _out, err = proc.communicate(timeout=BOUND_S + 60)
                assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
            else:  # one line naming the stall, in bounded time
                assert_stall_reported(proc, frozen_at)
        finally:
            proxy.thaw()
            if proc.poll() is None:
                proc.kill()
    # Nothing sent while frozen reaches the server (FaultProxy): what it holds now, the run
    # over and the proxy gone, is what the freeze left; no backlog to wait for.
    pending = [k.split("/", 1)[1] for k in pending_uploads(server, str(server.bucket))]
    assert pending, "the freeze left no upload: nothing was tested"
    (cleanup,) = [r for r in records(results) if r["type"] == "cleanup"]
    for key in pending:  # each by its key (a count would leave --clean-debris guessing)
        assert any(left.startswith(key) and "unfinished upload" in left
                   for left in cleanup["left"]), (key, cleanup["left"])

    r = subprocess.run([*base(server.endpoint), "--scale", "8", "--clean-debris", "--results",
                        str(tmp_path / "c.jsonl")],
                       capture_output=True, text=True, cwd=tmp_path, env=env(server.env()),
                       timeout=300)
    assert r.returncode == 0 and "removed what 1 interrupted run" in r.stderr, r.stderr[-3000:]
    assert pending_uploads(server, str(server.bucket)) == []
    assert [k for k in server.list_keys(str(server.bucket), "frozen/") if "/run-" in k] == []
