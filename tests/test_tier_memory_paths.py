"""benchmarks/tier_memory_paths.py: every way to hold a memory-tier copy, timed next to a
plain copy, runs end to end on small sizes, verifies what it restores and leaves nothing
in /dev/shm."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

from benchmarks.tier_memory_paths import _time_steps, vm_copy

ROOT = Path(__file__).resolve().parent.parent
PATHS = ("copy", "tmpfs read", "tmpfs read 1MiB", "tmpfs map+populate", "tmpfs premapped",
         "agent pull", "write: tmpfs mapping", "write: agent push")


def test_every_path_is_timed_next_to_the_copy_and_nothing_is_left() -> None:
    shm = Path(tempfile.mkdtemp(prefix="ckb-memprobe-test-", dir="/dev/shm"))
    try:
        out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tier_memory_paths.py"),
                              "--processes", "2", "--mib", "4", "--rounds", "2",
                              "--dir", str(shm)], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        left = os.listdir(shm)
    finally:
        shutil.rmtree(shm)
    assert out.returncode == 0, out.stderr
    assert f"{shm}: rw" in out.stdout  # the mount of the directory the copies were in
    for name in PATHS:
        row = re.search(rf"^  {re.escape(name)}\s+[\d.]+ ms  (copy / time|time / copy) "
                        r"([\d.]+)  \(load ", out.stdout, re.M)
        assert row, (name, out.stdout)
    assert re.search(r"^  copy\s+[\d.]+ ms  copy / time 1\.00 ", out.stdout, re.M)
    assert left == []


def test_process_vm_copies_move_the_bytes_both_ways() -> None:
    src = np.frombuffer(np.random.default_rng(1).bytes(3 << 20), np.uint8).copy()
    dst = np.zeros_like(src)
    vm_copy(False, os.getpid(), src.ctypes.data, dst)  # read from "the agent"
    assert np.array_equal(dst, src)
    back = np.zeros_like(src)
    vm_copy(True, os.getpid(), back.ctypes.data, src)  # write into it
    assert np.array_equal(back, src)


def test_a_path_that_restores_other_bytes_is_caught() -> None:
    dst, src = np.zeros(16, np.uint8), np.ones(16, np.uint8)
    steps = {"copy": lambda: np.copyto(dst, src), "tmpfs read": lambda: dst.fill(7)}
    bar = threading.Barrier(1)
    assert _time_steps(steps, 2, bar, lambda: np.array_equal(dst, src)) is None
    ok = {"copy": lambda: np.copyto(dst, src), "tmpfs read": lambda: np.copyto(dst, src)}
    times = _time_steps(ok, 2, bar, lambda: np.array_equal(dst, src))
    assert times is not None and [len(v) for v in times.values()] == [2, 2]


FAILING = """
from benchmarks.tier_speed import at_once

def probe(i, bar, q):
    if i == 1:
        raise SystemExit("process 1: a path restored other bytes")
    bar.wait()  # for a process that is gone
    q.put({"copy": 1.0})

at_once(probe, [(0,), (1,)])
"""


def test_a_probe_process_that_fails_ends_the_probe() -> None:
    """A process that exits without its figures (a path restored other bytes) ends the
    probe, never leaves it waiting for them, nor its other processes at the barrier."""
    out = subprocess.run([sys.executable, "-c", FAILING], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    assert "process 1: a path restored other bytes" in out.stderr
    assert "a probe process ended with exit code 1" in out.stderr
