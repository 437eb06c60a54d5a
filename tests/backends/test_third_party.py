"""A backend written outside ckptbench, with the Backend core only (four methods and
its handles; no optional capability): it passes the shipped conformance suite (ckptbench.testing.conformance, as
docs/backends.md tells a third party to run it), and a run that needs a capability it
lacks is refused at set-up, in one line, before anything is written."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence

import pytest

from ckptbench.backends import Backend, ReadHandle, WriteHandle
from ckptbench.errors import BackendError
from ckptbench.testing.conformance import BackendConformance

STORES: dict[str, dict[str, bytes]] = {}
LOCK = threading.Lock()


class _Writer(WriteHandle):
    def __init__(self, objects: dict[str, bytes], key: str, size: int) -> None:
        self.objects, self.key, self.size, self.parts = objects, key, size, bytearray()

    def write(self, data: memoryview) -> None:
        self.parts += data

    def sync(self) -> None:
        with LOCK:
            self.objects[self.key] = bytes(self.parts[:self.size])

    def close(self) -> None:
        pass


class _Reader(ReadHandle):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def readinto(self, offset: int, buf: memoryview) -> int:
        piece = self.data[offset:offset + len(buf)]
        buf[:len(piece)] = piece
        return len(piece)

    def close(self) -> None:
        pass


class DictBackend(Backend):
    """dict://NAME: objects in a dict of this process; the Backend core only (open for
    write and read, delete, list): the target marker, small objects and the run
    directories come from Backend's defaults built on it."""

    name = "dict"

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.objects = STORES.setdefault(target, {})

    def open_write(self, key: str, size: int) -> WriteHandle:
        if key in self.objects:
            raise BackendError(f"{self.target}/{key}: already exists")
        return _Writer(self.objects, key, size)

    def open_read(self, key: str) -> ReadHandle:
        if key not in self.objects:
            raise FileNotFoundError(f"{self.target}/{key}")
        return _Reader(self.objects[key])

    def delete(self, keys: Sequence[str]) -> None:
        with LOCK:
            for key in keys:
                self.objects.pop(key, None)

    def list_names(self, prefix: str, limit: int) -> list[str]:
        base = prefix.strip("/")
        return sorted(k for k in self.objects if not base or k.startswith(base + "/"))[:limit]


class TestThirdParty(BackendConformance):
    @pytest.fixture
    def target(self) -> str:
        return f"dict://{uuid.uuid4().hex[:10]}"

    def open(self, target: str) -> Backend:
        return DictBackend(target)

    def put_foreign(self, target: str, name: str, data: bytes) -> None:
        STORES.setdefault(target, {})[name] = data

    def listing(self, target: str) -> list[str]:
        return sorted(STORES.get(target, {}))


def test_a_run_needing_n_1_writes_is_refused_at_set_up_in_one_line() -> None:
    backend = DictBackend(f"dict://{uuid.uuid4().hex[:10]}")
    with pytest.raises(BackendError) as err:
        backend.check_run(shared_file=True, restore=True, processes=1)
    message = str(err.value)
    assert "files = 'shared'" in message and "allowed" in message and "\n" not in message
    backend.check_run(shared_file=False, restore=True, processes=1)  # the rest runs


def test_the_backend_core_is_four_methods_and_the_handles() -> None:
    assert Backend.__abstractmethods__ == {"open_write", "open_read", "delete", "list_names"}
    assert WriteHandle.__abstractmethods__ == {"write", "sync", "close"}
    assert ReadHandle.__abstractmethods__ == {"readinto", "close"}
