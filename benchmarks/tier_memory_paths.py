#!/usr/bin/env python3
"""Where a memory-tier copy can live on this host, and what reading or writing it costs
next to a plain copy: ratios of medians, every process at once.

The memory tier's bars (issue #32) compare a node copy's write (blocking) and its read
(a process restart) with ``np.copyto`` between two buffers written before the clock (the
C library's memcpy; numpy asks for transparent huge pages for such buffers). This probe
times, in the same processes and rounds (the order reversed every round), the ways a copy
that outlives the training process can be held:

- ``tmpfs read``: one ``read()`` of a ``/dev/shm`` file into the restored state (what
  ``runner.tier_store.read_copy`` does); ``tmpfs read 1MiB``: the same in 1 MiB reads;
- ``tmpfs map+populate``: the file mapped with ``MAP_POPULATE`` (the page table filled in
  one call), then memcpy; ``tmpfs premapped``: memcpy from a mapping made before the clock;
- ``agent pull``: a per-node agent process holds the copy in anonymous memory with
  ``MADV_HUGEPAGE``; the restarted process copies it out with ``process_vm_readv``;
- blocking: memcpy into a ``/dev/shm`` mapping whose pages were allocated before the
  clock (what the memory tier's write does), and ``agent push``: ``process_vm_writev``
  into the agent's huge-page memory.

Every restored byte is compared with the source after the last round.

    python benchmarks/tier_memory_paths.py --processes 8 --mib 45 --rounds 7
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tier_speed import at_once

HUGE = 2 << 20
LIBC = ctypes.CDLL("libc.so.6", use_errno=True)


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


for _name in ("process_vm_readv", "process_vm_writev"):
    _fn = getattr(LIBC, _name)
    _fn.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_ulong,
                    ctypes.POINTER(IoVec), ctypes.c_ulong, ctypes.c_ulong]
    _fn.restype = ctypes.c_ssize_t


def anon(nbytes: int, huge: bool) -> tuple[mmap.mmap, np.ndarray]:
    """`nbytes` of private anonymous memory, 2 MiB aligned, every page written."""
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(m, dtype=np.uint8)
    off = (-a.ctypes.data) % HUGE
    a = a[off:off + nbytes]
    a.fill(1)
    return m, a


def vm_copy(write: bool, pid: int, remote: int, local: np.ndarray) -> None:
    """`local` from (or to) address `remote` of process `pid`, whatever the kernel takes
    per call."""
    fn = LIBC.process_vm_writev if write else LIBC.process_vm_readv
    at, n = 0, local.nbytes
    base = local.ctypes.data
    while at < n:
        lv, rv = IoVec(base + at, n - at), IoVec(remote + at, n - at)
        got = fn(pid, ctypes.byref(lv), 1, ctypes.byref(rv), 1, 0)
        if got <= 0:
            raise OSError(ctypes.get_errno(), f"{fn.__name__} after {at} of {n} bytes")
        at += got


def agent(nbytes: int, conn: Connection) -> None:
    """A node's agent: holds a copy in huge-page anonymous memory until told to go."""
    _m, held = anon(nbytes, huge=True)
    conn.send((os.getpid(), held.ctypes.data))
    conn.recv()


def _time_steps(steps: dict[str, Callable[[], None]], rounds: int, bar: Any,
                same: Callable[[], bool]) -> dict[str, list[float]] | None:
    """Each step's seconds per round, every process at once (order reversed every round);
    None when a read's bytes differ from the source after the last round."""
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            bar.wait()
            t = time.perf_counter()
            steps[n]()
            times[n].append(time.perf_counter() - t)
            if r == rounds - 1 and not n.startswith(("write", "copy")) and not same():
                return None
    return times


