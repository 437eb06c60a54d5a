"""What torch DCP's coordinator spends on a real ``torch.distributed.checkpoint.save``, by
chunk count: the part of C that ckptbench's job model charges once per save
(``ckptbench/jobmodel/dcp_costs.py``).

Run with torch installed (a side venv; ckptbench itself is not needed)::

    TORCH_VENV/bin/python benchmarks/dcp_coordinator_cost.py --procs 4 \
        --chunks 7275,56000,120000,325876 --out coordinator.json
    TORCH_VENV/bin/python benchmarks/dcp_coordinator_cost.py --procs 4 --writer null \
        --chunks 1000000 --caching off --saves 1 --out million.json

Every point starts ``--procs`` processes in a gloo process group (TCP on localhost) and
each calls ``dcp.save`` with DCP's own ``DefaultSavePlanner`` (``enable_plan_caching``
off or on) and ``FileSystemWriter``, ``--saves`` times in a row (the first save plans; with
caching on, the later ones reuse the cached plans). The state dict is shaped as an FSDP
job's: ``--per-rank`` chunks for each of the job's (virtual) ranks, ``--shards`` ranks
sharing each 2-D tensor along dim 0, the processes hosting the virtual ranks in equal
runs, with torchtitan-like names (model, optimizer exp_avg and exp_avg_sq of the layers'
weights). A chunk is 16 bytes (1 x 4 fp32): the coordinator's work is per chunk, not per
byte, and the data written stays small.

Timed on rank 0 (the coordinator), wall (``perf_counter``) and CPU (``process_time``:
the whole process, gloo's threads included) by wrapping DCP's own calls:

* ``gather_plans``: ``_DistWrapper.gather_object`` of the local plans (the ranks' pickled
  plans received and unpickled);
* ``global_plan``: ``DefaultSavePlanner.create_global_plan`` (dedup, global plan and
  ``Metadata``, validation) and ``FileSystemWriter.prepare_global_plan``;
* ``scatter_plans``: ``_DistWrapper.scatter_object`` of the global plan (pickled, sent);
* ``gather_results``: ``gather_object`` of every rank's write results;
* ``finish``: ``FileSystemWriter.finish`` (the storage index of every chunk, the pickle
  of ``.metadata`` and its write, no fsync);
* ``broadcast``: ``_DistWrapper.broadcast_object`` of the ``Metadata`` to every rank.

Their sum is the *coordinator*. Left out of it (timed apart): the local plan and the data
writes, which every rank does for its own chunks at once, and the waits for the slowest
rank, which a barrier placed in front of each gather takes (``wait`` columns) so that
the gathers time the transfer, not the other ranks' local work. Rank 1's ``broadcast``
(receiving and unpickling the whole ``Metadata``, as every rank does after a save) is
printed beside it.

``--writer null`` (planning only): the same ``dcp.save``, with a ``FileSystemWriter``
whose ``write_data`` returns each item's write result without writing its bytes; the
coordinator's steps are unchanged (``.metadata`` is written). It reaches a million
chunks on a small machine in minutes.

Fitted to the coordinator's CPU seconds of every save that planned (caching off, and the
first save with caching on; both writers): ``seconds = c * chunks^k`` by least squares in
logs (the CPU per chunk grows slowly with the chunks: k is about 1.06), and the line
``seconds = a + b * chunks`` fitted to the file-writer saves alone, minimising the
relative residuals (each point counts alike, 7k as 326k), beside it; lines are fitted to
the saves after the first with caching on, to rank 1's receipt of the broadcast
``Metadata``, to the load's coordinator (``load_cpu``) and to rank 0's ``read_metadata``.
The tables print the model next to each measured save and load.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROWS, COLS = 1, 4  # one chunk: 1 x 4 fp32 (16 bytes)
KINDS = ("attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1",
         "feed_forward.w2", "feed_forward.w3", "attention_norm", "ffn_norm")
STATES = ("model.{}.weight", "optimizer.state.model.{}.weight.exp_avg",
          "optimizer.state.model.{}.weight.exp_avg_sq")
COORDINATOR = ("gather_plans", "global_plan", "scatter_plans", "gather_results", "finish",
               "broadcast")
LOAD_COORDINATOR = ("gather_plans", "global_plan", "scatter_plans")


def key_name(group: int, j: int, per_rank: int) -> str:
    """The j-th tensor of a group of ranks (one FSDP group: its own layers)."""
    state, rest = j % len(STATES), j // len(STATES)
    layers = -(-per_rank // (len(STATES) * len(KINDS)))
    layer = group * layers + rest // len(KINDS)
    return STATES[state].format(f"layers.{layer}.{KINDS[rest % len(KINDS)]}")


def layout(chunks: int, per_rank: int, shards: int) -> tuple[int, list[int]]:
    """(virtual ranks, chunks of each): ceil(chunks / per_rank) ranks, the last with the
    remainder."""
    ranks = max(1, math.ceil(chunks / per_rank))
    counts = [per_rank] * ranks
    counts[-1] = chunks - per_rank * (ranks - 1)
    return ranks, counts


class Timer:
    """Wall and CPU seconds per named step (summed over calls)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.prefix = ""  # "load_" while dcp.load runs
        self.gathers = 0  # gather_object calls since the save (or load) began

    def start(self, prefix: str) -> None:
        self.prefix, self.gathers = prefix, 0

    @contextmanager
    def __call__(self, name: str) -> Any:
        name = self.prefix + name
        w, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
            self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c
            self.calls[name] = self.calls.get(name, 0) + 1


