#!/usr/bin/env python3
"""Recovery tiers against their physical limits, repeated: the ratios of medians.

Each run (`ckptbench run --tiers memory,peer,storage`, a fresh process) measures every
tier next to its reference in the same run, every process at once:

- memory blocking over a plain copy of the same bytes (``np.copyto`` between two buffers
  written before the clock: the C library's memcpy);
- peer replication bandwidth over a plain transfer of the same bytes over the same
  transport (TCP, from and into memory of the shard's size written before the clock);
- process restart (memory): a plain copy's seconds over the read's (bandwidth ratio);
- node restart (peers): a plain transfer from the same holder over the fetch;
- the storage restore of a checkpoint of the same run, in seconds.

The configurations run in turn, their order reversed every round (A B C C B A ...), so a
machine whose load drifts slows each alike; the load average is printed beside each run.
``--probe`` first times, 8 processes at once, a plain copy, a ``read`` of a /dev/shm file
and a mapped copy of it: what this host's kernel allows a restarted process.
``--async-rounds N`` runs ``--mode async --tiers peer,storage`` N times (2 nodes): the
replication in the background over its plain transfer, and the training steps beside it
over the baseline steps.

    python benchmarks/tier_speed.py --rounds 3 --scale 16 --dir /tmp/tierspeed --probe \
        --async-rounds 2
    python benchmarks/tier_speed.py --rounds 4 --huge-tmpfs 4g   # copies in 2 MiB pages
    python benchmarks/tier_speed.py --rounds 4 --huge-tmpfs 4g --restore-layout world_size=8,tp=2
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptbench.records import read_records
from ckptbench.report.tiers import summarize_tiers

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = "workloads/llama3-8b-fsdp2-8.toml"


def _ckptbench(args: list[str], workdir: Path, tag: str
               ) -> tuple[dict[tuple[str, str], dict[str, Any]], tuple[float, float]]:
    """One `ckptbench run` (a fresh process): its tier summaries and the load around it."""
    target, results = workdir / "t", workdir / f"{tag}.jsonl"
    shutil.rmtree(target, ignore_errors=True)
    load0 = os.getloadavg()[0]
    subprocess.run([sys.executable, "-m", "ckptbench", "run", WORKLOAD, "--target", str(target),
                    "--results", str(results), "--json", *args],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "CKPTBENCH_PROGRESS": "off"})
    recs = list(read_records(str(results)))
    rows = {(r["type"], r.get("tier") or r.get("scenario")): r for r in summarize_tiers(recs)}
    rows[("async", "")] = next((r for r in recs if r.get("type") == "async_summary"), {})
    return rows, (load0, os.getloadavg()[0])


def async_run(rpn: int, scale: int, workdir: Path, tag: str) -> dict[str, Any]:
    """--mode async with the peer tier in the background: replication over its plain
    transfer, and the steps beside it over the baseline steps."""
    rows, load = _ckptbench(["--scale", str(scale), "--mode", "async", "--tiers", "peer,storage",
                             "--ranks-per-node", str(rpn), "--iterations", "3",
                             "--step-seconds", "0.5", "--steps-per-checkpoint", "4"],
                            workdir, tag)
    peer = rows[("tier_summary", "peer")]
    return {"nodes": 8 // rpn, "load": load, "peer_bw": 1 / peer["over_baseline"],
            "steps_beside_replication": peer.get("interference"),
            "async_interference": rows[("async", "")].get("interference"),
            "node_restore_peer_bw": 1 / rows[("tier_restore_summary", "node")]
            ["over_baseline"]["peer"]}


def _bw(ratios: dict[str, float], tier: str) -> float | None:
    """A restart's bandwidth over its baseline's, for the processes `tier` served (None:
    it served none; a resharded restart can be served by the other tier alone)."""
    return 1 / ratios[tier] if tier in ratios else None


def one_run(cfg: tuple[int, int], scale: int, iterations: int, workdir: Path, tag: str,
            memory_dir: str | None = None, restore_layout: str | None = None
            ) -> dict[str, Any]:
    rpn, k = cfg
    rows, (load0, load1) = _ckptbench(
        ["--scale", str(scale), "--tiers", "memory,peer,storage", "--ranks-per-node", str(rpn),
         "--peer-replicas", str(k), "--iterations", str(iterations), "--storage-every", "2",
         *(["--memory-dir", memory_dir] if memory_dir else []),
         *(["--restore-layout", restore_layout] if restore_layout else [])],
        workdir, tag)
    mem, peer = rows[("tier_summary", "memory")], rows[("tier_summary", "peer")]
    proc, node = rows[("tier_restore_summary", "process")], rows[("tier_restore_summary", "node")]
    storage = rows[("tier_restore_summary", "storage")]
    return {"nodes": 8 // rpn, "k": k, "load": (load0, load1),
            "memory_x_copy": mem["over_baseline"],
            "peer_bw": 1 / peer["over_baseline"],
            "restore_memory_bw": _bw(proc["over_baseline"], "memory"),
            "restore_peer_bw": _bw(node["over_baseline"], "peer"),
            "process_peer_bw": _bw(proc["over_baseline"], "peer"),
            "process_s": proc["seconds"], "node_s": node["seconds"],
            "storage_s": storage["seconds"]}


def _probe_one(i: int, nbytes: int, repeat: int, bar: Any, q: Any) -> None:
    src = np.empty(nbytes, np.uint8)
    src.fill(i)
    dst = np.empty(nbytes, np.uint8)
    dst.fill(1)
    path = f"/dev/shm/ckptbench-tierspeed-probe-{os.getpid()}.bin"
    with open(path, "wb") as f:
        f.write(src.data)
    out: dict[str, list[float]] = {"copy": [], "read": [], "map+copy": []}
    try:
        for _ in range(repeat):
            bar.wait()
            t = time.perf_counter()
            np.copyto(dst, src)
            out["copy"].append(time.perf_counter() - t)
            bar.wait()
            t = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                f.readinto(dst.data)
            out["read"].append(time.perf_counter() - t)
            bar.wait()
            fd = os.open(path, os.O_RDONLY)
            t = time.perf_counter()
            with mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                           prot=mmap.PROT_READ) as m:
                view = np.frombuffer(m, np.uint8)
                np.copyto(dst, view)
                del view
            out["map+copy"].append(time.perf_counter() - t)
            os.close(fd)
    finally:
        os.unlink(path)
    q.put({k: statistics.median(v) for k, v in out.items()})


def at_once(target: Any, args: list[tuple[Any, ...]]) -> dict[str, float]:
    """`target(*args[i], barrier, queue)` in a process each, at once; the median over the
    processes of each name's seconds that each put on the queue."""
    bar, q = mp.Barrier(len(args)), mp.Queue()
    procs = [mp.Process(target=target, args=(*a, bar, q)) for a in args]
    for p in procs:
        p.start()
    got: list[dict[str, float]] = []
    try:
        while len(got) < len(procs):
            try:
                got.append(q.get(timeout=1.0))
            except queue.Empty:  # one that died never sends: the probe ends, not waits
                failed = next((p for p in procs if p.exitcode not in (None, 0)), None)
                if failed is not None:
                    raise SystemExit(f"a probe process ended with exit code "
                                     f"{failed.exitcode}") from None
    finally:
        for p in procs:
            if len(got) < len(procs):  # the others may wait at the barrier for it
                p.kill()
            p.join()
    return {k: statistics.median(g[k] for g in got) for k in got[0]}


