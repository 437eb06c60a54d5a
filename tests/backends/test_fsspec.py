"""The fsspec backend against the conformance suite: memory://, file:// through fsspec, and
S3 through s3fs (s3a://) against the session's MinIO."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from ckptbench.backends import open_backend
from ckptbench.backends.fsspec_backend import FsspecBackend, FsspecOptions
from ckptbench.errors import BackendError
from ckptbench.testing.conformance import BackendConformance
from harness import MinioServer


class TestFsspecMemory(BackendConformance):
    @pytest.fixture
    def target(self) -> str:
        return f"memory://ckpt-{uuid.uuid4().hex[:10]}/t"

    def open(self, target: str) -> FsspecBackend:
        return FsspecBackend(target, FsspecOptions(block_size=5 << 20))

    def _fs(self, target: str) -> Any:
        import fsspec

        return fsspec.filesystem("memory")

    def put_foreign(self, target: str, name: str, data: bytes) -> None:
        self._fs(target).pipe_file(f"{target}/{name}", data)

    def listing(self, target: str) -> list[str]:
        fs = self._fs(target)
        root = fs._strip_protocol(target)
        if not fs.exists(root):
            return []
        return sorted(p[len(root) + 1:] for p in fs.find(root))

    def test_caches_are_off(self, target: str) -> None:
        b = self.open(target)
        assert b.fs is not FsspecBackend(target).fs  # no instance cache
        assert b.read_kwargs["cache_type"] == "none"
        assert b.describe()["caches"] == {"instance": False, "listings": False, "read": "none"}


class TestFsspecFile(BackendConformance):
    @pytest.fixture
    def target(self, tmp_path: Path) -> str:
        return f"file://{tmp_path}/target"

    def open(self, target: str) -> FsspecBackend:
        return FsspecBackend(target)

    def put_foreign(self, target: str, name: str, data: bytes) -> None:
        path = Path(target[len("file://"):]) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def listing(self, target: str) -> list[str]:
        root = Path(target[len("file://"):])
        if not root.exists():
            return []
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    def test_drop_cache_uses_fadvise(self, backend: FsspecBackend) -> None:
        assert backend.drop_cache([]) == "fadvise"


@pytest.mark.s3
class TestFsspecS3fs(BackendConformance):
    """s3fs (s3a://) against MinIO: the same checks through another S3 client."""

    @pytest.fixture
    def target(self, minio_server: MinioServer, monkeypatch: pytest.MonkeyPatch) -> str:
        pytest.importorskip("s3fs")
        for k, v in minio_server.env({}).items():
            monkeypatch.setenv(k, v)
        self.server = minio_server
        self.secrets = (minio_server.access_key, minio_server.secret_key)
        return f"s3a://{minio_server.bucket}/fsspec/{uuid.uuid4().hex[:10]}"

    def open(self, target: str) -> FsspecBackend:
        return FsspecBackend(target, FsspecOptions(endpoint_url=self.server.endpoint,
                                                   block_size=5 << 20))

    def _split(self, target: str) -> tuple[str, str]:
        bucket, _, prefix = target[len("s3a://"):].partition("/")
        return bucket, prefix

    def put_foreign(self, target: str, name: str, data: bytes) -> None:
        bucket, prefix = self._split(target)
        self.server.client().put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)

    def listing(self, target: str) -> list[str]:
        bucket, prefix = self._split(target)
        return sorted(k[len(prefix) + 1:] for k in self.server.list_keys(bucket, prefix + "/"))


def test_open_backend_routes_other_schemes_to_fsspec() -> None:
    # memory:// has a backend of its own (ckptbench.backends.memory); local:// does not
    assert isinstance(open_backend("local:///tmp/x/y", {}), FsspecBackend)


def test_unknown_protocol_is_one_line() -> None:
    with pytest.raises(BackendError, match="allowed"):
        open_backend("nosuchproto://x/y", {})


def test_storage_option_secrets_are_not_recorded() -> None:
    b = FsspecBackend("memory://x/y", FsspecOptions(storage_options={
        "key": "AKIA-SHOULD-NOT-SHOW", "secret": "s3cr3t", "anon": True}))
    text = str(b.describe())
    assert "AKIA-SHOULD-NOT-SHOW" not in text and "s3cr3t" not in text and "anon" in text


def test_local_dir_is_the_path_of_a_local_target_only(tmp_path: Path) -> None:
    """torch DCP writes under local_dir with its own FileSystemWriter: an object store's
    root ("bucket/prefix") is no local directory, so DCP goes through its URL instead."""
    assert FsspecBackend(f"file://{tmp_path}/ck").local_dir == tmp_path / "ck"
    assert FsspecBackend("s3://bucket/prefix").local_dir is None
    assert FsspecBackend("memory://x/y").local_dir is None
