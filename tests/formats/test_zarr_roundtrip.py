"""The zarr format end to end: save, evict, restore through zarr, verify; on local files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ckptbench.backends.local import LocalBackend
from ckptbench.formats.base import file_jobs
from ckptbench.formats.codecs import parse_codec
from ckptbench.formats.common import NP_DTYPES, chunk_bytes, chunk_tasks
from ckptbench.formats.manifest import manifest_files
from ckptbench.formats.zarr import ZarrFormat, ZarrLayout
from ckptbench.payload import PayloadGenerator, digest
from ckptbench.plan import build_plan
from ckptbench.runner.comm import SingleComm
from ckptbench.runner.options import RunOptions
from ckptbench.spec import load_workload

from .conftest import TINY, ckptbench, records, summaries, write_workload

CODECS = ["none", "zstd", "lz4", "blosc:shuffle=byte", "blosc:cname=lz4,shuffle=bit,inner_chunks=4"]


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_each_codec(codec: str, bf16_workload: Path, tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(bf16_workload), "--target", str(tmp_path / "t"), "--format", "zarr",
                  "--codec", codec, "--payload", "realistic", "--results", str(results))
    assert r.returncode == 0, r.stderr
    recs = records(results)
    assert recs[0]["options"]["format"] == "zarr"
    assert recs[0]["options"]["codec"] == parse_codec(codec).text()
    phases = [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]
    assert phases and all(p["verified"] for p in phases)
    s = summaries(results)
    plan_bytes = build_plan(load_workload(bf16_workload)).total_bytes
    # the restore record names its layout (the training one: files read back) and bytes
    (p,) = phases
    assert p["restore_plan"] == "files" and p["restore_layout"] == "world_size=4,tp=2"
    assert p["read_bytes"] == p["planned_read_bytes"] == plan_bytes
    assert p["amplification"] == 1.0
    for phase in ("save", "restore"):
        assert s[phase]["bytes"] == plan_bytes
        assert s[phase]["stored_bytes"] > 0
        assert s[phase]["compression_ratio"] == pytest.approx(plan_bytes / s[phase]["stored_bytes"])
        assert s[phase]["stored_throughput_bytes_per_s"] > 0
    ratio = s["save"]["compression_ratio"]
    if codec.startswith("none"):
        assert ratio <= 1.0  # edge shards are padded, plus the shard index
    elif codec == "lz4":
        assert 0.95 < ratio < 1.05  # no byte grouping: lz4 finds little
    else:
        assert 1.05 < ratio < 1.5
    ops = {x["op"] for x in recs if x["type"] == "op"}
    assert {"write_meta", "encode", "write_shard", "fsync", "commit", "open", "read_shard",
            "manifest"} <= ops
    shard_ops = [x for x in recs if x["type"] == "op" and x["op"] == "write_shard"]
    assert all("/c/" in x["object"] or x["object"].endswith("/c") for x in shard_ops)
    assert "ratio" in r.stdout and "stored GiB" in r.stdout  # the storage table


def test_checkpoint_is_plain_zarr(bf16_workload: Path, tmp_path: Path) -> None:
    """Any zarr v3 reader opens the hierarchy; bf16 is a uint16 view that says so."""
    import zarr

    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    r = ckptbench("run", str(bf16_workload), "--target", str(target), "--format", "zarr",
                  "--codec", "zstd", "--keep", "--results", str(results))
    assert r.returncode == 0, r.stderr
    ckpt = next(x["checkpoint"] for x in records(results) if x["type"] == "phase")
    group = zarr.open_group(zarr.storage.LocalStore(target), path=ckpt, mode="r", zarr_format=3)
    assert group.attrs["ckptbench"]["format"] == "zarr"
    plan = build_plan(load_workload(bf16_workload))
    w = zarr.open_array(zarr.storage.LocalStore(target), path=f"{ckpt}/model.tok_embeddings.weight",
                        mode="r", zarr_format=3)
    assert w.shape == (1000, 256) and w.dtype == np.uint16
    assert w.attrs["ckptbench"]["dtype"] == "bfloat16"
    # Whole array read back = every writer's chunk, as the manifest's digests say.
    manifest = json.loads((target / ckpt / ".metadata").read_text())
    assert manifest["format"] == "zarr" and manifest["codec"].startswith("zstd:")
    full = w[...]
    for c in (plan.chunk(i) for i in range(plan.n_chunks)):
        if c.key != "model.tok_embeddings.weight" or not c.nbytes:
            continue
        f = int(plan.chunk_file[c.index])
        entry = manifest["files"][f"{ckpt}/{plan.file_paths[f]}"]
        j = [ch[1] for ch in entry["chunks"]].index(c.file_offset)
        box = tuple(slice(o, o + n) for o, n in zip(c.offsets, c.sizes, strict=True))
        assert digest(np.ascontiguousarray(full[box])) == entry["digests"][j]


def test_same_bytes_as_the_raw_format() -> None:
    """A chunk's zarr payload is exactly what the raw format writes for it."""
    plan = build_plan(load_workload(TINY))
    jobs = file_jobs(plan, [1], "run/ckpt", 3, 7)
    gen = PayloadGenerator("realistic", 7)
    job = jobs[0]
    buf = np.zeros(job.size + 8, dtype=np.uint8)
    gen.fill(job.base, job.regions, 0, buf)
    for t in chunk_tasks(plan, jobs):
        r = job.regions[t.region]
        data, d = chunk_bytes(gen, t, NP_DTYPES[plan.keys[t.key].dtype])
        assert data.tobytes() == buf[r.start:r.end].tobytes() and d == digest(buf[r.start:r.end])