def _state(cfg: dict[str, Any], proc: int, procs: int) -> dict[str, Any]:
    """This process's state dict: one object per key holding its chunks (DCP's
    ``__create_write_items__`` protocol, as DTensor's)."""
    import torch
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    props = TensorProperties(dtype=torch.float32)

    class Chunks:
        def __init__(self, rows: int) -> None:
            self.shape = torch.Size([rows, COLS])
            self.offsets: list[int] = []

        def __create_write_items__(self, fqn: str, obj: Any) -> list[Any]:
            out = []
            for row in self.offsets:
                off = torch.Size([row, 0])
                out.append(WriteItem(
                    index=MetadataIndex(fqn, off), type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(offsets=off, sizes=torch.Size([ROWS, COLS])),
                        properties=props, size=self.shape)))
            return out

        def __create_chunk_list__(self) -> list[Any]:
            return [ChunkStorageMetadata(offsets=torch.Size([r, 0]), sizes=torch.Size([ROWS, COLS]))
                    for r in self.offsets]

        def __get_tensor_shard__(self, index: Any) -> Any:
            return torch.full((ROWS, COLS), float(index.offset[0]), dtype=torch.float32)

    ranks, counts = layout(cfg["chunks"], cfg["per_rank"], cfg["shards"])
    lo, hi = proc * ranks // procs, (proc + 1) * ranks // procs
    state: dict[str, Any] = {}
    for vr in range(lo, hi):
        group, pos = divmod(vr, cfg["shards"])
        members = min(cfg["shards"], ranks - group * cfg["shards"])
        short = group == (ranks - 1) // cfg["shards"]  # the group of the last rank
        for j in range(counts[vr]):
            # the group's ranks holding a j-th chunk share that tensor (the last rank may
            # hold fewer chunks than the others)
            holders = members - (1 if short and j >= counts[-1] else 0)
            name = key_name(group, j, cfg["per_rank"])
            obj = state.get(name)
            if obj is None:
                obj = state[name] = Chunks(holders * ROWS)
            obj.offsets.append(pos * ROWS)
    return state


def _writer(path: str, null: bool) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    class NullDataWriter(FileSystemWriter):  # type: ignore[misc]
        """DCP's writer without the data: each item's result as if written."""

        def write_data(self, plan: Any, planner: Any) -> Any:
            name = f"{plan.storage_data.prefix}0.distcp"
            nbytes = ROWS * COLS * 4
            fut: Future[list[Any]] = Future()
            fut.set_result([WriteResult(index=item.index, size_in_bytes=nbytes,
                                        storage_data=_StorageInfo(name, k * nbytes, nbytes))
                            for k, item in enumerate(plan.items)])
            return fut

    cls = NullDataWriter if null else FileSystemWriter
    return cls(path, sync_files=False, thread_count=1)


