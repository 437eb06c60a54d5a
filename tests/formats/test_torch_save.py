"""The torch-save format: DLIO's torch.save files, written without torch.

With torch (installed here, or a Python that has it named by CKPTBENCH_TORCH_PYTHON):
the containers equal torch.save's byte for byte and torch.load reads what a run wrote.
Without it: Python's zipfile checks the zip and every CRC, a stub unpickler the pickle,
and the sizes follow the formula (tensor bytes + the derived container overhead).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptbench.formats.base import file_jobs
from ckptbench.formats.torch_save import TorchSaveFormat, _Stream, dlio_file_bytes, dlio_state
from ckptbench.formats.torch_save_container import (
    ITEMSIZE,
    U32,
    State,
    Tensor,
    container_overhead,
    container_size,
    entries,
    lay_out,
    pickle_state,
    write_container,
)
from ckptbench.payload import PayloadGenerator
from ckptbench.plan import build_plan
from ckptbench.spec import load_workload, scaled

from .conftest import ROOT, ckptbench, records

MLPERF = {n: ROOT / "workloads" / f"mlperf-llama3-{n}.toml" for n in ("8b", "70b", "405b", "1t")}


def _torch_python() -> str | None:
    named = os.environ.get("CKPTBENCH_TORCH_PYTHON")
    if named:
        return named
    return sys.executable if importlib.util.find_spec("torch") else None


TORCH = _torch_python()
needs_torch = pytest.mark.skipif(
    TORCH is None, reason="torch is not installed (pip install -e '.[torch]', or set "
                          "CKPTBENCH_TORCH_PYTHON to a Python that has it)")


def run_torch(script: str, *args: str) -> str:
    assert TORCH is not None
    r = subprocess.run([TORCH, "-c", script, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


# DLIO's state shapes: keys made with str(i), tensors by torch.rand(n, dtype=...), zero
# sizes left out, nested per layer (model files) or flat (optimizer, per-layer files).
TORCH_SAVE = r"""
import io, json, sys, torch
spec = json.loads(sys.argv[1])
def build(d):
    out = {}
    for k, v in d:
        if isinstance(v[0], list):
            out[str(int(k))] = build(v)
        elif v[0] > 0:
            out[str(int(k))] = torch.rand(v[0], dtype=getattr(torch, v[1]))
    return out
buf = io.BytesIO()
torch.save(build(spec), buf)
sys.stdout.write(buf.getvalue().hex())
"""

SPECS: list[list[Any]] = [
    [["0", [["0", [5, "float16"]], ["1", [3, "float16"]]]], ["12", [["0", [4, "float16"]]]]],
    # > 256 memo entries (LONG_BINPUT/LONG_BINGET), a zero-sized tensor, bf16 and ints >= 2**16
    [[str(i), [["0", [7 * i + 1, "float16"]], ["1", [300, "float16"]], ["2", [0, "float16"]],
               ["3", [70000 + i, "bfloat16"]]]] for i in range(60)],
    [[str(i), [100000 * i + 3, "float32"]] for i in range(6)],
]


def _state(spec: list[Any]) -> State:
    out: State = {}
    for k, v in spec:
        if isinstance(v[0], list):
            out[k] = _state(v)
        elif v[0] > 0:
            out[k] = Tensor(v[0], v[1])
    return out


@needs_torch
@pytest.mark.parametrize("spec", SPECS, ids=["small", "memo-256", "flat-fp32"])
def test_container_equals_torch_save(spec: list[Any]) -> None:
    real = bytes.fromhex(run_torch(TORCH_SAVE, json.dumps(spec)))
    z = zipfile.ZipFile(io.BytesIO(real))
    datas = sorted((n for n in z.namelist() if "/data/" in n), key=lambda n: int(n.rsplit("/")[-1]))
    sid = int(z.read("archive/.data/serialization_id"))
    ours = write_container(_state(spec), [z.read(n) for n in datas], sid)
    assert ours == real
    assert container_size(_state(spec)) == len(real)


def _small_plan(name: str = "8b", scale: int = 32) -> Any:
    return build_plan(scaled(load_workload(MLPERF[name]), scale))


def _run(tmp_path: Path, *extra: str) -> tuple[Path, list[dict[str, Any]]]:
    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    r = ckptbench("run", str(MLPERF["8b"]), "--scale", "32", "--ranks", "0-1", "--format",
                  "torch-save", "--target", str(target), "--results", str(results), *extra)
    assert r.returncode == 0, r.stderr
    recs = records(results)
    ckpt = next(x["checkpoint"] for x in recs if x["type"] == "phase")
    return target / ckpt, recs


def _expected_tensors(plan: Any, file: int, ckpt_dir: Path) -> list[bytes]:
    job = next(j for j in file_jobs(plan, [int(plan.file_rank[file])], str(ckpt_dir), 1, 0)
               if j.index == file)
    gen = PayloadGenerator("random", 0)
    out = []
    for r in job.regions:
        start = r.start // 8 * 8
        buf = np.zeros((r.end - start + 7) // 8 * 8, dtype=np.uint8)
        gen.fill(job.base, [r], start, buf)
        out.append(buf[r.start - start:r.end - start].tobytes())
    return out


class _Stub(pickle.Unpickler):
    """Reads data.pkl without torch: tensors become (storage key, dtype, numel, shape)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, shape, stride, grad, hooks: (*storage, tuple(shape))
        if module == "torch":
            return name
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        _tag, storage, key, _where, numel = pid
        return (key, storage, numel)


