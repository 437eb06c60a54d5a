"""The order of saves and restores (runner.sequence): interleaved, or MLPerf Storage v2.0's
all writes then all reads, run by the real driver on forked local ranks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ckptbench.backends.base import Backend, PlannedReads, ReadHandle, WriteHandle
from ckptbench.errors import RunFailed, SpecError
from ckptbench.measure import build_request, measure
from ckptbench.records import read_records
from ckptbench.runner import RunOptions
from ckptbench.runner.sequence import SEQUENCES, Step, steps
from ckptbench.testing.forwarding import ForwardingBackend

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "workloads" / "tiny.toml"
MIB = 1 << 20


class KeyLog(ForwardingBackend):
    """Forwards to the backend it wraps and appends 'w KEY' / 'r KEY' to `log` for every
    file opened for writing or reading (each forked rank appends its own lines). With
    `redirect` (old, new), reads of data files whose key holds `old` read `new` instead
    (the manifest is left alone): a restore given another checkpoint's bytes."""

    def __init__(self, inner: Backend, log: Path, redirect: tuple[str, str] | None = None
                 ) -> None:
        super().__init__(inner)
        self._log, self._redirect = log, redirect

    def _note(self, op: str, key: str) -> None:
        with open(self._log, "a") as f:
            f.write(f"{op} {key}\n")

    def open_write(self, key: str, size: int) -> WriteHandle:
        self._note("w", key)
        return self.inner.open_write(key, size)

    def _read_key(self, key: str) -> str:
        if self._redirect and self._redirect[0] in key and not key.endswith(".metadata"):
            key = key.replace(*self._redirect)
        self._note("r", key)
        return key

    def open_read(self, key: str) -> ReadHandle:
        return self.inner.open_read(self._read_key(key))

    def open_read_planned(self, key: str, spans: Sequence[tuple[int, int]]) -> ReadHandle:
        # the DCP restore plan opens its files this way (a backend may fetch ahead)
        if isinstance(self.inner, PlannedReads):
            return self.inner.open_read_planned(self._read_key(key), spans)
        return self.inner.open_read(self._read_key(key))


def test_steps_of_each_sequence() -> None:
    assert list(steps("interleaved", 3)) == [Step(i, True, True) for i in (1, 2, 3)]
    assert list(steps("writes-then-reads", 3)) == (
        [Step(i, True, False) for i in (1, 2, 3)] + [Step(i, False, True) for i in (1, 2, 3)])
    # one checkpoint: both orders are the same single step
    assert list(steps("writes-then-reads", 1)) == [Step(1, True, True)]
    assert SEQUENCES == ("interleaved", "writes-then-reads")


def test_an_unknown_sequence_is_one_line() -> None:
    with pytest.raises(SpecError) as e:
        RunOptions(sequence="reads-then-writes")  # type: ignore[arg-type]
    assert str(e.value) == ("--sequence 'reads-then-writes': allowed: interleaved, "
                            "writes-then-reads")
    with pytest.raises(SpecError, match="--sequence"):
        build_request(TINY, "unused", sequence="both")


def _run(tmp_path: Path, sequence: str, iterations: int = 3, redirect: tuple[str, str] | None = None
         ) -> tuple[list[dict[str, Any]], list[tuple[str, str]], RunFailed | None]:
    req = build_request(TINY, str(tmp_path / "t"), ranks="0-1", iterations=iterations,
                        sequence=sequence, block_size=MIB, prefill_bytes=4 * MIB)
    log = tmp_path / "keys.log"
    req = dataclasses.replace(req, backend=KeyLog(req.backend, log, redirect))
    failure: RunFailed | None = None
    try:
        measure(req, tmp_path / "r.jsonl")
    except RunFailed as exc:
        failure = exc
    lines = [tuple(line.split(" ", 1)) for line in log.read_text().splitlines()]
    return list(read_records(tmp_path / "r.jsonl")), lines, failure  # type: ignore[return-value]


def _checkpoint(key: str) -> int:
    return int(key.split("/checkpoint-")[1].split("/", maxsplit=1)[0])


def test_writes_then_reads_saves_all_then_restores_each_in_order(tmp_path: Path) -> None:
    records, keys, failure = _run(tmp_path, "writes-then-reads")
    # a subset's fill-ins are written off the clock before each restore (test_restore_run)
    keys = [(op, k) for op, k in keys if "-fill-in/" not in k]
    assert failure is None
    ops = [r for r in records if r["type"] == "op"]
    saves = [r for r in ops if r["phase"] == "save"]
    restores = [r for r in ops if r["phase"] == "restore"]
    assert {r["iteration"] for r in saves} == {r["iteration"] for r in restores} == {1, 2, 3}
    # every save (the last commit included) ended before the first restore began
    assert max(r["end_ns"] for r in saves) <= min(r["start_ns"] for r in restores)
    phases = [(r["phase"], r["iteration"]) for r in records if r["type"] == "phase"]
    assert phases == [("save", 1), ("save", 2), ("save", 3),
                      ("restore", 1), ("restore", 2), ("restore", 3)]
    restored = [r for r in records if r["type"] == "phase" and r["phase"] == "restore"]
    assert all(r["ok"] and r["verified"] and r["mismatched_chunks"] == 0 for r in restored)
    # the target saw the same order: all writes, then reads of checkpoint 1, 2, 3 in turn
    # (restore i reads checkpoint i: its files only, after those of i - 1)
    writes = [k for op, k in keys if op == "w"]
    reads = [k for op, k in keys if op == "r"]
    assert keys == [("w", k) for k in writes] + [("r", k) for k in reads]
    assert {_checkpoint(k) for k in writes} == {1, 2, 3}
    order = [_checkpoint(k) for k in reads]
    assert order == sorted(order) and set(order) == {1, 2, 3}
    # cleanup by name: nothing of the run is left
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").rglob("*.distcp"))


def test_interleaved_reads_each_checkpoint_before_the_next_save(tmp_path: Path) -> None:
    records, keys, failure = _run(tmp_path, "interleaved", iterations=2)
    # a subset's fill-ins are written off the clock before each restore (test_restore_run)
    keys = [(op, k) for op, k in keys if "-fill-in/" not in k]
    assert failure is None
    phases = [(r["phase"], r["iteration"]) for r in records if r["type"] == "phase"]
    assert phases == [("save", 1), ("restore", 1), ("save", 2), ("restore", 2)]
    ops = [(op, _checkpoint(k)) for op, k in keys]
    first_read_1 = ops.index(("r", 1))
    assert ("w", 2) not in ops[:first_read_1]


def test_a_restore_given_another_checkpoints_bytes_fails_verification(tmp_path: Path) -> None:
    """Restore 1 verifies against checkpoint 1's manifest: handed checkpoint 2's files (a
    sequence that read the wrong checkpoint), it fails, so the passing runs above read
    each checkpoint's own bytes."""
    records, _keys, failure = _run(tmp_path, "writes-then-reads", iterations=2,
                                   redirect=("/checkpoint-1/", "/checkpoint-2/"))
    assert failure is not None and failure.kind == "verification"
    restored = [r for r in records if r["type"] == "phase" and r["phase"] == "restore"]
    assert [(r["iteration"], r["ok"]) for r in restored] == [(1, False)]
    # the run stopped; both checkpoints it wrote were removed by name
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").rglob("*.distcp"))
