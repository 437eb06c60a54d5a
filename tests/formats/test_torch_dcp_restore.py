"""torch-dcp restores as a job restarting on the restore layout loads (needs torch, the
``torch`` extra): dcp.load on every rank of the restore layout into its pieces there, so
DCP reads what the restore plan (plan/restore.py) and the raw format's planned restore
read, rank by rank; the restore phase names its layout, bytes and DCP's parts."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ckptbench.plan import build_plan
from ckptbench.plan.restore import build_restore_plan
from ckptbench.spec import load_workload, with_restore

from .conftest import ckptbench, records, write_workload

pytest.importorskip("torch", reason="the torch extra (pip install 'ckptbench[torch]')")

CASES = {
    # HSDP 2 replicas x 2 shards onto itself: every replica reads what one of them wrote
    "hsdp": ({"world_size": 4, "tp": 1, "dp_replicate": 2}, "dp_replicate = 2", 2.0),
    # FSDP 4 onto 3 ranks: a job restarting on fewer ranks
    "fewer": ({"world_size": 3, "tp": 1}, "", None),
}


def _workload(tmp_path: Path, case: str) -> Path:
    return write_workload(tmp_path / f"{case}.toml", case, world_size=4, tp=1,
                          extra=CASES[case][1])


def _flag(layout: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in layout.items())


def _restore_phase(recs: list[dict[str, Any]]) -> dict[str, Any]:
    (phase,) = [x for x in recs if x["type"] == "phase" and x["phase"] == "restore"]
    return phase


def _rank_bytes(recs: list[dict[str, Any]], op: str) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for x in recs:
        if x["type"] == "op" and x["phase"] == "restore" and x["op"] == op:
            out[x["rank"]] += x["bytes"]
    return dict(out)


def _run(wl: Path, tmp_path: Path, fmt: str, layout: dict[str, int], *extra: str
         ) -> list[dict[str, Any]]:
    results = tmp_path / f"{fmt}.jsonl"
    r = ckptbench("run", str(wl), "--target", str(tmp_path / fmt), "--format", fmt,
                  "--restore-layout", _flag(layout), "--results", str(results), *extra)
    assert r.returncode == 0, r.stderr
    return records(results)


@pytest.mark.parametrize("case", sorted(CASES))
def test_dcp_load_reads_the_plan_and_raws_restore(case: str, tmp_path: Path) -> None:
    layout, _, amplification = CASES[case]
    wl = _workload(tmp_path, case)
    rplan = build_restore_plan(build_plan(with_restore(load_workload(wl), layout, "test")))
    planned = {r: int(b) for r, b in enumerate(rplan.rank_bytes()) if b}
    dcp = _run(wl, tmp_path, "torch-dcp", layout)
    raw = _run(wl, tmp_path, "raw", layout)
    # DCP's own load plan, rank by rank of the restore layout, reads the restore plan's
    # bytes, and so does the raw format's planned restore of the same checkpoint
    assert _rank_bytes(dcp, "dcp_load") == planned
    assert _rank_bytes(raw, "read") == planned
    phase, raw_phase = _restore_phase(dcp), _restore_phase(raw)
    assert phase["verified"] and phase["mismatched_chunks"] == 0
    for p in (phase, raw_phase):
        assert p["restore_plan"] == "dcp" and p["restore_world_size"] == layout["world_size"]
        assert p["restore_layout"] == _flag(layout).replace(",tp=1", "")
        assert p["read_bytes"] == p["planned_read_bytes"] == rplan.total_bytes
        assert p["amplification"] == pytest.approx(rplan.amplification)
    if amplification is not None:
        assert phase["amplification"] == pytest.approx(amplification, abs=0.001)
    else:  # fewer ranks: more than the checkpoint, less than each rank reading it all
        assert 1.0 < phase["amplification"] < 2.0


def _loads(recs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    out = {x["rank"]: x for x in recs if x["type"] == "op" and x["op"] == "dcp_load"
           and x["phase"] == "restore"}
    assert len(out) == len([x for x in recs if x["type"] == "op" and x["op"] == "dcp_load"
                            and x["phase"] == "restore"])  # one load per restore rank
    return out


def test_every_ranks_load_parts_add_up_to_its_load(tmp_path: Path) -> None:
    """Every restore rank's parts are recorded (its op and its rank record), add up to its
    load's seconds, and keep the reads of DCP's files (data) apart from the rest of
    reading the items (deserialise); the phase names the slowest rank (the one the others
    waited for) and the median rank, with their parts."""
    layout = CASES["fewer"][0]
    recs = _run(_workload(tmp_path, "fewer"), tmp_path, "torch-dcp", layout)
    loads = _loads(recs)
    assert sorted(loads) == [0, 1, 2]
    ranks = {x["rank"]: x for x in recs if x["type"] == "rank" and x["phase"] == "restore"}
    own = {}
    for r, op in loads.items():
        parts = op["parts"]
        assert list(parts) == ["metadata", "planning", "data", "deserialise", "sync"]
        assert all(v >= 0 for v in parts.values())
        assert parts["data"] > 0 and parts["deserialise"] > 0
        seconds = (op["end_ns"] - op["start_ns"]) / 1e9
        assert sum(parts.values()) == pytest.approx(seconds, rel=1e-6, abs=1e-6)
        assert ranks[r]["parts"] == pytest.approx(parts)
        own[r] = op["end_ns"] - parts["sync"] * 1e9
    phase = _restore_phase(recs)
    chosen = phase["rank_parts"]
    slowest = max(own, key=lambda r: own[r])
    assert chosen["slowest"]["rank"] == slowest
    assert phase["parts"] == pytest.approx(loads[slowest]["parts"])
    assert chosen["median"]["rank"] in loads
    assert chosen["median"]["parts"] == pytest.approx(loads[chosen["median"]["rank"]]["parts"])
    (restore,) = [x for x in recs if x["type"] == "summary" and x["phase"] == "restore"]
    assert restore["rank_parts"]["slowest"]["ranks"] == [slowest]
    assert set(restore["rank_parts"]["slowest"]["parts"]) == set(loads[0]["parts"])


def test_the_reader_pulls_at_least_the_payload_through_read(tmp_path: Path) -> None:
    """file_read_bytes: what DCP's reader read of its files (the OS reads), beside
    the payload (torch.load reads each item's archive records around its data)."""
    layout = CASES["hsdp"][0]
    recs = _run(_workload(tmp_path, "hsdp"), tmp_path, "torch-dcp", layout)
    for op in _loads(recs).values():
        assert op["file_read_bytes"] >= op["bytes"] > 0
        assert op["file_reads"] >= op["read_items"] > 0
        assert op["container_bytes"] >= op["bytes"]
    phase = _restore_phase(recs)
    assert phase["file_read_bytes"] >= phase["read_bytes"] == phase["planned_read_bytes"]


@pytest.mark.parametrize("given, expected", [((), 1), (("--intra-op-threads", "2"), 2)])
def test_ranks_run_the_intra_op_threads_a_launcher_sets(tmp_path: Path, given: tuple[str, ...],
                                                        expected: int) -> None:
    """4 local processes on one node: 1 intra-op thread each by default (as torchrun sets
    OMP_NUM_THREADS=1), N when given; what each rank's torch reported is recorded."""
    layout = {"world_size": 4, "tp": 1}
    recs = _run(_workload(tmp_path, "fewer"), tmp_path, "torch-dcp", layout, *given)
    run = recs[0]
    assert run["intra_op_threads"]["value"] == expected
    assert run["intra_op_threads"]["source"] == ("option" if given else "auto")
    ranks = [x for x in recs if x["type"] == "rank"]
    assert {(x["phase"], x["rank"]) for x in ranks} >= {(p, r) for p in ("save", "restore")
                                                        for r in range(4)}
    assert {x["intra_op_threads"] for x in ranks} == {expected}
    summaries = [x for x in recs if x["type"] == "summary"]
    assert all(s["intra_op_threads"] == {"min": expected, "max": expected} for s in summaries)


def test_more_restore_ranks_than_processes_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "t"
    r = ckptbench("run", str(_workload(tmp_path, "fewer")), "--target", str(target),
                  "--format", "torch-dcp", "--restore-layout", "world_size=8,tp=1")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "one process per rank of the restore layout (8 ranks)" in lines[0]
    assert "at most 4 ranks" in lines[0]
    assert not list(target.glob("run-*"))  # refused before anything was created


def test_restore_command_loads_a_kept_torch_dcp_checkpoint(tmp_path: Path) -> None:
    wl = _workload(tmp_path, "fewer")
    target = tmp_path / "t"
    r = ckptbench("run", str(wl), "--target", str(target), "--format", "torch-dcp",
                  "--keep", "--no-restore", "--results", str(tmp_path / "save.jsonl"))
    assert r.returncode == 0, r.stderr
    (ckpt,) = target.glob("run-*/checkpoint-1")
    results = tmp_path / "again.jsonl"
    r = ckptbench("restore", str(ckpt), "--restore-world-size", "3", "--results", str(results))
    assert r.returncode == 0, r.stderr
    recs = records(results)
    phase = _restore_phase(recs)
    rplan = build_restore_plan(build_plan(with_restore(load_workload(wl),
                                                       CASES["fewer"][0], "test")))
    assert phase["verified"] and phase["restore_world_size"] == 3
    assert _rank_bytes(recs, "dcp_load") == dict(enumerate(rplan.rank_bytes().tolist()))
    assert (ckpt / "dcp" / ".metadata").exists()  # kept


def test_a_changed_chunk_fails_the_load_in_one_line(tmp_path: Path) -> None:
    """Verification covers the pieces: a byte changed in a DCP file that a restore rank
    reads fails the restore."""
    wl = _workload(tmp_path, "fewer")
    target = tmp_path / "t"
    r = ckptbench("run", str(wl), "--target", str(target), "--format", "torch-dcp",
                  "--keep", "--no-restore")
    assert r.returncode == 0, r.stderr
    (ckpt,) = target.glob("run-*/checkpoint-1")
    biggest = max((ckpt / "dcp").glob("__*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(biggest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    biggest.write_bytes(bytes(data))
    r = ckptbench("restore", str(ckpt), "--restore-world-size", "3")
    assert r.returncode == 1, r.stderr
    assert "bytes differ" in r.stderr and r.stderr.count("\n") <= 2, r.stderr
