"""The memory backend: the conformance suite in one process, one-process runs end to end,
and runs of several processes refused in one line before they start."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ckptbench.backends import open_backend
from ckptbench.backends.memory import STORES, MemoryBackend
from ckptbench.errors import BackendError
from ckptbench.plan import build_plan
from ckptbench.spec import load_workload
from ckptbench.testing.conformance import BackendConformance

from . import TINY


class TestMemory(BackendConformance):
    @pytest.fixture
    def target(self) -> str:
        return f"memory://ckpt-{uuid.uuid4().hex[:10]}"

    def open(self, target: str) -> MemoryBackend:
        return MemoryBackend(target)

    def put_foreign(self, target: str, name: str, data: bytes) -> None:
        STORES.setdefault(target.removeprefix("memory://"), {})[name] = data

    def listing(self, target: str) -> list[str]:
        return sorted(STORES.get(target.removeprefix("memory://"), {}))

    def test_shared_object_regions(self, backend: MemoryBackend) -> None:
        backend.create_shared("ck/one", 10)
        for offset, text in ((0, b"hello"), (5, b"world")):
            h = backend.open_write_region("ck/one", offset, 5, 10)
            h.write(memoryview(text))
            h.sync()
            h.close()
        assert backend.get("ck/one") == b"helloworld"
        with pytest.raises(BackendError, match="never overwrites"):
            backend.create_shared("ck/one", 10)
        backend.remove_tree("ck")


def test_routing_and_bad_targets() -> None:
    assert isinstance(open_backend("memory://x"), MemoryBackend)
    with pytest.raises(BackendError, match="allowed: memory://NAME"):
        MemoryBackend("memory://")


def test_several_processes_are_refused_in_one_line() -> None:
    b = MemoryBackend("memory://x")
    with pytest.raises(BackendError) as err:
        b.check_run(shared_file=False, restore=True, processes=4)
    assert "keeps its bytes in one process and this run has 4; allowed: one rank" in str(err.value)
    b.check_run(shared_file=True, restore=True, processes=1)


def ckptbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_run_one_rank_on_memory(tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(TINY), "--target", "memory://tiny", "--ranks", "1",
                  "--iterations", "2", "--results", str(results), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    assert recs[0]["environment"]["target"]["backend"] == "memory"
    phases = [(p["iteration"], p["phase"], p["ok"]) for p in recs if p["type"] == "phase"]
    assert phases == [(1, "save", True), (1, "restore", True), (2, "save", True),
                      (2, "restore", True)]
    assert all(p["verified"] for p in recs if p["type"] == "phase" and p["phase"] == "restore")
    save = next(s for s in recs if s["type"] == "summary" and s["phase"] == "save")
    assert save["bytes"] == build_plan(load_workload(TINY)).bytes_of_ranks([1])


def test_run_of_several_ranks_on_memory_is_one_line(tmp_path: Path) -> None:
    r = ckptbench("run", str(TINY), "--target", "memory://tiny", "--results",
                  str(tmp_path / "r.jsonl"), cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "allowed: one rank" in lines[0], r.stderr
    assert not (tmp_path / "r.jsonl").exists()