def probe(processes: int, nbytes: int, repeat: int = 5) -> dict[str, float]:
    """Median over processes of each one's median seconds, `processes` at once."""
    return at_once(_probe_one, [(i, nbytes, repeat) for i in range(processes)])


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ckptbench-tierspeed"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--configs", default="4:1,2:1,2:2", help="ranks-per-node:replicas,...")
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--async-rounds", type=int, default=0,
                    help="runs of --mode async with the peer tier in the background (2 nodes)")
    ap.add_argument("--probe-mib", type=int, default=45, help="one process's shard at scale 16")
    ap.add_argument("--memory-dir", help="the memory tier's directory [default: the run's, "
                    "/dev/shm]; a tmpfs mounted with huge=always holds copies in 2 MiB pages")
    ap.add_argument("--restore-layout", metavar="LAYOUT",
                    help="restart onto this layout (e.g. world_size=8,tp=2): the process and "
                    "node restarts read DCP's load plan from the tiers")
    ap.add_argument("--huge-tmpfs", metavar="SIZE",
                    help="mount a tmpfs of SIZE (e.g. 4g) with huge=always for the run's "
                    "memory directory, unmounted after (root only)")
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    if a.huge_tmpfs:
        with huge_tmpfs(a.huge_tmpfs) as mount:
            a.memory_dir = str(mount)
            rounds(a)
    else:
        rounds(a)


