"""Never lose a user's file (issue 16, item 1).

A run deletes only what it wrote, by name (the plan and the format know every name), and
removes a directory it made only when that leaves it empty; run and checkpoint directories
are created exclusively, so a name that exists is never reused. A file someone else puts
into the run's directories while it runs is left in place and reported, and the run still
succeeds. The same on S3 and through fsspec.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ckptbench.backends import Backend, open_backend
from ckptbench.backends.base import TARGET_MARKER
from ckptbench.formats import format_class
from ckptbench.formats.base import FormatOptions
from ckptbench.measure import measure
from ckptbench.plan import build_plan
from ckptbench.runner import RunOptions, RunRequest
from ckptbench.runner.launch_local import LocalLauncher
from ckptbench.spec import load_workload
from harness import MinioServer

from .lifecycle import BIG, BIG_ARGS, TINY, messages, records, run, start, tree, wait_for

MIB = 1 << 20


# --- the CLI, as in the issue ---
def test_files_put_into_the_run_during_a_run_are_kept(tmp_path: Path) -> None:
    """The issue's reproduction: as soon as checkpoint-1 appears, a user writes NOTES.txt
    into the run directory and into the checkpoint. Both are there at the end, everything
    the run wrote is gone, and the leftovers are reported in one line."""
    target = tmp_path / "tgt"
    proc = start("run", str(BIG), *BIG_ARGS, "--no-restore", "--target", "tgt", "--results",
                 "r.jsonl", cwd=tmp_path)  # the save's cleanup is the one under test
    ckpt = wait_for("checkpoint-1", lambda: next(iter(target.glob("run-*/checkpoint-1")), None),
                    proc=proc, every=0.005)
    run = ckpt.parent
    (run / "NOTES.txt").write_text("the user's notes")
    (ckpt / "NOTES.txt").write_text("more notes")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert (run / "NOTES.txt").read_text() == "the user's notes"
    assert (ckpt / "NOTES.txt").read_text() == "more notes"
    name = run.name
    assert set(tree(target)) == {TARGET_MARKER, f"{name}/", f"{name}/NOTES.txt",
                                 f"{name}/checkpoint-1/", f"{name}/checkpoint-1/NOTES.txt"}
    notes = [line for line in messages(err) if "left in place" in line]
    assert len(notes) == 1 and "NOTES.txt" in notes[0], err
    assert "Traceback" not in err
    cleanup = [r for r in records(tmp_path / "r.jsonl") if r["type"] == "cleanup"]
    assert cleanup and f"{name}/NOTES.txt" in cleanup[-1]["left"]


def test_files_put_into_any_checkpoint_are_kept(tmp_path: Path) -> None:
    """Many short iterations: a file dropped into whichever checkpoint directory exists at
    that moment survives that checkpoint's removal (per iteration, not only at the end)."""
    target = tmp_path / "tgt"
    proc = start("run", str(TINY), "--target", "tgt", "--iterations", "20", "--results",
                 "r.jsonl", cwd=tmp_path)

    def drop() -> Path | None:
        for ckpt in sorted(target.glob("run-*/checkpoint-*"), key=lambda p: p.name)[::-1]:
            if ckpt.name == "checkpoint-1":
                continue
            try:
                (ckpt / "mine.txt").write_text(ckpt.name)
                return ckpt
            except FileNotFoundError:  # removed just now: try the next one
                continue
        return None

    ckpt = wait_for("a checkpoint after the first", drop, proc=proc, every=0.002)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert (ckpt / "mine.txt").read_text() == ckpt.name
    run = ckpt.parent.name
    assert set(tree(target)) == {TARGET_MARKER, f"{run}/", f"{run}/{ckpt.name}/",
                                 f"{run}/{ckpt.name}/mine.txt"}


def test_a_checkpoint_directory_made_by_someone_else_is_an_error(tmp_path: Path) -> None:
    """A checkpoint directory that already exists when the run gets to it is not written
    into (nor emptied): the run stops there with one line naming it."""
    target = tmp_path / "tgt"
    proc = start("run", str(TINY), "--target", "tgt", "--iterations", "400", "--results",
                 "r.jsonl", cwd=tmp_path)

    def newest() -> int | None:
        steps = [int(p.name.rsplit("-", 1)[1]) for p in target.glob("run-*/checkpoint-*")]
        return max(steps) if steps else None

    step = wait_for("the first checkpoint", newest, proc=proc, every=0.005)
    run = next(target.glob("run-*"))
    theirs = run / f"checkpoint-{step + 12}"
    theirs.mkdir()
    (theirs / "theirs.bin").write_bytes(b"someone else's checkpoint")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err
    errors = [line for line in messages(err) if line.startswith("ckptbench: error:")]
    assert len(errors) == 1 and theirs.name in errors[0] and "exists" in errors[0], err
    assert "Traceback" not in err
    assert (theirs / "theirs.bin").read_bytes() == b"someone else's checkpoint"
    assert set(tree(target)) == {TARGET_MARKER, f"{run.name}/", f"{run.name}/{theirs.name}/",
                                 f"{run.name}/{theirs.name}/theirs.bin"}
    phases = [r for r in records(tmp_path / "r.jsonl") if r["type"] == "phase" and r["ok"]]
    assert len(phases) == 2 * (step + 11)  # every iteration before it ran


