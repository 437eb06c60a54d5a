"""Produce golden DCP placement files by running real torch.distributed.checkpoint.

Dev tool, not part of the package: it needs torch (CPU build is enough), the project
never imports it. For each case it reads ``tests/golden/dcp/<case>.toml``, builds a
torchtitan-style Llama with torchtitan's module names, applies the parallel layout
(TP with parallelize_module, then FSDP2/HSDP with fully_shard) on CPU/gloo across
``world_size`` spawned processes, takes one AdamW step on zero gradients, saves
``{"model": ..., "optim": ...}`` from ``get_state_dict`` with ``dcp.save`` and writes
``tests/golden/dcp/<case>.json`` describing where every chunk landed.

Usage (from the repository root, with any python that has torch):

    python tests/golden/make_dcp_golden.py            # all cases
    python tests/golden/make_dcp_golden.py hsdp tp    # some cases

Only torch + stdlib are used.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import sys
import tempfile
import tomllib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch import nn

HERE = Path(__file__).resolve().parent
DCP_DIR = HERE / "dcp"
SCHEMA = "ckptbench.dcp-golden/1"

# case name -> (workload toml stem, FileSystemWriter thread_count)
CASES: dict[str, tuple[str, int]] = {
    "fsdp2_even": ("fsdp2_even", 1),
    "fsdp2_uneven": ("fsdp2_uneven", 1),
    "fsdp2_uneven_threads2": ("fsdp2_uneven_threads2", 2),
    "fsdp2_bf16": ("fsdp2_bf16", 1),
    "hsdp": ("hsdp", 1),
    # HSDP whose replica ties DCP's 12 optim.param_groups items decide (issue 42)
    "hsdp2x4": ("hsdp2x4", 1),
    "hsdp4x4": ("hsdp4x4", 1),
    "tp": ("tp", 1),
    "tp_fsdp2_uneven": ("tp_fsdp2_uneven", 1),
    # the workloads/tiny.toml layout, whose plan the issue's JSON example shows
    "tiny": ("tiny", 1),
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


# --- the model: torchtitan Llama module names and registration order ---


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        head_dim = dim // heads
        self.wq = nn.Linear(dim, heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, dim, bias=False)


class FeedForward(nn.Module):
    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, ffn_dim: int) -> None:
        super().__init__()
        self.attention = Attention(dim, heads, kv_heads)
        self.feed_forward = FeedForward(dim, ffn_dim)
        self.attention_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)


class Transformer(nn.Module):
    def __init__(self, m: dict) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(m["vocab_size"], m["dim"])
        self.layers = nn.ModuleDict()
        for i in range(m["layers"]):
            self.layers[str(i)] = TransformerBlock(
                m["dim"], m["heads"], m["kv_heads"], m["ffn_dim"]
            )
        self.norm = RMSNorm(m["dim"])
        self.output = nn.Linear(m["dim"], m["vocab_size"], bias=False)


# --- one rank ---


def _apply_layout(model: nn.Module, par: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    world = par["world_size"]
    tp = par.get("tp", 1)
    rep = par.get("dp_replicate", 1)
    shard = world // (tp * rep)
    # tp innermost: rank = (rep_idx * dp_shard + shard_idx) * tp + tp_idx
    mesh = init_device_mesh(
        "cpu", (rep, shard, tp), mesh_dim_names=("dp_replicate", "dp_shard", "tp")
    )
    if tp > 1:
        tp_mesh = mesh["tp"]
        parallelize_module(
            model,
            tp_mesh,
            {"tok_embeddings": RowwiseParallel(), "output": ColwiseParallel()},
        )
        for block in model.layers.values():
            parallelize_module(
                block,
                tp_mesh,
                {
                    "attention.wq": ColwiseParallel(),
                    "attention.wk": ColwiseParallel(),
                    "attention.wv": ColwiseParallel(),
                    "attention.wo": RowwiseParallel(),
                    "feed_forward.w1": ColwiseParallel(),
                    "feed_forward.w2": RowwiseParallel(),
                    "feed_forward.w3": ColwiseParallel(),
                },
            )
    if rep * shard > 1:
        dp_mesh = mesh["dp_replicate", "dp_shard"] if rep > 1 else mesh["dp_shard"]
        for block in model.layers.values():
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)


def _recording_planner(plans_dir: str, rank: int) -> dcp.DefaultSavePlanner:
    """DCP's default save planner (the one dcp.save makes when given none), writing down
    this rank's local plan -- what it sends the coordinator, before dedup -- as
    ``<plans_dir>/<rank>.json``: each write item's flattened key and chunk offsets (None
    for a non-tensor item), in plan order."""

    class Recording(dcp.DefaultSavePlanner):  # type: ignore[misc]
        def create_local_plan(self):  # type: ignore[no-untyped-def]
            plan = super().create_local_plan()
            items = [[it.index.fqn, None if it.tensor_data is None else list(it.index.offset)]
                     for it in plan.items]
            Path(plans_dir, f"{rank}.json").write_text(json.dumps(items))
            return plan

    return Recording()


def _worker(rank: int, world: int, port: int, workload: dict, out_dir: str, threads: int,
            plans_dir: str | None = None) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        torch.manual_seed(0)
        dtype = DTYPES[workload["state"]["param_dtype"]]
        model = Transformer(workload["model"]).to(dtype)
        _apply_layout(model, workload["parallel"])
        for p in model.parameters():
            p.grad = torch.zeros_like(p)  # DTensor in, DTensor out: same placements
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        opt.step()
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd}
        planner = _recording_planner(plans_dir, rank) if plans_dir else None
        if threads == 1:
            dcp.save(state, checkpoint_id=out_dir, planner=planner)  # the default FileSystemWriter
        else:
            dcp.save(state, storage_writer=dcp.FileSystemWriter(out_dir, thread_count=threads),
                     planner=planner)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- what torch.save writes: an exact, torch-free model, checked against every item ---
#
# DCP (FileSystemWriter, torch_save format) writes each tensor chunk as torch.save(tensor)
# and each non-tensor value as torch.save(obj), back to back. torch.save writes a zip
# (PyTorch's miniz writer): records archive/data.pkl, .format_version, .storage_alignment,
# byteorder, data/0 (the raw bytes; absent for non-tensors), version,
# .data/serialization_id. Every record's data starts 64-byte aligned via a 'FB' padding
# extra field (4-byte header + fill); a non-empty record is followed by a data descriptor
# (16 bytes, 24 with zip64); the end is the central directory (46 + name per entry), a
# zip64 end record (56), its locator (20) and the end record (22). zip64 extras appear
# for records of >= 4 GiB or at offsets >= 4 GiB.

STORAGE_NAMES = {"float32": "FloatStorage", "bfloat16": "BFloat16Storage", "float16": "HalfStorage"}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def _pickled_int(v: int) -> int:
    if v < 256:
        return 2  # BININT1
    if v < 65536:
        return 3  # BININT2
    if v < 2**31:
        return 5  # BININT
    return 3 + v.bit_length() // 8  # LONG1


def _pickled_tuple(values: list[int], memo: int) -> tuple[int, int]:
    if not values:
        return 1, memo  # EMPTY_TUPLE, not memoized
    n = sum(_pickled_int(v) for v in values) + (1 if len(values) <= 3 else 2)  # TUPLEn | MARK+TUPLE
    return n + (2 if memo < 256 else 5), memo + 1  # BINPUT | LONG_BINPUT


def tensor_pickle_length(shape: list[int], dtype: str) -> int:
    """len(archive/data.pkl) for a contiguous CPU tensor (protocol 2, _rebuild_tensor_v2)."""
    stride = [math.prod(max(s, 1) for s in shape[i + 1 :]) for i in range(len(shape))]
    n = 2 + 33 + 2  # PROTO, GLOBAL torch._utils _rebuild_tensor_v2, BINPUT
    n += 1 + 1 + 12 + 2  # MARK, MARK, 'storage', BINPUT
    n += 1 + 6 + len(STORAGE_NAMES[dtype]) + 1 + 2  # GLOBAL torch <X>Storage, BINPUT
    n += 6 + 2 + 8 + 2  # '0', BINPUT, 'cpu', BINPUT
    n += _pickled_int(math.prod(shape)) + 1 + 2  # numel, TUPLE, BINPUT
    n += 1 + 2  # BINPERSID, storage_offset 0
    memo = 6
    t, memo = _pickled_tuple(list(shape), memo)
    n += t
    t, memo = _pickled_tuple(stride, memo)
    n += t
    n += 1 + 25 + 2 + 1 + 1 + 2 + 1 + 2 + 1 + 2 + 1  # False, OrderedDict(), closing ops, STOP
    return n


def torch_save_length(pickle_length: int, data_bytes: int | None) -> int:
    """Bytes torch.save writes to a stream, given len(data.pkl) and the raw tensor bytes
    (None for a non-tensor object, whose data.pkl is pickle.dumps(obj, protocol=2))."""
    records = [
        ("data.pkl", pickle_length),
        (".format_version", 1),
        (".storage_alignment", 2),
        ("byteorder", 6),
    ]
    if data_bytes is not None:
        records.append(("data/0", data_bytes))
    records += [("version", 2), (".data/serialization_id", 40)]
    pos = central = 0
    for entry, size in records:
        name = "archive/" + entry
        z64 = size >= 0xFFFFFFFF or pos >= 0xFFFFFFFF
        zip64_extra = (4 + 16 * (size >= 0xFFFFFFFF) + 8 * (pos >= 0xFFFFFFFF)) if z64 else 0
        header = pos + 30 + len(name) + zip64_extra
        padding = 4 + (-(header + 4)) % 64
        pos = header + padding + size + ((24 if z64 else 16) if size else 0)
        central += 46 + len(name) + zip64_extra
    return pos + central + 56 + 20 + 22


def tensor_item_length(sizes: list[int], dtype: str) -> int:
    """File bytes of one DCP tensor item (a chunk of `sizes`, contiguous)."""
    return torch_save_length(tensor_pickle_length(sizes, dtype), math.prod(sizes) * ITEMSIZE[dtype])


# --- reading the result ---


def _describe(ckpt_dir: Path, case: str, world: int) -> dict:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    md = dcp.FileSystemReader(str(ckpt_dir)).read_metadata()
    files: dict[str, list[dict]] = {}
    bytes_spans: dict[str, list[dict]] = {}
    for index, info in md.storage_data.items():
        smd = md.state_dict_metadata[index.fqn]
        if isinstance(smd, BytesStorageMetadata):
            bytes_spans.setdefault(info.relative_path, []).append(
                {"key": index.fqn, "file_offset": info.offset, "length": info.length}
            )
            continue
        assert isinstance(smd, TensorStorageMetadata)
        chunk = smd.chunks[index.index] if index.index is not None else None
        if chunk is None or list(chunk.offsets) != list(index.offset or []):
            chunk = next(c for c in smd.chunks if list(c.offsets) == list(index.offset or []))
        files.setdefault(info.relative_path, []).append(
            {
                "key": index.fqn,
                "dtype": DTYPE_NAMES[smd.properties.dtype],
                "global_shape": list(smd.size),
                "offsets": list(chunk.offsets),
                "sizes": list(chunk.sizes),
                "file_offset": info.offset,
                "length": info.length,
            }
        )
    for items in files.values():
        items.sort(key=lambda it: it["file_offset"])
    for spans in bytes_spans.values():
        spans.sort(key=lambda it: it["file_offset"])
    file_sizes = {p.name: p.stat().st_size for p in sorted(ckpt_dir.iterdir()) if p.is_file()}
    return {
        "schema": SCHEMA,
        "torch_version": torch.__version__.split("+")[0],
        "case": case,
        "world_size": world,
        "files": {k: files[k] for k in sorted(files, key=_file_sort_key)},
        "file_sizes": file_sizes,
        "bytes_items": {
            k: [s["key"] for s in bytes_spans[k]] for k in sorted(bytes_spans, key=_file_sort_key)
        },
        "bytes_item_spans": {k: bytes_spans[k] for k in sorted(bytes_spans, key=_file_sort_key)},
    }


def _file_sort_key(name: str) -> tuple:
    if name.startswith("__") and name.endswith(".distcp"):
        rank, idx = name[2 : -len(".distcp")].split("_")
        return (0, int(rank), int(idx))
    return (1, name)


def _check_dedup(golden: dict) -> None:
    """torch's own dedup_save_plans, run on the recorded local plans, keeps each tensor
    item on the rank whose file holds it (the local plans are what the coordinator got)."""
    from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )

    chunks = {(it["key"], tuple(it["offsets"])): it
              for items in golden["files"].values() for it in items}
    plans = []
    for r in range(golden["world_size"]):
        items = []
        for key, offsets in golden["local_plans"][str(r)]:
            if offsets is None:
                items.append(WriteItem(index=MetadataIndex(key), type=WriteItemType.BYTE_IO))
                continue
            t = chunks[(key, tuple(offsets))]
            items.append(WriteItem(
                index=MetadataIndex(key, torch.Size(offsets)), type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(torch.Size(offsets), torch.Size(t["sizes"])),
                    properties=TensorProperties(dtype=DTYPES[t["dtype"]]),
                    size=torch.Size(t["global_shape"]))))
        plans.append(SavePlan(items))
    kept = {(it.index.fqn, tuple(it.index.offset)): r
            for r, p in enumerate(dedup_save_plans(plans)) for it in p.items if it.tensor_data}
    written = {(it["key"], tuple(it["offsets"])): int(name[2:].split("_")[0])
               for name, items in golden["files"].items() for it in items}
    assert kept == written, "dedup_save_plans on the local plans disagrees with the files"


def _check(golden: dict, ckpt_dir: Path) -> None:
    """Each tensor fully covered once; items of a file tile it without gaps or overlaps;
    every item's length is what the torch.save model above predicts."""
    import io
    import pickle

    itemsize = ITEMSIZE
    per_key: dict[str, list[dict]] = {}
    for items in golden["files"].values():
        for it in items:
            per_key.setdefault(it["key"], []).append(it)
    for key, chunks in per_key.items():
        shape = chunks[0]["global_shape"]
        total = sum(math.prod(c["sizes"]) for c in chunks)
        assert total == math.prod(shape), (key, total, shape)
        assert (
            sum(math.prod(c["sizes"]) * itemsize[c["dtype"]] for c in chunks)
            == math.prod(shape) * itemsize[chunks[0]["dtype"]]
        )
        boxes = [(c["offsets"], c["sizes"]) for c in chunks if math.prod(c["sizes"]) > 0]
        for i, (o1, s1) in enumerate(boxes):
            assert all(o + s <= g for o, s, g in zip(o1, s1, shape, strict=True)), (key, o1, s1)
            for o2, s2 in boxes[i + 1 :]:
                overlap = all(
                    max(a, b) < min(a + x, b + y) for a, x, b, y in zip(o1, s1, o2, s2, strict=True)
                )
                assert not overlap, (key, o1, s1, o2, s2)
    for name, items in golden["files"].items():
        for it in items:
            assert it["length"] == tensor_item_length(it["sizes"], it["dtype"]), (name, it)
    for name, spans in golden["bytes_item_spans"].items():
        raw = (ckpt_dir / name).read_bytes()
        for sp in spans:
            blob = raw[sp["file_offset"] : sp["file_offset"] + sp["length"]]
            obj = torch.load(io.BytesIO(blob), weights_only=False)
            expect = torch_save_length(len(pickle.dumps(obj, protocol=2)), None)
            assert sp["length"] == expect, (name, sp, obj, expect)
    for name, size in golden["file_sizes"].items():
        if name == ".metadata":
            continue
        spans = [(s["file_offset"], s["length"]) for s in golden["bytes_item_spans"].get(name, [])]
        spans += [(t["file_offset"], t["length"]) for t in golden["files"].get(name, [])]
        spans.sort()
        pos = 0
        for off, length in spans:
            assert off == pos, (name, off, pos)
            pos += length
        assert pos == size, (name, pos, size)


