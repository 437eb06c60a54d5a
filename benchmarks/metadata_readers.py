"""Concurrent readers of one DCP-sized ``.metadata``: how the read grows with its readers.

DCP's load has every rank read ``.metadata`` itself (``FileSystemReader.read_metadata``
on each rank, torch 2.15), so a job of N restoring ranks reads it N times at once. This
measures 1, 2, 4, 8 concurrent readers of a file of that size on this machine's storage
and fits the slowest reader's time against the readers, which the job model
(``ckptbench/jobmodel/dcp_costs.py``, ``METADATA_READERS``) uses where the storage's
aggregate bandwidth is not given::

    python benchmarks/metadata_readers.py --dir /tmp --size 484735884 --readers 1,2,4,8

Two layouts, cold each time:

* ``copies``: each reader reads its own copy of the file: every reader's bytes come from
  storage, as for ranks on different nodes (no shared client cache). This is the fit.
* ``same``: every reader reads the one file: readers on one host share its page cache,
  so the storage serves the bytes about once (ranks of one node).

Cold: before every trial ``os.sync`` and ``posix_fadvise(DONTNEED)`` on every file (as
``ckptbench run --cache fadvise`` does); ``--drop-caches`` also writes
``/proc/sys/vm/drop_caches`` (root only, and it empties every other job's cache on the
host too). A trial starts its readers (processes) together at a barrier; each reads the
whole file in ``--block`` reads into one buffer (no unpickling: the read, the storage's
part). Per trial: the slowest reader's seconds (first start to last end) and the
aggregate rate (readers x bytes over that time); per reader count the median of
``--repeats`` trials. Fit: ``slowest = a + b * readers``; ``b / bytes`` is the storage's
seconds per reader per byte, its inverse the aggregate bandwidth the readers share.
Prints JSON and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

DROP_CACHES = "/proc/sys/vm/drop_caches"


def make_file(path: Path, size: int, block: int) -> None:
    """`size` incompressible bytes at `path` (kept when it is already that size)."""
    if path.exists() and path.stat().st_size == size:
        return
    seed = os.urandom(block)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, block)
            f.write(seed[:n])
            left -= n
            seed = seed[1:] + seed[:1]  # every block differs
        f.flush()
        os.fsync(f.fileno())


def evict(paths: list[Path], drop: bool) -> str:
    """Make the files cold; say how."""
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if drop:
        try:
            with open(DROP_CACHES, "w") as f:
                f.write("3\n")
            return "fadvise+drop_caches"
        except OSError:
            pass
    return "fadvise"


def reader(path: str, block: int, barrier: Any, out: Any) -> None:
    buf = bytearray(block)
    view = memoryview(buf)
    barrier.wait()
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            k = f.readinto(view)
            if not k:
                break
            n += k
    out.put((t0, time.perf_counter(), n))


def trial(paths: list[Path], block: int) -> dict[str, float]:
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(len(paths)), ctx.Queue()
    ps = [ctx.Process(target=reader, args=(str(p), block, barrier, out)) for p in paths]
    for p in ps:
        p.start()
    got = [out.get() for _ in ps]
    for p in ps:
        p.join()
    start, end = min(g[0] for g in got), max(g[1] for g in got)
    nbytes = sum(g[2] for g in got)
    return {"slowest_s": end - start, "aggregate_bytes_per_s": nbytes / (end - start),
            "reader_s": sorted(g[1] - g[0] for g in got)}


def fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least squares y = a + b x."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if n > 1 else 0.0
    return {"a_s": my - b * mx, "b_s_per_reader": b}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--dir", default="/tmp", help="a directory on the storage measured")
    ap.add_argument("--size", type=int, default=484_735_884,
                    help="bytes of the file [DCP's .metadata of the 405B job on 16,384 GPUs]")
    ap.add_argument("--readers", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block", type=int, default=8 << 20)
    ap.add_argument("--layouts", default="copies,same")
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the files")
    ap.add_argument("--fit-from", default="",
                    help="JSON files of earlier runs (same --size) whose trials join these:"
                         " each point's median over all trials is fitted")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    counts = [int(x) for x in args.readers.split(",") if x]
    base = Path(args.dir) / "ckptbench-metadata-readers"
    base.mkdir(exist_ok=True)
    files = [base / f"metadata.{k}" for k in range(max(counts, default=0))]
    for f in files:
        make_file(f, args.size, args.block)
    rows = []
    for earlier in filter(None, args.fit_from.split(",")):
        rows += json.loads(Path(earlier).read_text())["rows"]
    for layout in args.layouts.split(","):
        for n in counts:
            paths = files[:n] if layout == "copies" else [files[0]] * n
            trials = []
            for _ in range(args.repeats):
                how = evict(files[:n], args.drop_caches)
                trials.append(trial(paths, args.block))
            slowest = statistics.median(t["slowest_s"] for t in trials)
            row = {"layout": layout, "readers": n, "bytes": args.size, "cold": how,
                   "slowest_s": slowest, "trials_s": [t["slowest_s"] for t in trials],
                   "aggregate_bytes_per_s": n * args.size / slowest,
                   "reader_s_last_trial": trials[-1]["reader_s"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:  # one row per layout and reader count: every trial, their median
        m = merged.setdefault((r["layout"], r["readers"]), {**r, "trials_s": []})
        m["trials_s"] = m["trials_s"] + r["trials_s"]
        m["slowest_s"] = statistics.median(m["trials_s"])
        m["aggregate_bytes_per_s"] = m["readers"] * m["bytes"] / m["slowest_s"]
    rows = sorted(merged.values(), key=lambda r: (r["layout"] != "copies", r["readers"]))
    fits = {}
    for layout in {r["layout"] for r in rows}:
        sel = [r for r in rows if r["layout"] == layout]
        f = fit([float(r["readers"]) for r in sel], [r["slowest_s"] for r in sel])
        f["s_per_reader_per_byte"] = f["b_s_per_reader"] / args.size
        f["aggregate_bytes_per_s"] = (args.size / f["b_s_per_reader"]
                                      if f["b_s_per_reader"] > 0 else float("inf"))
        fits[layout] = f
    out = {"source": {"machine": platform.machine(), "cpus": os.cpu_count(),
                      "dir": str(base), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime()),
                      "load_average": os.getloadavg()},
           "rows": rows, "fit": fits}
    print(json.dumps(fits, indent=1))
    print("| layout | readers | slowest s (median) | trials s | aggregate MB/s | fit s |")
    print("|---|---:|---:|---|---:|---:|")
    for r in rows:
        f = fits[r["layout"]]
        print(f"| {r['layout']} | {r['readers']} | {r['slowest_s']:.3f} | "
              f"{', '.join(f'{t:.2f}' for t in r['trials_s'])} | "
              f"{r['aggregate_bytes_per_s'] / 1e6:,.0f} | "
              f"{f['a_s'] + f['b_s_per_reader'] * r['readers']:.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    if not args.keep:
        for f in files:
            f.unlink(missing_ok=True)
        base.rmdir()


if __name__ == "__main__":
    main()