# --- the library, every backend: a writer that is not ckptbench, during the save ---
@dataclass
class Store:
    """A target, and a way to see it and to write into it behind ckptbench's back."""

    target: str
    put: Callable[[str, bytes], None]
    keys: Callable[[], set[str]]  # every file or object under the target, relative
    options: dict[str, Any] = field(default_factory=dict)
    pending: Callable[[], list[str]] = lambda: []  # unfinished multipart uploads


def _local_store(root: Path, scheme: str = "") -> Store:
    def put(key: str, data: bytes) -> None:
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)

    def keys() -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} \
            if root.exists() else set()

    return Store(f"{scheme}{root}", put, keys)


def _s3_store(server: MinioServer) -> Store:
    assert server.bucket
    bucket, prefix = server.bucket, f"adv/{uuid.uuid4().hex[:10]}"
    client = server.client()

    def put(key: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=data)

    def keys() -> set[str]:
        return {k[len(prefix) + 1:] for k in server.list_keys(bucket, prefix + "/")}

    def pending() -> list[str]:
        ups = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        return [u["Key"] for u in ups if u["Key"].startswith(prefix + "/")]

    return Store(f"s3://{bucket}/{prefix}", put, keys,
                 {"endpoint_url": server.endpoint, "part_size": 5 * MIB}, pending)


