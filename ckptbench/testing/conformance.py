"""What every backend must do, as one test class each backend's tests subclass (needs
pytest; the way zarr.testing ships StoreTests).

A third-party backend passes the same suite the built-in ones do (docs/backends.md):

    from ckptbench.testing.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        ...

A subclass provides four hooks:

* ``target`` fixture: a fresh, not yet existing target (a directory, a bucket prefix, a URL);
* ``open(target)``: the backend for it (not prepared);
* ``put_foreign(target, name, data)``: put a file there the way another program would;
* ``listing(target)``: every file/object name under the target, relative, sorted.

and may set ``secrets`` (strings that must never appear in describe() or in records).
"""

from __future__ import annotations

import json
import mmap
import os
import uuid
from typing import Any, Protocol, runtime_checkable

import pytest

from ckptbench.backends import Backend
from ckptbench.backends.base import TARGET_MARKER, NameTaken, PageCacheControl
from ckptbench.errors import BackendError
from ckptbench.plan import build_plan
from ckptbench.records import JsonlSink
from ckptbench.runner.comm import SingleComm
from ckptbench.runner.driver import RunFailed, run_iterations
from ckptbench.runner.options import RunOptions
from ckptbench.spec import Workload, parse_workload
from ckptbench.testing.forwarding import ForwardingWriteHandle

MIB = 1 << 20


# workloads/tiny.toml, inline: the suite ships without the repository's workload files
TINY_TABLES: dict[str, Any] = {
    "workload": {"name": "tiny"},
    "model": {"name": "custom", "layers": 2, "dim": 256, "heads": 8, "kv_heads": 4,
              "ffn_dim": 688, "vocab_size": 1000},
    "state": {"param_dtype": "float32", "optimizer": "adamw", "optimizer_dtype": "float32"},
    "parallel": {"world_size": 4, "layout": "fsdp2", "tp": 2, "pp": 1, "dp_replicate": 1},
}


def tiny_workload() -> Workload:
    """The tiny workload the runner tests use: 4 ranks, FSDP2 x TP2, about 22 MiB."""
    return parse_workload(TINY_TABLES, name="tiny")


def aligned(n: int) -> memoryview:
    """Page-aligned writable memory, as O_DIRECT needs."""
    return memoryview(mmap.mmap(-1, max(n, mmap.PAGESIZE)))[:n]


def round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def write_object(backend: Backend, key: str, data: bytes, block: int = 1 * MIB) -> None:
    """Write `data` the way the runner does: blocks, padded to the alignment, then sync."""
    align = max(1, backend.alignment)
    block = round_up(block, align)
    buf = aligned(block)
    h = backend.open_write(key, len(data))
    try:
        for off in range(0, len(data), block):
            n = min(block, len(data) - off)
            buf[:n] = data[off:off + n]
            h.write(buf[:round_up(n, align)])
            buf[:n] = b"\xa5" * n  # the runner reuses its buffer: the backend must have copied
        h.sync()
    except BaseException:
        h.abort()
        raise
    h.close()


@runtime_checkable
class RemovesTrees(Protocol):
    """A backend that can delete a whole prefix: a tool of its own, for tests (a run
    deletes only what it wrote, by name); not part of the Backend contract."""

    def remove_tree(self, prefix: str) -> None: ...


def clear(backend: Backend, prefix: str) -> None:
    """Remove what a test wrote under `prefix`: by remove_tree where the backend has one,
    else by name (every name listed there), then the directories they were in, deepest
    first (remove_dir leaves one that is not empty; a store without directories has none)."""
    if isinstance(backend, RemovesTrees):
        backend.remove_tree(prefix)
        return
    names = backend.list_names(prefix, 1 << 20)
    backend.delete(names)
    dirs = {prefix}
    for name in names:
        parent = name.rpartition("/")[0]
        while parent.startswith(f"{prefix}/"):
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    for d in sorted(dirs, key=lambda d: -d.count("/")):
        backend.remove_dir(d)


