"""End to end on real files: save, evict, restore, verify; safety on bad targets."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ckptbench.backends.local import LocalBackend, LocalOptions
from ckptbench.formats.manifest import Manifest
from ckptbench.plan import build_plan
from ckptbench.records import JsonlSink, read_records
from ckptbench.runner.comm import SingleComm
from ckptbench.runner.driver import RunFailed, run_iterations
from ckptbench.runner.options import RunOptions
from ckptbench.spec import load_workload

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "workloads" / "tiny.toml"


def ckptbench(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def records(path: Path) -> list[dict]:
    return list(read_records(path))


def test_round_trip_tiny(tmp_path):
    target, results = tmp_path / "target", tmp_path / "r.jsonl"
    r = ckptbench("run", str(TINY), "--target", str(target), "--iterations", "2",
                  "--results", str(results))
    assert r.returncode == 0, r.stderr
    recs = records(results)
    run = recs[0]
    assert run["type"] == "run" and run["schema"] == "ckptbench.results/1"
    assert run["environment"]["target"]["fs_type"]
    assert run["workload"]["name"] == "tiny"
    summaries = {s["phase"]: s for s in recs if s["type"] == "summary"}
    assert set(summaries) == {"save", "restore"}
    assert summaries["save"]["bytes"] == 23_559_252 and summaries["save"]["iterations"] == 2
    assert summaries["save"]["ranks"] == 4
    assert summaries["restore"]["cache"].startswith("fadvise")
    phases = [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]
    assert len(phases) == 2 and all(p["verified"] for p in phases)
    ops = {x["op"] for x in recs if x["type"] == "op"}
    assert {"open", "write", "fsync", "close", "commit", "read", "manifest"} <= ops
    ranks = [x for x in recs if x["type"] == "rank" and x["phase"] == "save"]
    assert sorted(x["bytes"] for x in ranks if x["iteration"] == 1) == sorted(
        build_plan(load_workload(TINY)).rank_bytes().tolist())
    # ckptbench created the target, so it removes it again: nothing is left.
    assert not target.exists()
    assert "save" in r.stdout and "restore" in r.stdout


def test_keep_leaves_a_committed_checkpoint_matching_the_plan(tmp_path):
    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    r = ckptbench("run", str(TINY), "--target", str(target), "--keep", "--results", str(results),
                  "--io", "direct")
    assert r.returncode == 0, r.stderr
    plan = build_plan(load_workload(TINY))
    (run_dir,) = [p for p in target.iterdir() if p.is_dir()]
    ckpt = run_dir / "checkpoint-1"
    manifest = Manifest.decode((ckpt / ".metadata").read_bytes())
    assert manifest["schema"] == "ckptbench.manifest/1"
    for f, size in zip(plan.file_paths, plan.file_bytes.tolist(), strict=True):
        assert (ckpt / f).stat().st_size == size
    assert records(results)[-1]["cache"] == "direct"


def test_foreign_target_is_refused_and_untouched(tmp_path):
    target = tmp_path / "data"
    target.mkdir()
    precious = target / "precious.bin"
    precious.write_bytes(b"user data")
    r = ckptbench("run", str(TINY), "--target", str(target), "--results", str(tmp_path / "r.jsonl"))
    assert r.returncode == 2
    assert "holds files not made by ckptbench" in r.stderr and "precious.bin" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert precious.read_bytes() == b"user data"
    assert sorted(os.listdir(target)) == ["precious.bin"]


def test_deletes_only_what_it_created(tmp_path):
    target = tmp_path / "t"
    assert ckptbench("run", str(TINY), "--target", str(target), "--keep",
                     "--results", str(tmp_path / "a.jsonl")).returncode == 0
    kept = sorted(p.name for p in target.iterdir())
    (target / "notes.txt").write_text("mine")
    r = ckptbench("run", str(TINY), "--target", str(target), "--results", str(tmp_path / "b.jsonl"))
    assert r.returncode == 0, r.stderr
    assert (target / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in target.iterdir()) == sorted([*kept, "notes.txt"])


def test_results_file_is_never_overwritten(tmp_path):
    results = tmp_path / "r.jsonl"
    results.write_text("keep me\n")
    r = ckptbench("run", str(TINY), "--target", str(tmp_path / "t"), "--results", str(results))
    assert r.returncode == 2 and "never overwritten" in r.stderr
    assert results.read_text() == "keep me\n"


class _Sabotage(LocalBackend):
    """A real local backend that damages the real checkpoint between save and restore."""

    action = "flip"

    def drop_cache(self, keys):
        ckpt = self.root / keys[0].rsplit("/", 1)[0]
        if self.action == "flip":
            victim = self.root / keys[1]
            with open(victim, "r+b") as f:
                f.seek(100_000)
                b = f.read(1)
                f.seek(100_000)
                f.write(bytes([b[0] ^ 0x40]))
        elif self.action == "no-manifest":
            (ckpt / ".metadata").unlink()
        return super().drop_cache(keys)


def _run_sabotaged(tmp_path, action: str, restore_plan: str = "dcp"
                   ) -> tuple[RunFailed, list[dict]]:
    w = load_workload(TINY)
    plan = build_plan(w)
    backend = _Sabotage(str(tmp_path / "t"), LocalOptions(io="buffered"))
    backend.action = action
    backend.prepare()
    writer = JsonlSink(tmp_path / "r.jsonl")
    writer.open()
    writer.write({"type": "run", "schema": "ckptbench.results/1"})
    opts = RunOptions(run_id=f"run-{uuid.uuid4().hex[:6]}", threads=1, restore_plan=restore_plan)
    # One process plays all four plan ranks (a contiguous group, as under MPI).
    with pytest.raises(RunFailed) as err:
        run_iterations(plan, [0, 1, 2, 3], [0, 1, 2, 3], backend, SingleComm(), opts, writer)
    writer.close()
    return err.value, records(tmp_path / "r.jsonl")


@pytest.mark.parametrize("restore_plan", ["dcp", "files"])
def test_a_flipped_byte_fails_the_run_naming_chunk_file_and_offset(tmp_path, restore_plan):
    """Each chunk a restore plan reads, or a whole file read in blocks: the same engine
    finds the byte."""
    err, recs = _run_sabotaged(tmp_path, "flip", restore_plan)
    message = str(err)
    assert err.exit_code == 1
    assert "__1_0.distcp" in message and "bytes differ from offset 100000" in message
    assert "chunk model." in message or "chunk optim." in message
    errors = [r for r in recs if r["type"] == "error"]
    assert errors and errors[0]["kind"] == "verification"


def test_restore_refuses_a_checkpoint_without_manifest(tmp_path):
    err, _ = _run_sabotaged(tmp_path, "no-manifest")
    assert "no manifest; the checkpoint is incomplete" in str(err)


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_full_disk_fails_cleanly_and_keeps_finished_iterations(tmp_path):
    with _tmpfs(tmp_path / "small", "32m") as mnt:
        results = tmp_path / "r.jsonl"
        target = mnt / "t"
        r = ckptbench("run", str(TINY), "--target", str(target), "--iterations", "3", "--keep",
                      "--results", str(results))
        assert r.returncode == 2, r.stderr
        assert "no space left on the device" in r.stderr
        banner, *rest = [line for line in r.stderr.splitlines() if line]  # banner: stderr
        assert banner.startswith("tiny: 4 of 4 ranks") and len(rest) == 1
        assert "Traceback" not in r.stderr
        recs = records(results)
        done = {x["iteration"] for x in recs if x["type"] == "phase" and x["ok"]}
        assert 1 in done
        err = [x for x in recs if x["type"] == "error"]
        assert err and err[0]["iteration"] == 2 and err[0]["phase"] == "save"
        (run_dir,) = [p for p in target.iterdir() if p.is_dir()]
        # iteration 1 kept (--keep), iteration 2's partial files removed
        assert sorted(p.name for p in run_dir.iterdir()) == [".ckptbench-run", "checkpoint-1"]
        assert any(x["type"] == "summary" for x in recs)


def test_read_only_target_is_a_one_line_error(tmp_path):
    with _tmpfs(tmp_path / "ro", "4m") as mnt:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        r = ckptbench("run", str(TINY), "--target", str(mnt / "t"), "--results",
                      str(tmp_path / "r.jsonl"))
        assert r.returncode == 2
        assert "read-only file system" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_subset_of_ranks_and_scale(tmp_path):
    results = tmp_path / "r.jsonl"
    r = ckptbench("run", str(ROOT / "workloads" / "llama3-8b-fsdp2-64.toml"), "--target",
                  str(tmp_path / "t"), "--ranks", "0-1", "--scale", "32", "--results", str(results))
    assert r.returncode == 0, r.stderr
    recs = records(results)
    run = recs[0]
    assert run["ranks"] == [0, 1] and run["scale"] == 32
    assert run["workload"]["model"]["dim"] == 4096  # the full-size workload is recorded
    assert run["run_workload"]["model"]["dim"] == 128
    saved = {x["rank"] for x in recs if x["type"] == "rank"}
    assert saved == {0, 1}
    summary = next(x for x in recs if x["type"] == "summary" and x["phase"] == "save")
    assert summary["bytes"] == run["bytes_per_iteration"]


def test_realistic_payload_round_trip(tmp_path):
    r = ckptbench("run", str(TINY), "--target", str(tmp_path / "t"), "--payload", "realistic",
                  "--threads", "2", "--block-size", "1MiB", "--results", str(tmp_path / "r.jsonl"))
    assert r.returncode == 0, r.stderr


def test_bad_cli_values_are_one_line_errors(tmp_path):
    for args, needle in [
        (["--block-size", "lots"], "--block-size 'lots' is not a size"),
        (["--ranks", "0-9"], "outside 0-3"),
        (["--io", "mmap"], "mmap"),
    ]:
        r = ckptbench("run", str(TINY), "--target", str(tmp_path / "t"), *args)
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
