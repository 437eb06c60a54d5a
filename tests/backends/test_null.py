"""The null backend: writes counted and dropped (the harness's save ceiling), restores
refused in one line before a run starts; `ckptbench run --target null://` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptbench.backends import open_backend
from ckptbench.backends.null import NullBackend
from ckptbench.errors import BackendError
from ckptbench.plan import build_plan
from ckptbench.spec import load_workload
from ckptbench.testing.conformance import MIB, aligned, write_object

from . import TINY


def ckptbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_writes_are_counted_and_dropped() -> None:
    b = open_backend("null://ceiling")
    assert isinstance(b, NullBackend)
    b.prepare()
    write_object(b, "ck/a", os.urandom(3 * MIB + 5), block=MIB)
    assert b.stats() == {"writes": 4, "bytes_discarded": 3 * MIB + 5}
    assert b.stats() == {"writes": 0, "bytes_discarded": 0}  # reset by the call
    assert not b.exists("ck/a")
    with pytest.raises(BackendError, match="keeps nothing to read; allowed: --no-restore"):
        b.open_read("ck/a")
    b.create_shared("ck/shared", 2 * MIB)  # N-1 patterns run too
    h = b.open_write_region("ck/shared", MIB, MIB, 2 * MIB)
    h.write(aligned(MIB))
    h.sync()
    h.close()
    assert b.stats()["bytes_discarded"] == MIB
    b.release()


def test_small_objects_are_kept_for_the_commit() -> None:
    b = NullBackend("null://")
    b.put_atomic("run/ck-1/.metadata", b"{}")
    b.put_atomic("run-10/x", b"y")
    assert b.exists("run/ck-1/.metadata") and b.get("run/ck-1/.metadata") == b"{}"
    b.remove_tree("run")
    assert not b.exists("run/ck-1/.metadata") and b.get("run-10/x") == b"y"
    with pytest.raises(FileNotFoundError):
        b.get("run/ck-1/.metadata")
    assert b.describe()["backend"] == "null" and "nothing" in b.describe()["kept"]


def test_restores_and_foreign_targets_are_refused_in_one_line() -> None:
    b = NullBackend("null://")
    with pytest.raises(BackendError, match="keeps nothing to restore; allowed: --no-restore"):
        b.check_run(shared_file=True, restore=True, processes=4)
    b.check_run(shared_file=True, restore=False, processes=4)
    with pytest.raises(BackendError, match="allowed: null://"):
        NullBackend("/tmp/x")


def test_run_tiny_saves_on_null(tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(TINY), "--target", "null://", "--no-restore", "--iterations", "2",
                  "--results", str(results), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    assert recs[0]["environment"]["target"]["backend"] == "null"
    save = next(s for s in recs if s["type"] == "summary" and s["phase"] == "save")
    total = build_plan(load_workload(TINY)).total_bytes
    assert save["iterations"] == 2 and save["bytes"] == total
    ranks = [x for x in recs if x["type"] == "rank" and x["iteration"] == 1]
    assert sum(x["backend"]["bytes_discarded"] for x in ranks) == total
    assert [(p["iteration"], p["ok"]) for p in recs if p["type"] == "phase"] == [(1, True),
                                                                                (2, True)]
    assert not any(s["phase"] == "restore" for s in recs if s["type"] == "summary")


def test_run_on_null_without_no_restore_is_one_line(tmp_path: Path) -> None:
    r = ckptbench("run", str(TINY), "--target", "null://", "--results",
                  str(tmp_path / "r.jsonl"), cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "allowed: --no-restore" in lines[0], r.stderr
    assert not (tmp_path / "r.jsonl").exists()