def _dump(golden: dict) -> str:
    """Compact JSON, one item per line."""
    c = lambda obj: json.dumps(obj, separators=(", ", ": "))  # noqa: E731
    lines = ["{"]
    head = ["schema", "torch_version", "case", "world_size"]
    for k in head:
        lines.append(f"  {c(k)}: {c(golden[k])},")
    sections = ("files", "file_sizes", "bytes_items", "bytes_item_spans", "local_plans")
    for section in sections:
        body = golden[section]
        lines.append(f"  {c(section)}: {{")
        names = list(body)
        for i, name in enumerate(names):
            sep = "," if i < len(names) - 1 else ""
            val = body[name]
            if isinstance(val, list):
                lines.append(f"    {c(name)}: [")
                for j, it in enumerate(val):
                    lines.append(f"      {c(it)}{',' if j < len(val) - 1 else ''}")
                lines.append(f"    ]{sep}")
            else:
                lines.append(f"    {c(name)}: {c(val)}{sep}")
        lines.append("  }" + ("," if section != sections[-1] else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def run_case(case: str) -> Path:
    stem, threads = CASES[case]
    workload = tomllib.loads((DCP_DIR / f"{stem}.toml").read_text())
    assert workload["checkpoint"].get("threads", 1) == threads, case
    world = workload["parallel"]["world_size"]
    tmp = Path(tempfile.mkdtemp(prefix=f"dcp_golden_{case}_"))
    try:
        ckpt, plans = tmp / "ckpt", tmp / "plans"
        plans.mkdir()
        mp.spawn(
            _worker,
            args=(world, _free_port(), workload, str(ckpt), threads, str(plans)),
            nprocs=world,
            join=True,
        )
        golden = _describe(ckpt, case, world)
        golden["local_plans"] = {
            str(r): json.loads((plans / f"{r}.json").read_text()) for r in range(world)
        }
        _check(golden, ckpt)
        _check_dedup(golden)
        out = DCP_DIR / f"{case}.json"
        out.write_text(_dump(golden))
        json.loads(out.read_text())
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cases = argv or list(CASES)
    for case in cases:
        if case not in CASES:
            print(f"unknown case {case!r}; known: {', '.join(CASES)}", file=sys.stderr)
            return 2
    for case in cases:
        print(f"{case}: {run_case(case).relative_to(HERE.parent.parent)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