def test_run_files_are_dlio_containers_without_torch(tmp_path: Path) -> None:
    """The files a run writes: valid zips (every CRC checked by zipfile), DLIO's state in
    the pickle, the generator's bytes in data/k, and sizes = tensor bytes + overhead."""
    ckpt, recs = _run(tmp_path, "--keep")
    assert all(x["verified"] for x in recs if x["type"] == "phase" and x["phase"] == "restore")
    plan = _small_plan()
    files = [f for f in range(len(plan.file_paths)) if int(plan.file_rank[f]) in (0, 1)]
    assert len(files) == 4
    for f in files:
        path = ckpt / plan.file_paths[f]
        state = dlio_state(plan, f)
        tensors = pickle_state(state)[1]
        tensor_bytes = sum(t.nbytes for t in tensors)
        assert tensor_bytes == int(plan.file_bytes[f])
        assert path.stat().st_size == dlio_file_bytes(plan, f) \
            == tensor_bytes + container_overhead(state)
        z = zipfile.ZipFile(path)
        assert z.testzip() is None
        assert z.read("archive/byteorder") == b"little" and z.read("archive/version") == b"3\n"
        loaded = _Stub(io.BytesIO(z.read("archive/data.pkl"))).load()
        if "optim" in path.name:
            assert list(loaded) == ["0", "1", "2", "3", "4", "5"]
            assert loaded["0"][1:] == ("FloatStorage", tensors[0].numel, (tensors[0].numel,))
        else:
            assert list(loaded) == [str(i) for i in range(plan.workload.model.layers + 3)]
            assert [k for k, _, _, _ in loaded["1"].values()] == ["1", "2", "3", "4", "5", "6"]
        for k, want in enumerate(_expected_tensors(plan, f, ckpt)):
            assert z.read(f"archive/data/{k}") == want


@needs_torch
def test_torch_load_reads_what_a_run_wrote(tmp_path: Path) -> None:
    ckpt, _ = _run(tmp_path, "--keep", "--no-restore")
    plan = _small_plan()
    script = r"""
import hashlib, json, sys, torch
def flat(d, p=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from flat(v, p + k + ".")
        else:
            yield p + k, str(v.dtype), list(v.shape), hashlib.sha256(v.numpy().tobytes() if v.dtype != torch.bfloat16 else v.view(torch.int16).numpy().tobytes()).hexdigest()
print(json.dumps({f: list(flat(torch.load(f, weights_only=True))) for f in sys.argv[1:]}))
"""
    files = [f for f in range(len(plan.file_paths)) if int(plan.file_rank[f]) in (0, 1)]
    got = json.loads(run_torch(script, *[str(ckpt / plan.file_paths[f]) for f in files]))
    for f in files:
        entries = got[str(ckpt / plan.file_paths[f])]
        tensors = pickle_state(dlio_state(plan, f))[1]
        want = _expected_tensors(plan, f, ckpt)
        assert [e[1] for e in entries] == [f"torch.{t.dtype}" for t in tensors]
        assert [e[2] for e in entries] == [[t.numel] for t in tensors]
        assert [e[3] for e in entries] == [hashlib.sha256(b).hexdigest() for b in want]