def _hooks(timer: Timer) -> None:
    """Time DCP's collectives and the coordinator's steps by wrapping DCP's own calls (in
    this process only)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.utils import _DistWrapper

    gather, scatter, bcast = (_DistWrapper.gather_object, _DistWrapper.scatter_object,
                              _DistWrapper.broadcast_object)

    def gather_object(self: Any, obj: Any) -> Any:
        name = "plans" if timer.gathers == 0 else "results"
        timer.gathers += 1
        if self.use_dist:
            with timer(f"wait_{name}"):
                dist.barrier(group=self.group)
        with timer(f"gather_{name}"):
            return gather(self, obj)

    def scatter_object(self: Any, objs: Any) -> Any:
        with timer("scatter_plans"):
            return scatter(self, objs)

    def broadcast_object(self: Any, obj: Any) -> Any:
        with timer("broadcast"):
            return bcast(self, obj)

    _DistWrapper.gather_object = gather_object  # type: ignore[method-assign]
    _DistWrapper.scatter_object = scatter_object  # type: ignore[method-assign]
    _DistWrapper.broadcast_object = broadcast_object  # type: ignore[method-assign]
    for name, step in (("prepare_global_plan", "global_plan"), ("finish", "finish"),
                       ("write_data", "write_data"), ("prepare_local_plan", "local_plan")):
        orig = getattr(FileSystemWriter, name)

        def timed(self: Any, *a: Any, _orig: Any = orig, _step: str = step, **k: Any) -> Any:
            with timer(_step):
                return _orig(self, *a, **k)
        setattr(FileSystemWriter, name, timed)
    from torch.distributed.checkpoint import FileSystemReader

    read_metadata = FileSystemReader.read_metadata

    def timed_read(self: Any, *a: Any, **k: Any) -> Any:
        with timer("read_metadata"):
            return read_metadata(self, *a, **k)
    FileSystemReader.read_metadata = timed_read  # type: ignore[method-assign]


def _reader(path: str) -> Any:
    """DCP's reader without the data (planning only): ``.metadata`` is read for real."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.futures import Future

    class NullDataReader(FileSystemReader):  # type: ignore[misc]
        def read_data(self, plan: Any, planner: Any) -> Any:
            fut: Future[None] = Future()
            fut.set_result(None)
            return fut

    return NullDataReader(path)


def _load_planner(timer: Timer) -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class Planner(DefaultLoadPlanner):  # type: ignore[misc]
        def set_up_planner(self, state_dict: Any, metadata: Any = None,
                           is_coordinator: bool = False) -> None:
            # as ckptbench's torch-dcp format: the state dict's objects as they are
            self.original_state_dict = state_dict
            self.state_dict = state_dict
            self.metadata = metadata
            self.is_coordinator = is_coordinator

        def create_local_plan(self) -> Any:
            with timer("local_plan"):
                return super().create_local_plan()

        def create_global_plan(self, all_plans: Any) -> Any:
            with timer("global_plan"):
                return super().create_global_plan(all_plans)

    return Planner(flatten_state_dict=False, flatten_sharded_tensors=False)


def _planner(timer: Timer, caching: bool) -> Any:
    from torch.distributed.checkpoint import DefaultSavePlanner

    class Planner(DefaultSavePlanner):  # type: ignore[misc]
        def lookup_object(self, index: Any) -> Any:
            return self.state_dict[index.fqn].__get_tensor_shard__(index)

        def create_local_plan(self) -> Any:
            with timer("local_plan"):
                return super().create_local_plan()

        def create_global_plan(self, all_plans: Any) -> Any:
            with timer("global_plan"):
                return super().create_global_plan(all_plans)

        def finish_plan(self, plan: Any) -> Any:
            with timer("finish_plan"):
                return super().finish_plan(plan)

    return Planner(flatten_state_dict=False, flatten_sharded_tensors=False,
                   enable_plan_caching=caching)