@contextlib.contextmanager
def huge_tmpfs(size: str) -> Iterator[Path]:
    """A tmpfs with 2 MiB pages at a new directory of its own, unmounted and removed after."""
    mount = Path(tempfile.mkdtemp(prefix="ckptbench-hugetmpfs-"))
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"huge=always,size={size}", "tmpfs",
                        str(mount)], check=True)
        try:
            yield mount
        finally:
            subprocess.run(["umount", str(mount)], check=True)
    finally:
        mount.rmdir()


def rounds(a: argparse.Namespace) -> None:
    if a.probe:
        nbytes = a.probe_mib << 20
        load = os.getloadavg()[0]
        p = probe(8, nbytes)
        print(f"probe, 8 processes at once, {nbytes >> 20} MiB each (load {load:.1f}): "
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in p.items())
              + f"; plain copy / read {p['copy'] / p['read']:.2f}, "
              f"/ map+copy {p['copy'] / p['map+copy']:.2f}")
    if a.async_rounds:
        async_rounds(a)
    configs = [tuple(int(x) for x in c.split(":")) for c in a.configs.split(",")]
    runs: list[dict[str, Any]] = []
    cols = ("memory_x_copy", "peer_bw", "restore_memory_bw", "restore_peer_bw",
            "process_peer_bw", "process_s", "node_s", "storage_s")
    print("nodes k load(before,after) " + " ".join(cols))
    for rnd in range(a.rounds):
        for cfg in configs if rnd % 2 == 0 else configs[::-1]:
            r = one_run(cfg, a.scale, a.iterations, a.dir, f"r{rnd}-{cfg[0]}-{cfg[1]}",
                        a.memory_dir, a.restore_layout)
            runs.append(r)
            print(f"{r['nodes']} {r['k']} {r['load'][0]:.1f},{r['load'][1]:.1f} "
                  + " ".join(_f(r[c]) for c in cols), flush=True)
    print("\n| nodes | k | runs | load | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 4) + "|")
    for rpn, k in configs:
        mine = [r for r in runs if (r["nodes"], r["k"]) == (8 // rpn, k)]
        loads = [x for r in mine for x in r["load"]]
        print(f"| {8 // rpn} | {k} | {len(mine)} | {min(loads):.0f}-{max(loads):.0f} | "
              + " | ".join(_spread([r[c] for r in mine if r[c] is not None]) for c in cols)
              + " |")


def _spread(xs: list[float]) -> str:
    """median (min-max), or - when no run had it."""
    if not xs:
        return "-"
    return f"{_f(statistics.median(xs))} ({_f(min(xs))}-{_f(max(xs))})"


def async_rounds(a: argparse.Namespace) -> None:
    done = [async_run(4, a.scale, a.dir, f"async{i}") for i in range(a.async_rounds)]
    for r in done:
        print(f"async, {r['nodes']} nodes, load {r['load'][0]:.1f},{r['load'][1]:.1f}: "
              + ", ".join(f"{k} {_opt(r[k])}" for k in ("peer_bw", "steps_beside_replication",
                                                        "async_interference",
                                                        "node_restore_peer_bw")), flush=True)


def _opt(x: float | None) -> str:
    return "-" if x is None else _f(x)


if __name__ == "__main__":
    main()
