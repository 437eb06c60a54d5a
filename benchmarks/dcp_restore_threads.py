"""torch-dcp's restore against a plain ``torch.distributed.checkpoint.load`` of the same
checkpoint, with raw's restore beside them (issue 42: intra-op threads).

One torch-dcp checkpoint and one raw checkpoint of the workload are saved and kept
(``ckptbench run --keep --no-restore``); then rounds of restores, the pair interleaved
(A B, B A, A B, ...) so that a drifting machine hits both alike, raw's after each pair:

A  ``ckptbench restore`` of the torch-dcp checkpoint: ``--format torch-dcp`` as a user
   runs it, with its default intra-op threads (``--intra-op-threads auto``: 1 per process
   when a node runs several, as torchrun sets ``OMP_NUM_THREADS=1``); its time: its
   ``dcp_load`` ops, the first start to the last end (the restore phase's seconds);
B  a plain ``dcp.load`` of the same files by as many processes (a gloo group, one intra-op
   thread each: ``OMP_NUM_THREADS=1`` before torch is imported, and
   ``torch.set_num_threads(1)``), each loading its pieces of the restore layout as DCP
   would (ckptbench.formats.dcp_load's piece allocation, DCP's default load planner and
   ``FileSystemReader``); no ckptbench runner around it. Its time: the first process's
   start of ``dcp.load`` (behind a barrier) to the last one's end;
R  ``ckptbench restore`` of the raw checkpoint (raw's planned restore of the same bytes);
C  with ``--also-threads N``: A again with ``--intra-op-threads N`` (torch's default on a
   machine of N cores: what a run got before ckptbench set the threads).

The page cache is dropped (sync, then ``/proc/sys/vm/drop_caches`` where permitted, and
``posix_fadvise(DONTNEED)`` on every file of the checkpoint) before each restore and, as
ckptbench's own restores evict once their processes run, by B's process 0 once B's
processes have started and allocated their pieces, just before the barrier that starts
the clock: so the code either load runs is cached alike. Printed: every restore's
seconds, the medians over the rounds, and the ratio torch-dcp / plain ``dcp.load`` (per
pair and of the medians).

    TORCHENV/bin/python benchmarks/dcp_restore_threads.py --pairs 4   # a venv with torch
    python benchmarks/dcp_restore_threads.py --workload W --scale S --target DIR --pairs N

Needs torch (the ``torch`` extra) in the interpreter that runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORKLOAD = ROOT / "workloads" / "llama3-8b-hsdp2-8.toml"
BAR = 1.25  # torch-dcp within this factor of a plain dcp.load


def _ckptbench(*args: str) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                       text=True, check=False)
    if p.returncode:
        raise SystemExit(f"ckptbench {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def _records(path: Path) -> list[dict[str, Any]]:
    from ckptbench.records import read_records

    return list(read_records(path))


def drop_caches(files: list[Path]) -> None:
    """The checkpoint's files out of the page cache (as ckptbench's restores evict)."""
    subprocess.run(["sync"], check=False)
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def save(workload: Path, scale: int, fmt: str, target: Path, results: Path) -> Path:
    """A kept checkpoint of `fmt` (saved, not restored); its directory."""
    _ckptbench("run", str(workload), "--scale", str(scale), "--format", fmt, "--target",
               str(target), "--keep", "--no-restore", "--results", str(results))
    (ckpt,) = target.glob("run-*/checkpoint-1")
    return ckpt


def restore(ckpt: Path, results: Path, *extra: str) -> dict[str, Any]:
    """`ckptbench restore` of a kept checkpoint: its restore summary and what it recorded."""
    _ckptbench("restore", str(ckpt), "--results", str(results), *extra)
    recs = _records(results)
    (summary,) = [r for r in recs if r["type"] == "summary" and r["phase"] == "restore"]
    run = recs[0]
    loads = [r for r in recs if r["type"] == "op" and r["op"] == "dcp_load"]
    seconds = ((max(r["end_ns"] for r in loads) - min(r["start_ns"] for r in loads)) / 1e9
               if loads else summary["seconds"])
    return {"seconds": seconds, "phase_seconds": summary["seconds"], "summary": summary,
            "intra_op_threads": run.get("intra_op_threads"),
            "processes": len(run.get("ranks", []))}


# --- B: a plain dcp.load, one process per restore rank ---
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _files(ckpt: Path) -> list[Path]:
    return sorted(p for p in ckpt.rglob("*") if p.is_file())


def plain_load(ckpt: Path, workload: Path, scale: int, world: int, out: Path) -> float:
    """`world` processes load the checkpoint with dcp.load; the seconds from the first
    start to the last end."""
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    procs = [subprocess.Popen([sys.executable, __file__, "_plain", str(ckpt), str(workload),
                               str(scale), str(rank), str(world), str(out)], env=env)
             for rank in range(world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"plain dcp.load failed: exit codes {codes}")
    spans = json.loads(out.read_text())
    return (max(b for _, b in spans) - min(a for a, _ in spans)) / 1e9


def _plain_rank(ckpt: str, workload: str, scale: int, rank: int, world: int, out: str) -> None:
    """One process of the plain load (OMP_NUM_THREADS=1 set by the parent)."""
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from ckptbench.formats.dcp_load import allocate_pieces
    from ckptbench.formats.torch_dcp import PlannedChunks, _planners, _torch_dtype
    from ckptbench.plan import build_plan
    from ckptbench.plan.restore import restore_pieces, restore_plan_of
    from ckptbench.spec import load_workload, scaled

    plan = build_plan(scaled(load_workload(workload), scale))
    held = allocate_pieces(plan, restore_pieces(restore_plan_of(plan), rank))
    keys = plan.keys
    state = {keys[k].name: PlannedChunks(keys[k].global_shape, [(off, torch.from_numpy(a).view(
        _torch_dtype(torch, keys[k].dtype)))]) for k, (off, a) in held.items()}
    _, planner = _planners()  # DCP's DefaultLoadPlanner, looking the pieces up
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dist.barrier()
    if rank == 0:  # as ckptbench evicts: once the processes run, before the clock
        drop_caches(_files(Path(ckpt)))
    dist.barrier()
    t0 = time.perf_counter_ns()
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(Path(ckpt) / "dcp")),
             planner=planner)
    t1 = time.perf_counter_ns()
    spans: list[Any] = [None] * world
    dist.all_gather_object(spans, (t0, t1))
    if rank == 0:
        Path(out).write_text(json.dumps(spans))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    ap.add_argument("--scale", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=4, help="interleaved pairs (A B, B A, ...)")
    ap.add_argument("--target", type=Path, default=None,
                    help="where the checkpoints go [default: a temporary directory]")
    ap.add_argument("--also-threads", type=int, default=0, metavar="N",
                    help="also restore with --intra-op-threads N each round (C)")
    ap.add_argument("--json", type=Path, default=None, help="write every figure here too")
    args = ap.parse_args()
    import torch

    with tempfile.TemporaryDirectory(dir=args.target) as tmp:
        work = Path(tmp)
        dcp_ckpt = save(args.workload, args.scale, "torch-dcp", work / "dcp", work / "s1.jsonl")
        raw_ckpt = save(args.workload, args.scale, "raw", work / "raw", work / "s2.jsonl")
        world = len(_records(work / "s1.jsonl")[0]["ranks"])
        files = {"A": _files(dcp_ckpt), "R": _files(raw_ckpt)}
        files["B"] = files["C"] = files["A"]
        also = ["C"] if args.also_threads else []
        print(f"{args.workload.name} --scale {args.scale}: {world} processes, torch "
              f"{torch.__version__}, {os.cpu_count()} CPUs; {args.pairs} pairs", flush=True)
        rows: list[dict[str, Any]] = []
        for k in range(args.pairs):
            order = ["A", "B"] if k % 2 == 0 else ["B", "A"]
            row: dict[str, Any] = {"pair": k + 1, "order": "".join(order)}
            for which in [*order, "R", *also]:
                drop_caches(files[which])
                out = work / f"{which}-{k}.jsonl"
                if which == "B":
                    row["B"] = plain_load(dcp_ckpt, args.workload, args.scale, world,
                                          work / f"B-{k}.json")
                else:
                    extra = ("--intra-op-threads", str(args.also_threads)) if which == "C" else ()
                    got = restore(raw_ckpt if which == "R" else dcp_ckpt, out, *extra)
                    row[which] = got["seconds"]
                    if which == "C":
                        row["C_parts"] = got["summary"].get("rank_parts")
                    if which == "A":
                        row["threads"] = got["intra_op_threads"]
                        row["rank_parts"] = got["summary"].get("rank_parts")
                        row["file_read_bytes"] = got["summary"].get("file_read_bytes")
                        row["read_bytes"] = got["summary"]["bytes"]
            row["ratio"] = row["A"] / row["B"]
            rows.append(row)
            parts = (row["rank_parts"] or {}).get("slowest", {}).get("parts", {})
            print(f"pair {k + 1} ({row['order']}): torch-dcp {row['A']:.2f} s "
                  f"(intra-op threads {row['threads']['value']}: {row['threads']['why']}), "
                  f"plain dcp.load {row['B']:.2f} s, raw {row['R']:.2f} s"
                  + (f", torch-dcp with {args.also_threads} intra-op threads {row['C']:.2f} s"
                     if also else "") + f"; ratio {row['ratio']:.3f}; torch-dcp slowest rank: "
                  + ", ".join(f"{p} {v:.2f}" for p, v in parts.items()), flush=True)
    med = {w: statistics.median(r[w] for r in rows) for w in ("A", "B", "R", *also)}
    ratio = med["A"] / med["B"]
    pulled = rows[0]["file_read_bytes"]
    print(f"medians over {len(rows)} pairs: torch-dcp {med['A']:.2f} s, plain dcp.load "
          f"{med['B']:.2f} s, raw {med['R']:.2f} s"
          + (f", torch-dcp with {args.also_threads} intra-op threads {med['C']:.2f} s "
             f"({med['C'] / med['A']:.2f}x the default's)" if also else ""))
    print(f"torch-dcp / plain dcp.load: {ratio:.3f} (of the medians), "
          f"{statistics.median(r['ratio'] for r in rows):.3f} (median of the pairs' ratios); "
          f"bar {BAR}: {'met' if ratio <= BAR else 'NOT met'}")
    if pulled:
        print(f"DCP's reader read {pulled:,} bytes of its files (OS reads) for {rows[0]['read_bytes']:,}"
              f" payload bytes ({pulled / rows[0]['read_bytes']:.3f}x)")
    if args.json:
        args.json.write_text(json.dumps({"pairs": rows, "medians": med, "ratio": ratio},
                                        indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_plain":
        c, w, s, r, n, o = sys.argv[2:8]
        _plain_rank(c, w, int(s), int(r), int(n), o)
    else:
        main()