def worker(proc: int, procs: int, port: int, cfg: dict[str, Any], out: str) -> None:
    """One process of the group: `cfg['saves']` saves; rank 0 and 1 write their timings."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=proc,
                            world_size=procs)
    timer = Timer()
    _hooks(timer)
    state = _state(cfg, proc, procs)
    planner = _planner(timer, cfg["caching"])
    saves = []
    for k in range(cfg["saves"]):
        timer.wall.clear()
        timer.cpu.clear()
        gc.collect()
        dist.barrier()
        path = os.path.join(cfg["dir"], f"save{k}")
        timer.start("")
        w, c = time.perf_counter(), time.process_time()
        dcp.save(state, storage_writer=_writer(path, cfg["writer"] == "null"), planner=planner)
        wall, cpu = time.perf_counter() - w, time.process_time() - c
        size = os.path.getsize(os.path.join(path, ".metadata")) if proc == 0 else None
        row = {"save": k + 1, "wall_s": wall, "cpu_s": cpu, "metadata_bytes": size}
        if cfg["load"]:  # DCP's load of it, planning only (the data is not read)
            if proc == 0:  # every rank reads .metadata cold, as after a restart
                _evict(os.path.join(path, ".metadata"))
            gc.collect()
            dist.barrier()
            timer.start("load_")
            w, c = time.perf_counter(), time.process_time()
            dcp.load(state, storage_reader=_reader(path), planner=_load_planner(timer))
            row.update(load_wall_s=time.perf_counter() - w, load_cpu_s=time.process_time() - c)
        saves.append({**row, "steps_wall_s": dict(timer.wall), "steps_cpu_s": dict(timer.cpu)})
        dist.barrier()
        if proc == 0:
            shutil.rmtree(path, ignore_errors=True)
    if proc in (0, 1):
        Path(out, f"rank{proc}.json").write_text(json.dumps(saves))
    dist.destroy_process_group()


def _evict(path: str) -> None:
    os.sync()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(chunks: int, procs: int, caching: bool, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One group of `procs` processes saving `chunks` chunks `args.saves` times: a row per
    save (rank 0's steps; rank 1's broadcast)."""
    base = tempfile.mkdtemp(prefix="dcp-coord-", dir=args.dir)
    cfg = {"chunks": chunks, "per_rank": args.per_rank, "shards": args.shards,
           "caching": caching, "saves": args.saves, "writer": args.writer, "dir": base,
           "load": args.load}
    ctx = mp.get_context("spawn")
    port = _free_port()
    ps = [ctx.Process(target=worker, args=(p, procs, port, cfg, base)) for p in range(procs)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    try:
        if any(p.exitcode for p in ps):
            raise SystemExit(f"a process failed at {chunks} chunks, {procs} processes: "
                             f"{[p.exitcode for p in ps]}")
        r0 = json.loads(Path(base, "rank0.json").read_text())
        r1 = json.loads(Path(base, "rank1.json").read_text()) if procs > 1 else [{}] * len(r0)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows = []
    for a, b in zip(r0, r1, strict=True):
        cw, cc = a["steps_wall_s"], a["steps_cpu_s"]
        rows.append({
            "chunks": chunks, "procs": procs, "virtual_ranks": layout(chunks, args.per_rank,
                                                                      args.shards)[0],
            "caching": caching, "writer": args.writer, "save": a["save"],
            "metadata_bytes": a["metadata_bytes"],
            "coordinator_cpu_s": sum(cc.get(s, 0.0) for s in COORDINATOR),
            "coordinator_wall_s": sum(cw.get(s, 0.0) for s in COORDINATOR),
            "steps_cpu_s": cc, "steps_wall_s": cw,
            "rank1_broadcast_wall_s": (b.get("steps_wall_s") or {}).get("broadcast"),
            "rank1_broadcast_cpu_s": (b.get("steps_cpu_s") or {}).get("broadcast"),
            "save_wall_s": a["wall_s"], "save_cpu_s": a["cpu_s"],
            **({"load_coordinator_cpu_s": sum(cc.get(f"load_{s}", 0.0) for s in LOAD_COORDINATOR),
                "load_coordinator_wall_s": sum(cw.get(f"load_{s}", 0.0) for s in LOAD_COORDINATOR),
                "read_metadata_cpu_s": cc.get("load_read_metadata"),
                "read_metadata_wall_s": cw.get("load_read_metadata"),
                "rank1_read_metadata_wall_s": (b.get("steps_wall_s") or {}).get(
                    "load_read_metadata"),
                "load_wall_s": a["load_wall_s"], "load_cpu_s": a["load_cpu_s"]}
               if "load_wall_s" in a else {})})
    return rows


def planned(row: dict[str, Any]) -> bool:
    """A save that planned: caching off, or the first save with caching on."""
    return not row["caching"] or row["save"] == 1


def fit(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    """seconds = a + b * chunks minimising the relative residuals ((fit - y) / y)^2."""
    xs = [float(r["chunks"]) for r in rows]
    ys = [float(r[key]) for r in rows]
    ws = [1.0 / y ** 2 for y in ys]
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs, strict=True)) / sw
    my = sum(w * y for w, y in zip(ws, ys, strict=True)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
    b = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys, strict=True)) / sxx \
        if len(set(xs)) > 1 else 0.0
    return {"a_s": my - b * mx, "b_s_per_chunk": b, "points": len(xs),
            "chunks_min": min(xs), "chunks_max": max(xs)}


