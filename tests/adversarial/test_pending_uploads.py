"""Unfinished uploads are never forgotten (issue 29, family 7: the intent's side).

A run whose store does not answer its aborts (a frozen MinIO) used to remove its intent
anyway and record `left: []`: nothing could find the multipart upload left in flight.
Now the uploads are checked after the aborts, and while any is pending (or the store
cannot say), the intent stays, the cleanup record says so, and a later --clean-debris
finds the upload by the names the intent recorded and aborts it. A real MinIO.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from ckptbench.backends import open_backend
from ckptbench.errors import BackendError, RunFailed
from ckptbench.measure import measure
from ckptbench.plan import build_plan
from ckptbench.runner import RunOptions, RunRequest
from ckptbench.runner.launch_local import LocalLauncher
from ckptbench.spec import load_workload
from harness import MinioServer

from .lifecycle import TINY, records

MIB = 1 << 20
INTENT = ".ckptbench-run"


class FrozenAborts:
    """Forwards to an S3 backend. At the restore, an upload of the checkpoint's first
    file is in flight (as a writer stopped mid-upload leaves it), the read fails, and the
    store answers no abort."""

    def __init__(self, inner: Any, client: Any, bucket: str, prefix: str) -> None:
        self._inner, self._client, self._bucket, self._prefix = inner, client, bucket, prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def open_read(self, key: str) -> Any:
        self._client.create_multipart_upload(Bucket=self._bucket, Key=f"{self._prefix}/{key}")
        raise BackendError(f"{key}: the store stopped answering")

    def open_read_planned(self, key: str, spans: Any) -> Any:
        return self.open_read(key)

    def abort_uploads(self, keys: Any) -> int:
        return 0


def _request(backend: Any, run_id: str, **options: Any) -> RunRequest:
    workload = load_workload(TINY)
    return RunRequest(workload=workload, plan=build_plan(workload), ranks=[0], backend=backend,
                      options=RunOptions(iterations=1, run_id=run_id, block_size=MIB,
                                         prefill_bytes=4 * MIB, **options))


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_an_upload_the_store_would_not_abort_is_found_by_clean_debris(
        minio_server: MinioServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in minio_server.env({}).items():
        monkeypatch.setenv(k, v)
    assert minio_server.bucket
    bucket, prefix = minio_server.bucket, f"adv-pending/{uuid.uuid4().hex[:10]}"
    client = minio_server.client()
    target, opts = f"s3://{bucket}/{prefix}", {"endpoint_url": minio_server.endpoint}

    def pending() -> list[str]:
        ups = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        return [u["Key"] for u in ups if u["Key"].startswith(prefix + "/")]

    backend = FrozenAborts(open_backend(target, opts), client, bucket, prefix)
    results = tmp_path / "r.jsonl"
    with pytest.raises(RunFailed, match="stopped answering"):
        measure(_request(backend, "run-frozen"), results, LocalLauncher(in_process=True))
    assert len(pending()) == 1
    (cleanup,) = [r for r in records(results) if r["type"] == "cleanup"]
    assert any("unfinished upload" in n for n in cleanup["left"]), cleanup
    intent_key = f"{prefix}/run-frozen/{INTENT}"
    intent = json.loads(client.get_object(Bucket=bucket, Key=intent_key)["Body"].read())
    intent["pid"] = _dead_pid()  # the run that left it has ended (it was this process)
    client.put_object(Bucket=bucket, Key=intent_key, Body=json.dumps(intent).encode())

    again = tmp_path / "a.jsonl"
    measure(_request(open_backend(target, opts), "run-next", clean_debris=True), again,
            LocalLauncher(in_process=True))
    debris = records(again)[0]["debris"]
    assert debris["runs"] == ["run-frozen"] and debris["pending_uploads"] == 1
    assert pending() == []
    assert minio_server.list_keys(bucket, prefix + "/run-frozen/") == []