def engine_run(tmp_path: Path, codec: str = "none") -> tuple[ZarrFormat, list, str, str]:
    plan = build_plan(load_workload(TINY))
    backend = LocalBackend(str(tmp_path / "t"))
    backend.prepare()
    ranks = list(range(plan.world_size))  # one process holds every plan rank
    engine = ZarrFormat(plan, ranks, backend, SingleComm(),
                        RunOptions(format="zarr", codec=codec).format_options())
    ckpt = "run/checkpoint-1"
    jobs = file_jobs(plan, ranks, ckpt, 1, 0)
    results = engine.save(jobs)
    assert all(r.error is None for r in results)
    digests = {f: d for r in results for f, d in r.digests.items()}
    objects = {k: d for r in results for k, d in r.objects.items()}
    manifest = {"format": "zarr", "files": manifest_files(plan, ckpt, digests), "objects": objects}
    backend.put_atomic(f"{ckpt}/.metadata", json.dumps(manifest).encode())
    return engine, jobs, ckpt, f"{ckpt}/.metadata"


def test_corrupted_shard_is_named(tmp_path: Path) -> None:
    engine, jobs, ckpt, manifest_key = engine_run(tmp_path)
    shard = tmp_path / "t" / ckpt / "model.layers.1.feed_forward.w2.weight" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    results = engine.restore(jobs, manifest_key).results
    assert all(r.error is None for r in results)
    mismatches = [m for r in results for m in r.mismatches]
    assert len(mismatches) == 1
    assert "chunk model.layers.1.feed_forward.w2.weight at offsets [0, 0]" in mismatches[0]
    assert "bytes differ from chunk byte 100 of" in mismatches[0]


def test_missing_shard_fails_the_restore(tmp_path: Path) -> None:
    engine, jobs, ckpt, manifest_key = engine_run(tmp_path, "zstd")
    (tmp_path / "t" / ckpt / "model.norm.weight" / "c" / "0").unlink()
    results = engine.restore(jobs, manifest_key).results
    assert all(r.error is None for r in results)
    (mismatch,) = [m for r in results for m in r.mismatches]
    assert mismatch == (f"chunk model.norm.weight at offsets [0]: zarr shard {ckpt}/"
                        "model.norm.weight/c/0 is missing (zarr reads it as fill values)")


def test_cache_keys_are_the_objects_written(tmp_path: Path) -> None:
    engine, jobs, ckpt, _ = engine_run(tmp_path)
    keys = engine.cache_keys(jobs)
    root = tmp_path / "t"
    written = {str(p.relative_to(root)) for p in (root / ckpt).rglob("*") if p.is_file()}
    assert set(keys) == written - {f"{ckpt}/.metadata"}


@pytest.mark.parametrize("dtype, kind, codec, low, high", [
    # Byte grouping + zstd on trained bf16 weights; plain zstd; published: ~1.2-1.5x.
    ("bfloat16", "weight", "zstd", 1.2, 1.35),
    ("bfloat16", "weight", "blosc:shuffle=byte,clevel=1", 1.2, 1.35),
    ("bfloat16", "weight", "blosc:shuffle=byte,clevel=5", 1.3, 1.5),
    # fp32 optimizer state barely compresses: ~1.0-1.2x.
    ("float32", "exp_avg", "zstd", 1.02, 1.2),
    ("float32", "exp_avg_sq", "blosc:shuffle=byte", 1.02, 1.2),
    ("float32", "exp_avg", "blosc:shuffle=byte,clevel=5", 1.02, 1.2),
])
def test_realistic_payload_compresses_like_a_trained_checkpoint(
        dtype: str, kind: str, codec: str, low: float, high: float, tmp_path: Path) -> None:
    ratio_real = shard_ratio(tmp_path, dtype, kind, codec, "realistic")
    assert low <= ratio_real <= high, ratio_real
    assert shard_ratio(tmp_path, dtype, kind, codec, "random") < 1.005


def shard_ratio(tmp_path: Path, dtype: str, kind: str, codec: str, payload: str) -> float:
    """Logical / encoded bytes of one 8 MiB shard of a large tensor's chunk."""
    import asyncio

    wl = write_workload(tmp_path / f"w-{dtype}.toml", "ratio", param_dtype=dtype, world_size=2,
                        tp=1, dim=2048, ffn=2048, vocab=8192, layers=1)
    plan = build_plan(load_workload(wl))
    lay = ZarrLayout(plan, parse_codec(codec))
    name = {"weight": "model.output.weight",
            "exp_avg": "optim.state.output.weight.exp_avg",
            "exp_avg_sq": "optim.state.output.weight.exp_avg_sq"}[kind]
    jobs = file_jobs(plan, [1], "run/ckpt", 1, 0)
    (task,) = [t for t in chunk_tasks(plan, jobs) if plan.keys[t.key].name == name]
    data, _ = chunk_bytes(PayloadGenerator(payload, 0), task, lay.np_dtype(task.key))
    assert data.shape == lay.shard_shape(task.key)
    loop = asyncio.new_event_loop()
    try:
        stored = sum(len(p) for p in lay.encode_shard(task.key, data, loop))
    finally:
        loop.close()
    return data.nbytes / stored


def test_unreadable_shard_is_an_error_not_a_hang(tmp_path: Path) -> None:
    engine, jobs, ckpt, manifest_key = engine_run(tmp_path)
    shard = tmp_path / "t" / ckpt / "model.tok_embeddings.weight" / "c" / "1" / "0"
    shard.unlink()
    shard.mkdir()  # reads fail with EISDIR
    results = engine.restore(jobs, manifest_key).results
    errors = [r.error for r in results if r.error is not None]
    assert errors and "model.tok_embeddings.weight/c/1/0" in str(errors[0])
