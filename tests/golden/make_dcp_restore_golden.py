"""Produce golden DCP *load* files: what real torch DCP reads when a job restarts.

Dev tool beside make_dcp_golden.py (whose model, layouts and process set-up it reuses);
needs torch (CPU is enough), the project never imports it. For each case it reads
``tests/golden/dcp_restore/<case>.toml``: the model and the training layout
(``[parallel]``) save a checkpoint exactly as make_dcp_golden.py does; then the same model
under the restore layout (``[restore]``, every key defaulting to ``[parallel]``'s) on its
own world of spawned processes takes an AdamW step on zero gradients (so the optimizer has
state to load into) and calls ``dcp.load({"model": ..., "optim": ...})`` through a
``FileSystemReader`` subclass that records, per rank and in the order DCP asks for them,
every read item: the saved chunk (key, offsets, sizes) or non-tensor item, the file and
byte range it comes from. ``tests/golden/dcp_restore/<case>.json`` holds the result and the
checkpoint's ``.metadata`` size with its entry counts.

Usage (from the repository root, with any python that has torch):

    python tests/golden/make_dcp_restore_golden.py               # all cases
    python tests/golden/make_dcp_restore_golden.py hsdp_same     # some cases
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_dcp_golden import (
    DTYPES,
    ITEMSIZE,
    Transformer,
    _apply_layout,
    _free_port,
    _worker,
)

HERE = Path(__file__).resolve().parent
CASE_DIR = HERE / "dcp_restore"
SCHEMA = "ckptbench.dcp-restore-golden/1"
CASES = sorted(p.stem for p in CASE_DIR.glob("*.toml"))


class RecordingReader(dcp.FileSystemReader):
    """FileSystemReader that writes down each read item of the load plan before reading it."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.reads: list[dict] = []
        self.metadata_reads = 0

    def read_metadata(self, *args, **kwargs):  # type: ignore[override]
        self.metadata_reads += 1
        return super().read_metadata(*args, **kwargs)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):  # type: ignore[override]
        self._md = metadata
        return super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    def read_data(self, plan, planner):  # type: ignore[override]
        from torch.distributed.checkpoint.metadata import BytesStorageMetadata

        dtype_names = {v: k for k, v in DTYPES.items()}
        for item in plan.items:
            index = item.storage_index
            info = self.storage_data[index]
            smd = self._md.state_dict_metadata[index.fqn]
            entry = {"path": info.relative_path, "key": index.fqn,
                     "file_offset": info.offset, "length": info.length}
            if isinstance(smd, BytesStorageMetadata):
                entry["kind"] = "bytes"
            else:
                chunk = smd.chunks[index.index]
                assert list(chunk.offsets) == list(index.offset), (index, chunk)
                dtype = dtype_names[smd.properties.dtype]
                entry.update(kind="tensor", offsets=list(chunk.offsets), sizes=list(chunk.sizes),
                             nbytes=math.prod(chunk.sizes) * ITEMSIZE[dtype])
            self.reads.append(entry)
        return super().read_data(plan, planner)


def _load_worker(rank: int, world: int, port: int, workload: dict, ckpt: str, out: str) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        torch.manual_seed(1)
        model = Transformer(workload["model"]).to(DTYPES[workload["state"]["param_dtype"]])
        _apply_layout(model, workload["parallel"])
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        opt.step()
        model_sd, optim_sd = get_state_dict(model, opt)
        reader = RecordingReader(ckpt)
        dcp.load({"model": model_sd, "optim": optim_sd}, storage_reader=reader)
        Path(out, f"reads_{rank}.json").write_text(json.dumps(
            {"rank": rank, "metadata_reads": reader.metadata_reads, "reads": reader.reads}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _metadata_facts(ckpt: Path) -> dict:
    """.metadata size and what it indexes (for bytes per entry)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    md = dcp.FileSystemReader(str(ckpt)).read_metadata()
    tensor_keys = [k for k, v in md.state_dict_metadata.items()
                   if not isinstance(v, BytesStorageMetadata)]
    return {
        "bytes": (ckpt / ".metadata").stat().st_size,
        "tensor_keys": len(tensor_keys),
        "bytes_keys": len(md.state_dict_metadata) - len(tensor_keys),
        "chunks": sum(len(md.state_dict_metadata[k].chunks) for k in tensor_keys),
        "storage_entries": len(md.storage_data),
    }


def run_case(case: str) -> Path:
    workload = tomllib.loads((CASE_DIR / f"{case}.toml").read_text())
    save_par = workload["parallel"]
    restore_par = {**save_par, **workload.get("restore", {})}
    tmp = Path(tempfile.mkdtemp(prefix=f"dcp_restore_{case}_"))
    try:
        ckpt, out = tmp / "ckpt", tmp / "reads"
        out.mkdir()
        mp.spawn(_worker, args=(save_par["world_size"], _free_port(), workload, str(ckpt), 1),
                 nprocs=save_par["world_size"], join=True)
        load_workload = {**workload, "parallel": restore_par}
        world = restore_par["world_size"]
        mp.spawn(_load_worker, args=(world, _free_port(), load_workload, str(ckpt), str(out)),
                 nprocs=world, join=True)
        ranks = [json.loads((out / f"reads_{r}.json").read_text()) for r in range(world)]
        saved = {p.name: p.stat().st_size for p in sorted(ckpt.iterdir()) if p.is_file()}
        golden = {
            "schema": SCHEMA,
            "torch_version": torch.__version__.split("+")[0],
            "case": case,
            "save_world_size": save_par["world_size"],
            "world_size": world,
            "metadata": _metadata_facts(ckpt),
            "file_sizes": saved,
            "ranks": ranks,
        }
        path = CASE_DIR / f"{case}.json"
        path.write_text(_dump(golden))
        return path
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _dump(golden: dict) -> str:
    """Compact JSON, one read per line."""
    c = lambda obj: json.dumps(obj, separators=(", ", ": "))  # noqa: E731
    lines = ["{"]
    for k in ("schema", "torch_version", "case", "save_world_size", "world_size", "metadata",
              "file_sizes"):
        lines.append(f"  {c(k)}: {c(golden[k])},")
    lines.append('  "ranks": [')
    for i, r in enumerate(golden["ranks"]):
        lines.append(f'    {{"rank": {r["rank"]}, "metadata_reads": {r["metadata_reads"]}, "reads": [')
        for j, item in enumerate(r["reads"]):
            lines.append(f"      {c(item)}{',' if j < len(r['reads']) - 1 else ''}")
        lines.append("    ]}" + ("," if i < len(golden["ranks"]) - 1 else ""))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cases = argv or CASES
    for case in cases:
        if case not in CASES:
            print(f"unknown case {case!r}; known: {', '.join(CASES)}", file=sys.stderr)
            return 2
    failed = []
    for case in cases:
        try:
            print(f"{case}: {run_case(case).relative_to(HERE.parent.parent)}", flush=True)
        except Exception as exc:
            print(f"{case}: FAILED ({type(exc).__name__}: {str(exc)[:300]})", flush=True)
            failed.append(case)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