@pytest.fixture(params=["local", "fsspec", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    if request.param == "local":
        yield _local_store(tmp_path / "tgt")
    elif request.param == "fsspec":  # local:// is fsspec's LocalFileSystem
        yield _local_store(tmp_path / "tgt", "local://")
    else:
        server: MinioServer = request.getfixturevalue("minio_server")
        for k, v in server.env({}).items():
            monkeypatch.setenv(k, v)
        yield _s3_store(server)


class Intruder:
    """Forwards everything to a backend; the first time the run opens a file of a
    checkpoint for writing, `intrude(run_id, checkpoint)` runs first (someone writing
    into the run's directories in the middle of the save)."""

    def __init__(self, inner: Backend, intrude: Callable[[str, str], None]) -> None:
        self._inner, self._intrude, self._done = inner, intrude, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def open_write(self, key: str, size: int) -> Any:
        if not self._done:
            self._done = True
            run, ckpt = key.split("/")[:2]
            self._intrude(run, ckpt)
        return self._inner.open_write(key, size)


def _request(backend: Any, run_id: str, *, keep: bool = False, fmt: str = "raw",
             iterations: int = 1) -> RunRequest:
    workload = load_workload(TINY)
    return RunRequest(workload=workload, plan=build_plan(workload), ranks=[0], backend=backend,
                      options=RunOptions(iterations=iterations, run_id=run_id, keep=keep,
                                         format=fmt, block_size=MIB, prefill_bytes=4 * MIB))


def _measure(req: RunRequest, results: Path) -> dict[str, Any] | None:
    return measure(req, results, LocalLauncher(in_process=True))


@pytest.mark.parametrize("fmt", ["raw", "zarr"])
def test_a_file_put_into_the_run_during_the_save_is_kept(store: Store, tmp_path: Path,
                                                         fmt: str) -> None:
    def intrude(run: str, ckpt: str) -> None:
        store.put(f"{run}/NOTES.txt", b"notes")
        store.put(f"{run}/{ckpt}/NOTES.txt", b"more notes")

    backend = Intruder(open_backend(store.target, store.options), intrude)
    results = tmp_path / "r.jsonl"
    _measure(_request(backend, "run-intruded", fmt=fmt, iterations=2), results)
    # the foreign files stay; the marker too, since the target is not empty
    assert store.keys() == {TARGET_MARKER, "run-intruded/NOTES.txt",
                            "run-intruded/checkpoint-1/NOTES.txt"}
    assert store.pending() == []
    (cleanup,) = [r for r in records(results) if r["type"] == "cleanup"]
    assert sorted(cleanup["left"]) == ["run-intruded/NOTES.txt",
                                       "run-intruded/checkpoint-1/NOTES.txt"]
    phases = [r for r in records(results) if r["type"] == "phase"]
    assert len(phases) == 4 and all(p["ok"] for p in phases)


def test_an_existing_run_directory_is_never_reused(store: Store, tmp_path: Path) -> None:
    """Same run id twice (same second, same pid): the second run takes a new name and the
    first run's kept checkpoint, and a user's directory of that name, are untouched."""
    first = open_backend(store.target, store.options)
    _measure(_request(first, "run-same", keep=True), tmp_path / "a.jsonl")
    kept = store.keys()
    assert "run-same/checkpoint-1/.metadata" in kept
    store.put("run-users/notes.txt", b"a user's directory named like a run")
    before = store.keys()
    for i, run_id in enumerate(["run-same", "run-users"]):
        results = tmp_path / f"b{i}.jsonl"
        _measure(_request(open_backend(store.target, store.options), run_id), results)
        ran = records(results)[0]["run_id"]
        assert ran != run_id and ran.startswith(run_id)
        assert all(r["ok"] for r in records(results) if r["type"] == "phase")
    assert store.keys() == before


@pytest.mark.parametrize("fmt,codec,files", [("raw", "none", "dcp"), ("raw", "none", "shared"),
                                             ("zarr", "zstd", "dcp")])
def test_the_format_names_every_file_it_writes(tmp_path: Path, fmt: str, codec: str,
                                               files: str) -> None:
    """What cleanup deletes by name is exactly what a save wrote: the format's written
    names (all four ranks, forked processes) plus the manifest."""
    text = TINY.read_text()
    workload = tmp_path / "w.toml"
    workload.write_text(text + f'\n[checkpoint]\nfiles = "{files}"\nthreads = 2\n')
    target = tmp_path / "tgt"
    r = run("run", str(workload), "--target", str(target), "--keep", "--format", fmt,
            "--codec", codec, "--results", str(tmp_path / "r.jsonl"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (run_dir,) = [p for p in target.iterdir() if p.is_dir()]
    ckpt = run_dir / "checkpoint-1"
    on_disk = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()}
    plan = build_plan(load_workload(workload))
    names = format_class(fmt).written_names(plan, [[0], [1], [2], [3]],
                                            FormatOptions(threads=2, codec=codec))
    assert on_disk == {*names, plan.manifest}
    assert len(names) == len(set(names))
    assert not any(os.path.isabs(n) or ".." in n.split("/") for n in names)


class Recorder:
    """Forwards everything to a backend and notes, in order, each key written."""

    def __init__(self, inner: Backend) -> None:
        self._inner = inner
        self.written: list[tuple[str, str]] = []  # (how, key)
        self.intents: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def open_write(self, key: str, size: int) -> Any:
        self.written.append(("open_write", key))
        return self._inner.open_write(key, size)

    def put_atomic(self, key: str, data: bytes) -> None:
        self.written.append(("put_atomic", key))
        if key.endswith("/.ckptbench-run"):
            self.intents.append(json.loads(data))
        self._inner.put_atomic(key, data)


@pytest.mark.parametrize("fmt", ["raw", "zarr"])
def test_the_intent_names_everything_before_the_first_write(tmp_path: Path, fmt: str) -> None:
    """The run records every name it will write before it writes the first byte; a kept
    run ends with its checkpoints and the record of them (state "kept": not debris; what
    `ckptbench clean` removes by name)."""
    target = tmp_path / "tgt"
    backend = Recorder(open_backend(str(target)))
    _measure(_request(backend, "run-k", keep=True, iterations=2, fmt=fmt), tmp_path / "r.jsonl")
    assert backend.written[0] == ("put_atomic", "run-k/.ckptbench-run")
    intent, *updates, kept = backend.intents
    assert kept["state"] == "kept" and kept["checkpoints"] == ["checkpoint-1", "checkpoint-2"]
    assert set(kept["ids"]) == {".", "checkpoint-1", "checkpoint-2"}
    # rank 0 alone restores by the DCP plan (raw): the chunks it reads from other ranks'
    # files are fill-ins, named too, and removed after each restore (runner.fill_in)
    fill = ["checkpoint-1-fill-in", "checkpoint-2-fill-in"] if fmt == "raw" else []
    assert intent["run_id"] == "run-k"
    assert intent["checkpoints"] == ["checkpoint-1", "checkpoint-2", *fill]
    # Rewritten only to record each directory the run creates, before its first write there.
    assert all({k: u[k] for k in intent if k != "ids"} == {k: intent[k] for k in intent
                                                             if k != "ids"} for u in updates)
    assert [len(u["ids"]) for u in updates] == list(range(2, len(intent["checkpoints"]) + 2))
    assert set(updates[-1]["ids"]) == {".", *intent["checkpoints"]}
    intent_at = [i for i, (_, k) in enumerate(backend.written)
                 if k == "run-k/.ckptbench-run"][:-1]
    for c in intent["checkpoints"]:
        recorded = next(i for i, u in zip(intent_at, backend.intents[:-1], strict=True)
                        if c in u["ids"])
        first = next(i for i, (_, k) in enumerate(backend.written) if k.startswith(f"run-k/{c}/"))
        assert recorded < first
    named = {f"run-k/{c}/{f}" for c in intent["checkpoints"] for f in intent["files"]}
    own = {"run-k/.ckptbench-run", "run-k/.ckptbench-lease"}  # the intent and the lease
    assert {key for _, key in backend.written[1:]} - own <= named
    assert bool(fill) == any("-fill-in/" in key for _, key in backend.written)
    files = {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()}
    assert json.loads((target / "run-k/.ckptbench-run").read_bytes()) == kept
    assert {"run-k/checkpoint-1/.metadata", "run-k/checkpoint-2/.metadata"} <= files
    assert files - {TARGET_MARKER, "run-k/.ckptbench-run"} <= named