def read_at(backend: Backend, key: str, offset: int, n: int) -> bytes:
    align = max(1, backend.alignment)
    buf = aligned(round_up(max(n, 1), align))
    h = backend.open_read(key)
    try:
        got = h.readinto(offset, buf[:round_up(n, align)])
    finally:
        h.close()
    return bytes(buf[:min(got, n)])


class BackendConformance:
    secrets: tuple[str, ...] = ()
    big = 12 * MIB + 12345  # more than one S3 part, not a multiple of anything

    # --- hooks ---
    @pytest.fixture
    def target(self) -> str:  # pragma: no cover - each subclass gives one
        raise NotImplementedError

    def open(self, target: str) -> Backend:  # pragma: no cover
        raise NotImplementedError

    def put_foreign(self, target: str, name: str, data: bytes) -> None:  # pragma: no cover
        raise NotImplementedError

    def listing(self, target: str) -> list[str]:  # pragma: no cover
        raise NotImplementedError

    # --- helpers ---
    @pytest.fixture
    def backend(self, target: str) -> Any:
        b = self.open(target)
        b.prepare()
        yield b
        b.release()

    # --- bytes in, bytes out ---
    @pytest.mark.parametrize("size", [1, 4096, 100_003, 3 * MIB + 7])
    def test_write_then_read_whole(self, backend: Backend, size: int) -> None:
        data = os.urandom(size)
        write_object(backend, f"ck/obj-{size}", data, block=1 * MIB)
        assert read_at(backend, f"ck/obj-{size}", 0, size) == data
        clear(backend, "ck")

    def test_multi_block_object_and_offsets(self, backend: Backend) -> None:
        data = os.urandom(self.big)
        write_object(backend, "ck/a/big.bin", data, block=3 * MIB)
        a = max(1, backend.alignment)
        for off, n in [(0, 4096), (a * 5, 2 * MIB), (round_up(5 * MIB + 1, a), 8 * MIB),
                       (0, self.big)]:
            assert read_at(backend, "ck/a/big.bin", off, n) == data[off:off + n], (off, n)
        clear(backend, "ck")

    def test_short_read_at_the_end_and_past_it(self, backend: Backend) -> None:
        data = os.urandom(3 * MIB + 100)
        write_object(backend, "ck/tail", data)
        a = max(1, backend.alignment)
        off = round_up(3 * MIB, a)
        assert read_at(backend, "ck/tail", off, 2 * MIB) == data[off:]
        assert read_at(backend, "ck/tail", round_up(len(data), a) + a, a) == b""
        clear(backend, "ck")

    def test_zero_size_object(self, backend: Backend) -> None:
        h = backend.open_write("ck/empty", 0)
        h.sync()
        h.close()
        assert backend.exists("ck/empty")
        assert backend.get("ck/empty") == b""
        assert read_at(backend, "ck/empty", 0, 4096) == b""
        clear(backend, "ck")

    def test_handles_in_parallel_threads(self, backend: Backend) -> None:
        from concurrent.futures import ThreadPoolExecutor

        blobs = {f"ck/t{i}": os.urandom(2 * MIB + i) for i in range(4)}
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda kv: write_object(backend, kv[0], kv[1], block=MIB),
                          blobs.items()))
        for key, data in blobs.items():
            assert read_at(backend, key, 0, len(data)) == data
        clear(backend, "ck")

    def test_abort_then_clear_leaves_nothing(self, target: str, backend: Backend) -> None:
        h = backend.open_write("ck/partial", self.big)
        buf = aligned(MIB)
        buf[:] = os.urandom(MIB)
        for _ in range(7):
            h.write(buf)
        h.abort()  # the runner then removes the partial checkpoint
        clear(backend, "ck")
        assert not backend.exists("ck/partial")
        assert self.listing(target) == [TARGET_MARKER]

    # --- small objects: the manifest ---
    def test_put_atomic_get_exists(self, backend: Backend) -> None:
        assert not backend.exists("ck/.metadata")
        with pytest.raises(FileNotFoundError):
            backend.get("ck/.metadata")
        doc = json.dumps({"files": list(range(1000))}).encode()
        backend.put_atomic("ck/.metadata", doc)
        assert backend.exists("ck/.metadata")
        assert backend.get("ck/.metadata") == doc
        clear(backend, "ck")
        assert not backend.exists("ck/.metadata")

    # --- removing: only what was asked ---
    def test_remove_tree_removes_only_its_prefix(self, target: str, backend: Backend) -> None:
        if not isinstance(backend, RemovesTrees):
            pytest.skip(f"the {backend.name} backend has no remove_tree (optional)")
        for key in ("run/ckpt-1/a", "run/ckpt-1/sub/b", "run/ckpt-2/c", "run-10/d", "other/e"):
            write_object(backend, key, key.encode())
        backend.remove_tree("run/ckpt-1")
        assert self.listing(target) == sorted([TARGET_MARKER, "other/e", "run-10/d", "run/ckpt-2/c"])
        backend.remove_tree("run")
        assert self.listing(target) == sorted([TARGET_MARKER, "other/e", "run-10/d"])
        backend.remove_tree("does-not-exist")
        backend.remove_tree("run-10")
        backend.remove_tree("other")
        assert self.listing(target) == [TARGET_MARKER]

    # --- removing by name: what a run wrote, never someone else's ---
    def test_create_dir_never_reuses_a_name(self, target: str, backend: Backend) -> None:
        backend.create_dir("run-a")
        write_object(backend, "run-a/ck/x", b"x")
        with pytest.raises(NameTaken) as err:
            backend.create_dir("run-a")
        assert "run-a" in str(err.value) and "\n" not in str(err.value)
        backend.create_dir("run-a-2")  # a name that only starts alike is free
        assert "run-a" in backend.run_dirs()
        backend.delete(["run-a/ck/x"])
        for d in ("run-a/ck", "run-a", "run-a-2"):
            backend.remove_dir(d)
        assert self.listing(target) == [TARGET_MARKER]

    def test_delete_by_name_leaves_foreign_files(self, target: str, backend: Backend) -> None:
        backend.create_dir("run-b")
        for key in ("run-b/ck/a", "run-b/ck/sub/b"):
            write_object(backend, key, key.encode())
        self.put_foreign(target, "run-b/ck/theirs.txt", b"not ours")
        self.put_foreign(target, "run-b/ck/sub/c", b"not ours either")
        backend.delete(["run-b/ck/a", "run-b/ck/sub/b", "run-b/ck/never-written"])
        for d in ("run-b/ck/sub", "run-b/ck", "run-b"):
            backend.remove_dir(d)  # none is empty: all stay
        assert self.listing(target) == sorted([TARGET_MARKER, "run-b/ck/sub/c",
                                               "run-b/ck/theirs.txt"])
        assert sorted(backend.list_names("run-b", 10)) == ["run-b/ck/sub/c", "run-b/ck/theirs.txt"]
        assert len(backend.list_names("run-b", 1)) == 1
        clear(backend, "run-b")

    # --- the target: ours or refused ---
    def test_prepare_adopts_a_new_target_and_release_undoes_it(self, target: str) -> None:
        b = self.open(target)
        b.prepare()
        assert self.listing(target) == [TARGET_MARKER]
        b.release()
        assert self.listing(target) == []

    def test_prepare_refuses_foreign_content_and_touches_nothing(self, target: str) -> None:
        self.put_foreign(target, "precious.bin", b"not ours")
        b = self.open(target)
        with pytest.raises(BackendError) as err:
            b.prepare()
        msg = str(err.value)
        assert "precious.bin" in msg and "allowed" in msg and "\n" not in msg
        b.release()
        assert self.listing(target) == ["precious.bin"]

    def test_prepare_adopts_a_target_ckptbench_marked(self, target: str) -> None:
        first = self.open(target)
        first.prepare()
        write_object(first, "kept/x", b"x" * 10)
        second = self.open(target)
        second.prepare()  # marked before: ours, even with content
        second.release()  # did not create it: leaves the marker
        assert self.listing(target) == sorted([TARGET_MARKER, "kept/x"])
        first.release()  # created it, but content is left: keeps the marker
        assert TARGET_MARKER in self.listing(target)
        clear(first, "kept")
        first.release()
        assert self.listing(target) == []

    # --- what is recorded ---
    def test_describe_and_stats(self, backend: Backend) -> None:
        d = backend.describe()
        text = json.dumps(d, default=str)
        assert d["backend"] == backend.name and d["target"] == backend.target
        for secret in self.secrets:
            assert secret not in text
        stats = backend.stats()
        assert isinstance(stats, dict) and all(isinstance(v, int) for v in stats.values())
        if isinstance(backend, PageCacheControl):
            assert isinstance(backend.drop_cache([]), str)

    # --- the runner on this backend: plan, manifest last, verification, records ---
    def run_tiny(self, backend: Backend, tmp_path: Any, iterations: int = 2,
                 **options: Any) -> list[dict[str, Any]]:
        plan = build_plan(tiny_workload())
        ranks = list(range(plan.world_size))
        writer = JsonlSink(tmp_path / f"r-{uuid.uuid4().hex[:6]}.jsonl")
        writer.open()
        opts = RunOptions(iterations=iterations, threads=2, run_id="run-conf",
                          block_size=MIB, prefill_bytes=8 * MIB, **options)
        try:
            run_iterations(plan, ranks, ranks, backend, SingleComm(), opts, writer)
        finally:
            writer.close()
        return [json.loads(line) for line in writer.path.read_text().splitlines() if line]

    def test_runner_round_trip_verified(self, target: str, backend: Backend, tmp_path: Any) -> None:
        recs = self.run_tiny(backend, tmp_path)
        phases = [r for r in recs if r["type"] == "phase"]
        assert [(p["iteration"], p["phase"], p["ok"]) for p in phases] == [
            (1, "save", True), (1, "restore", True), (2, "save", True), (2, "restore", True)]
        assert all(p["verified"] for p in phases if p["phase"] == "restore")
        assert any(r["type"] == "op" and r["op"] == "commit" for r in recs)
        ranks = [r for r in recs if r["type"] == "rank" and r["phase"] == "save"]
        assert sum(r["bytes"] for r in ranks) == 2 * build_plan(tiny_workload()).total_bytes
        assert self.listing(target) == [TARGET_MARKER]  # checkpoints deleted after the run
        text = json.dumps(recs)
        for secret in self.secrets:
            assert secret not in text

    def test_runner_failed_save_leaves_no_manifest(self, target: str, backend: Backend,
                                                    tmp_path: Any) -> None:
        real_open = backend.open_write
        calls = {"n": 0}

        class Failing(ForwardingWriteHandle):
            def write(self, data: memoryview) -> None:
                raise BackendError("injected: the store went away")

        def open_write(key: str, size: int) -> Any:
            calls["n"] += 1
            h = real_open(key, size)
            return Failing(h) if "checkpoint-2" in key and calls["n"] % 2 == 0 else h

        backend.open_write = open_write  # type: ignore[method-assign]
        with pytest.raises(RunFailed) as err:
            self.run_tiny(backend, tmp_path, iterations=3, keep=True)
        assert "injected" in str(err.value)
        names = self.listing(target)
        assert not any("checkpoint-2" in n for n in names), names  # removed, never committed
        assert "run-conf/checkpoint-1/.metadata" in names  # the earlier one is intact (--keep)
        assert not any("checkpoint-3" in n for n in names)
        clear(backend, "run-conf")
