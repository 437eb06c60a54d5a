"""The local/POSIX backend against the conformance suite: buffered + fsync, and O_DIRECT."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptbench.backends.local import LocalBackend, LocalOptions
from ckptbench.errors import BackendError
from ckptbench.testing.conformance import BackendConformance


def _files(root: Path) -> list[str]:
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


class LocalConformance(BackendConformance):
    io = "buffered"

    @pytest.fixture
    def target(self, tmp_path: Path) -> str:
        return str(tmp_path / "target")

    def open(self, target: str) -> LocalBackend:
        return LocalBackend(target, LocalOptions(io=self.io))

    def put_foreign(self, target: str, name: str, data: bytes) -> None:
        path = Path(target) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def listing(self, target: str) -> list[str]:
        return _files(Path(target))


class TestLocalBuffered(LocalConformance):
    io = "buffered"


class TestLocalDirect(LocalConformance):
    io = "direct"

    @pytest.fixture
    def target(self, tmp_path: Path) -> str:
        probe = tmp_path / "probe"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
            os.close(fd)
        except OSError:
            pytest.skip(f"{tmp_path}: no O_DIRECT on this file system")
        finally:
            probe.unlink(missing_ok=True)
        return str(tmp_path / "target")

    def test_alignment_is_declared(self, target: str) -> None:
        assert self.open(target).alignment == 4096


def test_unknown_io_mode_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="allowed: buffered, direct"):
        LocalBackend(str(tmp_path), LocalOptions(io="mmap"))