@pytest.mark.parametrize("name", list(MLPERF))
def test_full_size_files_follow_the_formula(name: str) -> None:
    """At full size every file is its tensor bytes plus the overhead derived from its
    pickle and zip records (no observed constant): a few KB to ~135 KB per file."""
    plan = build_plan(load_workload(MLPERF[name]))
    for f in list(plan.files_of_rank(0)) + list(plan.files_of_rank(plan.world_size - 1)):
        state = dlio_state(plan, f)
        tensors = pickle_state(state)[1]
        assert sum(t.nbytes for t in tensors) == int(plan.file_bytes[f])
        over = container_overhead(state)
        assert container_size(state) == int(plan.file_bytes[f]) + over
        # at least the pickle, 9 + len(tensors) headers and the end records; at most 64 KB
        # of alignment fill and headers per ~1 KB of pickle per tensor
        assert 1500 < over < 200 * 1024, (plan.file_paths[f], over)


def test_zip64_where_records_pass_4_gib() -> None:
    """Past 4 GiB (a record that large, or one that starts there) a record takes a zip64
    extra field and a 24-byte descriptor: the 8b optimizer files' later groups start past
    4 GiB; the 70b optimizer groups are larger than 4 GiB."""
    for name, want_big in (("8b", False), ("70b", True)):
        plan = build_plan(load_workload(MLPERF[name]))
        f = next(f for f in plan.files_of_rank(0) if "optim" in plan.file_paths[f])
        pkl, tensors = pickle_state(dlio_state(plan, f))
        recs, central = lay_out(entries(len(pkl), tensors))
        assert any(t.nbytes >= U32 for t in tensors) == want_big
        for r in recs:
            assert r.zip64 == (r.size >= U32 or r.header_offset >= U32)
            assert r.data_offset % 64 == 0
            assert len(r.descriptor(0)) == (0 if not r.size else 24 if r.zip64 else 16)
        assert any(r.zip64 for r in recs) and central > 2 * U32


def test_restore_names_a_corrupted_tensor(tmp_path: Path) -> None:
    plan = _small_plan()
    jobs = file_jobs(plan, [0], "c", 1, 0)
    fmt = TorchSaveFormat.__new__(TorchSaveFormat)
    fmt.plan, fmt.gen = plan, PayloadGenerator("random", 0)
    cjobs = fmt._containers(jobs)
    job = cjobs[0]
    buf = np.empty(job.size, dtype=np.uint8)
    writer = _Stream(job, fmt._layout[job.index], fmt.gen)
    writer.fill(0, buf, len(buf))
    reader = _Stream(job, fmt._layout[job.index], fmt.gen)
    assert reader.update(0, buf, crc=True) is None
    assert reader.hasher.digests() == writer.hasher.digests()
    first = fmt._layout[job.index].tensor_record(0)
    buf[first.data_offset + 3] ^= 1
    bad = _Stream(job, fmt._layout[job.index], fmt.gen)
    msg = bad.update(0, buf, crc=True)
    assert msg is not None and "descriptor" in msg  # the stored CRC no longer matches
    # a restore (no CRC) still finds it by digest; a header byte it finds as such
    quick = _Stream(job, fmt._layout[job.index], fmt.gen)
    assert quick.update(0, buf) is None and quick.hasher.digests()[0] != writer.hasher.digests()[0]
    buf[first.data_offset + 3] ^= 1
    buf[first.header_offset + 31] ^= 1
    assert "(fixed)" in (_Stream(job, fmt._layout[job.index], fmt.gen).update(0, buf) or "")
    assert bad.hasher.digests()[0] != writer.hasher.digests()[0]
    assert ITEMSIZE[job.regions[0].dtype] == 2


def test_other_layouts_are_refused(tmp_path: Path) -> None:
    r = ckptbench("run", str(ROOT / "workloads" / "tiny.toml"), "--format", "torch-save",
                  "--target", str(tmp_path / "t"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "megatron-deepspeed" in r.stderr