def _worker(i: int, nbytes: int, rounds: int, directory: str, pid: int, addr: int,
            bar: Any, q: Any) -> None:
    src = np.empty(nbytes, np.uint8)  # the state, as numpy allocates it
    src[:] = np.frombuffer(np.random.default_rng(i).bytes(nbytes), np.uint8)
    dst = np.empty(nbytes, np.uint8)
    dst.fill(1)
    path = f"{directory}/ckptbench-memprobe-{os.getpid()}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        wmap = mmap.mmap(fd, nbytes)  # unmapped when the process ends
        wview = np.frombuffer(wmap, np.uint8)
        wview.fill(0)
        np.copyto(wview, src)
        vm_copy(True, pid, addr, src)

        def read_all(piece: int) -> None:
            with open(path, "rb", buffering=0) as f:
                got, mv = 0, dst.data
                while got < nbytes:
                    got += f.readinto(mv[got:got + piece])

        def map_copy() -> None:
            with mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                           prot=mmap.PROT_READ) as m:
                v = np.frombuffer(m, np.uint8)
                np.copyto(dst, v)
                del v

        steps: dict[str, Callable[[], None]] = {
            "copy": lambda: np.copyto(dst, src),
            "tmpfs read": lambda: read_all(nbytes),
            "tmpfs read 1MiB": lambda: read_all(1 << 20),
            "tmpfs map+populate": map_copy,
            "tmpfs premapped": lambda: np.copyto(dst, wview),
            "agent pull": lambda: vm_copy(False, pid, addr, dst),
            "write: tmpfs mapping": lambda: np.copyto(wview, src),
            "write: agent push": lambda: vm_copy(True, pid, addr, src),
        }
        times = _time_steps(steps, rounds, bar, lambda: np.array_equal(dst, src))
        if times is None:
            raise SystemExit(f"process {i}: a path restored other bytes")
    finally:
        os.close(fd)
        os.unlink(path)
    q.put({n: statistics.median(v) for n, v in times.items()})


def mount_options(directory: str) -> str:
    """The options of the mount `directory` is on (a tmpfs's ``huge=`` among them)."""
    best, options = "", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, _, opts, *_ = line.split()
        if (directory + "/").startswith(point.rstrip("/") + "/") and len(point) > len(best):
            best, options = point, opts
    return options


def probe(processes: int, nbytes: int, rounds: int, directory: str = "/dev/shm"
          ) -> dict[str, float]:
    """Median over processes of each one's median seconds."""
    pipes, agents = [], []
    for _ in range(processes):
        mine, theirs = mp.Pipe()
        a = mp.Process(target=agent, args=(nbytes, theirs))
        a.start()
        pipes.append(mine)
        agents.append(a)
    where = [p.recv() for p in pipes]
    med = at_once(_worker, [(i, nbytes, rounds, directory, *where[i])
                            for i in range(processes)])
    for c, a in zip(pipes, agents, strict=True):
        c.send(None)
        a.join()
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--mib", type=int, default=45, help="one process's shard (scale 16)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=1, help="probes, each a fresh set")
    ap.add_argument("--dir", default="/dev/shm", help="where the copy's file lives (a tmpfs; "
                    "one mounted with huge=always holds it in 2 MiB pages)")
    a = ap.parse_args()
    thp = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read_text().strip()
    print(f"shmem_enabled: {thp}; {a.dir}: {mount_options(a.dir)}; "
          f"{a.processes} processes x {a.mib} MiB, {a.rounds} rounds")
    for _ in range(a.repeat):
        load0 = os.getloadavg()[0]
        med = probe(a.processes, a.mib << 20, a.rounds, a.dir)
        load = f"load {load0:.1f}-{os.getloadavg()[0]:.1f}"
        base = med["copy"]
        for n, s in med.items():
            if n.startswith("write"):
                print(f"  {n:22s} {s * 1e3:7.1f} ms  time / copy {s / base:.2f}  ({load})")
            else:
                print(f"  {n:22s} {s * 1e3:7.1f} ms  copy / time {base / s:.2f}  ({load})")


if __name__ == "__main__":
    main()