def fit_power(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    """seconds = c * chunks^k, least squares in logs (relative residuals)."""
    xs = [math.log(r["chunks"]) for r in rows]
    ys = [math.log(r[key]) for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs)
    return {"c_s": math.exp(my - k * mx), "k": k, "points": len(xs),
            "chunks_min": min(r["chunks"] for r in rows),
            "chunks_max": max(r["chunks"] for r in rows)}


def model(f: dict[str, float], chunks: int) -> float:
    if "k" in f:
        return float(f["c_s"] * chunks ** f["k"])
    return max(f["a_s"] + f["b_s_per_chunk"] * chunks, 0.0)


def table(rows: list[dict[str, Any]], fits: dict[str, dict[str, float]]) -> str:
    """Markdown: each save, its coordinator CPU and wall, the model beside them."""
    head = ("| chunks | procs | writer | caching | save | gather s | global plan s | scatter s "
            "| results s | finish s | broadcast s | coordinator CPU s | model CPU s | model / "
            "measured | coordinator wall s | wall / CPU | rank 1 broadcast s | .metadata B |")
    lines = [head, "|" + "---:|" * 4 + "---:|" * 14]
    for r in rows:
        f = fits["cpu_planned"] if planned(r) else fits.get("cpu_cached")
        m = model(f, r["chunks"]) if f else float("nan")
        c = r["steps_cpu_s"]
        lines.append(
            f"| {r['chunks']:,} | {r['procs']} | {r['writer']} | {'on' if r['caching'] else 'off'}"
            f" | {r['save']} | {c.get('gather_plans', 0):.3f} | {c.get('global_plan', 0):.3f}"
            f" | {c.get('scatter_plans', 0):.3f} | {c.get('gather_results', 0):.3f}"
            f" | {c.get('finish', 0):.3f} | {c.get('broadcast', 0):.3f}"
            f" | {r['coordinator_cpu_s']:.3f} | {m:.3f} | {m / r['coordinator_cpu_s']:.2f}"
            f" | {r['coordinator_wall_s']:.3f} | {r['coordinator_wall_s'] / r['coordinator_cpu_s']:.2f}"
            f" | {r['rank1_broadcast_wall_s'] or 0:.3f} | {r['metadata_bytes'] or 0:,} |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]], fits: dict[str, dict[str, float]]) -> str:
    """Markdown: per writer and chunk count, the median of the saves that planned (and of
    the cached saves, and of the loads) beside the models."""
    import statistics

    out = ["| chunks | writer | planned saves | coordinator CPU s (median) | model s | model /"
           " measured | wall s (median) | cached saves | cached CPU s | cached model s |"
           " loads | load planning CPU s | load model s | model / measured |",
           "|" + "---:|" * 14]
    for writer, chunks in sorted({(r["writer"], r["chunks"]) for r in rows},
                                 key=lambda k: (k[0] != "fs", k[1])):
        sel = [r for r in rows if r["writer"] == writer and r["chunks"] == chunks]
        plan = [r for r in sel if planned(r)]
        cached = [r for r in sel if not planned(r)]
        loads = [r for r in sel if r.get("load_coordinator_cpu_s")]
        cpu = statistics.median(r["coordinator_cpu_s"] for r in plan) if plan else float("nan")
        wall = statistics.median(r["coordinator_wall_s"] for r in plan) if plan else float("nan")
        m = model(fits["cpu_planned"], chunks)
        ccpu = statistics.median(r["coordinator_cpu_s"] for r in cached) if cached else None
        cm = model(fits["cpu_cached"], chunks) if cached and "cpu_cached" in fits else None
        lcpu = statistics.median(r["load_coordinator_cpu_s"] for r in loads) if loads else None
        lm = model(fits["load_cpu"], chunks) if loads and "load_cpu" in fits else None
        out.append(
            f"| {chunks:,} | {writer} | {len(plan)} | {cpu:.2f} | {m:.2f} | {m / cpu:.2f}"
            f" | {wall:.2f} | {len(cached)} | {'-' if ccpu is None else f'{ccpu:.2f}'}"
            f" | {'-' if cm is None else f'{cm:.2f}'} | {len(loads)}"
            f" | {'-' if lcpu is None else f'{lcpu:.2f}'} | {'-' if lm is None else f'{lm:.2f}'}"
            f" | {'-' if lm is None or not lcpu else f'{lm / lcpu:.2f}'} |")
    out += ["", "Every rank's unpickle of the Metadata (after a save: rank 1's receipt of the"
            " broadcast; before a load: rank 0's read_metadata, cold), CPU seconds, medians:",
            "", "| chunks | writer | rank 1 broadcast CPU s | model s | read_metadata CPU s |"
            " model s |", "|" + "---:|" * 6]
    for writer, chunks in sorted({(r["writer"], r["chunks"]) for r in rows},
                                 key=lambda k: (k[0] != "fs", k[1])):
        sel = [r for r in rows if r["writer"] == writer and r["chunks"] == chunks]
        got = [r["rank1_broadcast_cpu_s"] for r in sel if r.get("rank1_broadcast_cpu_s")]
        read = [r["read_metadata_cpu_s"] for r in sel if r.get("read_metadata_cpu_s")]
        bm = fits.get("rank1_broadcast_cpu")
        rm = fits.get("read_metadata_cpu")
        out.append(
            f"| {chunks:,} | {writer} | {statistics.median(got) if got else float('nan'):.2f}"
            f" | {model(bm, chunks) if bm else float('nan'):.2f}"
            f" | {statistics.median(read) if read else float('nan'):.2f}"
            f" | {model(rm, chunks) if rm else float('nan'):.2f} |")
    return "\n".join(out)


def load_table(rows: list[dict[str, Any]], fits: dict[str, dict[str, float]]) -> str:
    """Markdown: each load (planning only), the coordinator's steps and rank 0's
    .metadata read, the models beside them."""
    lines = ["| chunks | procs | gather s | global plan s | scatter s | load coordinator CPU s "
             "| model CPU s | model / measured | wall s | read_metadata CPU s | model s "
             "| read_metadata wall s (rank 0, rank 1) |", "|" + "---:|" * 12]
    for r in rows:
        if "load_wall_s" not in r:
            continue
        c = r["steps_cpu_s"]
        m = model(fits["load_cpu"], r["chunks"]) if "load_cpu" in fits else float("nan")
        mr = model(fits["read_metadata_cpu"], r["chunks"]) \
            if "read_metadata_cpu" in fits else float("nan")
        lines.append(
            f"| {r['chunks']:,} | {r['procs']} | {c.get('load_gather_plans', 0):.3f}"
            f" | {c.get('load_global_plan', 0):.3f} | {c.get('load_scatter_plans', 0):.3f}"
            f" | {r['load_coordinator_cpu_s']:.3f} | {m:.3f}"
            f" | {m / r['load_coordinator_cpu_s']:.2f} | {r['load_coordinator_wall_s']:.3f}"
            f" | {r['read_metadata_cpu_s'] or 0:.3f} | {mr:.3f}"
            f" | {r['read_metadata_wall_s'] or 0:.3f}, {r['rank1_read_metadata_wall_s'] or 0:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--chunks", default="7275,56000,120000,325876",
                    help="chunk counts (comma-separated)")
    ap.add_argument("--procs", default="4", help="processes in the group (comma-separated)")
    ap.add_argument("--caching", default="off,on", help="plan caching modes: off, on")
    ap.add_argument("--saves", type=int, default=2, help="saves per group")
    ap.add_argument("--per-rank", type=int, default=172,
                    help="chunks per virtual rank (405B TP8xPP16xFSDP128: 2,813,937 / 16,384)")
    ap.add_argument("--shards", type=int, default=128, help="ranks sharing a tensor (FSDP)")
    ap.add_argument("--writer", choices=("fs", "null"), default="fs",
                    help="fs: FileSystemWriter; null: its write_data writes nothing")
    ap.add_argument("--no-load", dest="load", action="store_false",
                    help="skip the load after each save (planning only: DCP's load with a "
                         "reader that reads .metadata, not the data)")
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default: TMPDIR)")
    ap.add_argument("--fit-from", default="",
                    help="JSON files of earlier runs whose rows join the fit")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch

    rows: list[dict[str, Any]] = []
    for extra in filter(None, args.fit_from.split(",")):
        rows += json.loads(Path(extra).read_text())["rows"]
    modes = [{"off": False, "on": True}[m] for m in args.caching.split(",")]
    for procs in (int(p) for p in args.procs.split(",")):
        for caching in modes:
            for chunks in (int(c) for c in args.chunks.split(",") if c):
                for row in measure(chunks, procs, caching, args):
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if not k.startswith("steps")}),
                          flush=True)
    fitted = [r for r in rows if r["writer"] == "fs"] or rows
    # the saves that planned, both writers (the null writer's coordinator steps are the
    # same): CPU seconds grow slightly faster than the chunks (k > 1: the power law is the
    # model; the line is printed beside it)
    everything = [r for r in rows if planned(r)]
    fits = {"cpu_planned": fit_power(everything, "coordinator_cpu_s"),
            "cpu_planned_fs_power": fit_power([r for r in fitted if planned(r)],
                                              "coordinator_cpu_s"),
            "cpu_planned_fs_line": fit([r for r in fitted if planned(r)], "coordinator_cpu_s"),
            "wall_planned": fit_power(everything, "coordinator_wall_s")}
    cached = [r for r in fitted if not planned(r)]
    if cached:
        fits["cpu_cached"] = fit(cached, "coordinator_cpu_s")
        fits["wall_cached"] = fit(cached, "coordinator_wall_s")
    received = [r for r in rows if r.get("rank1_broadcast_cpu_s")]
    if received:  # every rank receives and unpickles the Metadata after a save
        fits["rank1_broadcast_cpu"] = fit(received, "rank1_broadcast_cpu_s")
    loads = [r for r in rows if r.get("load_coordinator_cpu_s")]
    if loads:
        for key in ("load_coordinator_cpu_s", "load_coordinator_wall_s", "read_metadata_cpu_s",
                    "read_metadata_wall_s"):
            fits[key.replace("_s", "").replace("coordinator_", "")] = fit(loads, key)
    out = {
        "source": {"torch": torch.__version__, "python": platform.python_version(),
                   "machine": platform.machine(), "cpus": os.cpu_count(),
                   "cpu": _cpu_model(), "load_average": os.getloadavg(),
                   "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "per_rank": args.per_rank, "shards": args.shards, "writer": args.writer},
        "rows": rows, "fit": fits,
    }
    print(json.dumps(fits, indent=1))
    print(table(rows, fits))
    print()
    print(summary(rows, fits))
    if any("load_wall_s" in r for r in rows):
        print()
        print(load_table(rows, fits))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


if __name__ == "__main__":
    main()
