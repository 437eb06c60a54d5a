"""Several clients of one GlusterFS volume: two FUSE mounts stand for two hosts.

A run has one target, and across real hosts every node reaches the same path through
its own client; on one machine the two clients are two mount points. So these tests run
the library's own iteration loop (runner.driver.run_iterations, with the local launcher's
ProcessComm) in one forked process per rank, each rank with a backend on its client's
mount, rather than adding a per-rank target option to the CLI that only this simulation
would use. Ranks 0-1 are on client A, 2-3 on client B.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ckptbench.backends.local import LocalBackend, LocalOptions
from ckptbench.errors import describe_error
from ckptbench.formats.manifest import Manifest
from ckptbench.plan import build_plan
from ckptbench.plan.files import SHARED_FILE_NAME, plan_layout
from ckptbench.records import JsonlSink
from ckptbench.runner.comm import ProcessComm
from ckptbench.runner.driver import run_iterations
from ckptbench.runner.launch_local import die_with_parent
from ckptbench.runner.options import RunOptions
from ckptbench.spec import load_workload
from harness.gluster import GlusterBed

from . import TINY

MIB = 1 << 20


def _rank(index: int, plan: Any, roots: list[str], io: str, opts: RunOptions, parent: int,
          barrier: Any, inboxes: list[Any], errors: Any, results: str) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the session's handler
    ranks = list(range(plan.world_size))
    comm = ProcessComm(index, len(ranks), barrier, inboxes)
    backend = LocalBackend(roots[index], LocalOptions(io=io))
    sink = JsonlSink(Path(results)) if index == 0 else None
    code = 0
    try:
        if sink is not None:
            sink.open()
        run_iterations(plan, [ranks[index]], ranks, backend, comm, opts, sink)
    except BaseException as exc:  # reported to the test, then the group stops
        errors.put((index, describe_error(exc)))
        comm.abort()
        code = 1
    finally:
        if sink is not None:
            sink.close()
        comm.close(ok=code == 0)  # the last bcast must reach the peers before _exit
        errors.close()
        errors.join_thread()
    os._exit(code)


def run_on_clients(plan: Any, roots: list[Path], io: str, opts: RunOptions,
                   results: Path) -> list[dict[str, Any]]:
    """Every plan rank in a process of its own, rank r's backend at roots[r]; process 0's
    records."""
    ctx = mp.get_context("fork")
    n = plan.world_size
    barrier, inboxes, errors = ctx.RawValue("b", 0), [ctx.Queue() for _ in range(n)], ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(i, plan, [str(r) for r in roots], io, opts,
                                             os.getpid(), barrier, inboxes, errors,
                                             str(results)), daemon=True) for i in range(n)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 300
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    codes = [p.exitcode for p in procs]  # None: still running at the deadline
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert codes == [0] * n and not failures, (codes, failures)
    return [json.loads(line) for line in results.read_text().splitlines()]


def tiny(files: str) -> Any:
    w = load_workload(TINY)
    return build_plan(replace(w, checkpoint=replace(w.checkpoint, files=files,
                                                    stripe_size=64 << 10)))


@pytest.fixture
def clients(gluster: GlusterBed) -> Any:
    """(name, roots per rank, the target on each client): one directory of the plain
    volume, reached by ranks 0-1 through client A and ranks 2-3 through client B."""
    name = f"clients-{uuid.uuid4().hex[:6]}"
    a, b = gluster.plain.path / name, gluster.other.path / name
    owner = LocalBackend(str(a))
    owner.prepare()  # the session's target, made once (here: through client A)
    yield name, [a, a, b, b], (a, b)
    shutil.rmtree(a, ignore_errors=True)


@pytest.mark.parametrize("files", ["dcp", "per-rank"])
def test_shifted_restore_reads_the_other_clients_files_from_the_servers(
        gluster: GlusterBed, clients: Any, tmp_path: Path, files: str) -> None:
    """IOR's -C: with --restore-shift 2 every rank reads what a rank of the other client
    wrote. Nothing is evicted (cache = none), yet every byte restored comes from the
    bricks: a client's cache holds only what that client wrote."""
    _, roots, _ = clients
    plan = tiny(files)
    opts = RunOptions(iterations=2, threads=2, block_size=MIB, prefill_bytes=8 * MIB,
                      cache="none", restore_shift=2, run_id="two-clients")
    gluster.server.bytes_read("ckb")
    recs = run_on_clients(plan, roots, "buffered", opts, tmp_path / "r.jsonl")
    served = gluster.server.bytes_read("ckb")
    restores = [r for r in recs if r["type"] == "phase" and r["phase"] == "restore"]
    assert [(r["ok"], r["verified"], r["restore_shift"], r["cache"]) for r in restores] == \
        [(True, True, 2, "none")] * 2
    # Process p (rank p's, on client A for p < 2) restored the files of rank p + 2.
    read = {(r["process"], r["rank"]) for r in recs if r["type"] == "rank"
            and r["phase"] == "restore" and r["bytes"]}
    assert read == {(0, 2), (1, 3), (2, 0), (3, 1)}
    assert served >= 2 * plan.total_bytes, (served, plan.total_bytes)


@pytest.mark.parametrize("io", ["buffered", "direct"])
def test_one_shared_file_written_through_both_clients_at_once(
        gluster: GlusterBed, clients: Any, tmp_path: Path, io: str) -> None:
    """N-1: one checkpoint.bin, each rank writing its region, two ranks through each
    client at the same time; restored shifted (through the other client) and verified
    digest by digest; then the file read whole through both clients is the same."""
    _, roots, (a, b) = clients
    plan = tiny("shared")
    opts = RunOptions(iterations=1, threads=2, block_size=MIB, prefill_bytes=8 * MIB,
                      restore_shift=2, keep=True, run_id="n-1")
    recs = run_on_clients(plan, roots, io, opts, tmp_path / "r.jsonl")
    (restore,) = [r for r in recs if r["type"] == "phase" and r["phase"] == "restore"]
    assert restore["ok"] and restore["verified"] and restore["mismatched_chunks"] == 0
    saves = sorted((r["rank"], r["start_ns"], r["end_ns"]) for r in recs
                   if r["type"] == "rank" and r["phase"] == "save")
    assert len(saves) == 4
    a_span = (min(s[1] for s in saves[:2]), max(s[2] for s in saves[:2]))
    b_span = (min(s[1] for s in saves[2:]), max(s[2] for s in saves[2:]))
    assert a_span[0] < b_span[1] and b_span[0] < a_span[1]  # the clients wrote at once
    size = plan_layout(plan).shared_size[SHARED_FILE_NAME]
    through = [root / "n-1" / "checkpoint-1" / SHARED_FILE_NAME for root in (a, b)]
    assert [p.stat().st_size for p in through] == [size, size]
    digests = {hashlib.sha256(p.read_bytes()).hexdigest() for p in through}
    assert len(digests) == 1
    manifest = Manifest.decode((a / "n-1" / "checkpoint-1" / ".metadata").read_bytes())
    regions = [v for k, v in manifest["files"].items() if k.endswith(f"{SHARED_FILE_NAME}#3")]
    assert regions and regions[0]["offset"] == int(plan_layout(plan).base[3])
