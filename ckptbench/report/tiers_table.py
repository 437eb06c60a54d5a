"""The recovery tiers' tables (report.tiers' summaries), for `run` and `report`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckptbench.report.table import Column, Grid
from ckptbench.report.tiers import LEVELS, RESTORE_SUMMARY, SUMMARY
from ckptbench.units import format_size, gbps


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _steps(r: dict[str, Any]) -> str:
    x = r.get("interference")
    return f"; steps x{x:.2f}" if x is not None else ""


def spans(items: list[int]) -> str:
    """Sorted integers as runs: [0, 1, 2, 5] -> "0-2,5"."""
    out: list[str] = []
    for x in items:
        if out and x == int(out[-1].rsplit("-", 1)[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{x}"
        else:
            out.append(str(x))
    return ",".join(out)


def _served(r: dict[str, Any]) -> str:
    """Which tier served which processes ("memory p0-1, storage p2-3"), else how many."""
    by = r.get("served_by")
    if by:
        return ", ".join(f"{k} p{spans(v)}" for k, v in sorted(by.items()))
    return ", ".join(f"{k} {v}" for k, v in sorted(r["served"].items()))


def tier_grids(run: dict[str, Any]) -> list[Grid]:
    """The per-tier table and the per-restart table of one run ([] without tiers)."""
    rows = run.get("tiers", [])
    tiers = tuple((r["tier"] + (", background" if r.get("background") else ""),
                   str(r["checkpoints"]), format_size(r["bytes"]),
                   _s(r["blocking_s"]), _s(r["baseline_s"]), f"{r['over_baseline']:.2f}",
                   gbps(r["rate_Bps"]), r["transport"] + _steps(r))
                  for r in rows if r["type"] == SUMMARY)
    restarts = tuple((r["scenario"] + (", resharded" if r.get("resharded") else ""),
                      str(r["iteration"]), format_size(r["bytes"]),
                      _s(r["seconds"]), gbps(r["rate_Bps"]), _s(r["baseline_s"]),
                      ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["over_baseline"].items()))
                      or "-",
                      _served(r))
                     for r in rows if r["type"] == RESTORE_SUMMARY)
    out = []
    if tiers:
        out.append(Grid("recovery tiers: per checkpoint", (
            Column("tier", key=True, numeric=False), Column("ckpts"), Column("bytes"),
            Column("blocking s", "med"), Column("baseline s", "med"), Column("x baseline"),
            Column("GB/s"), Column("where", numeric=False)), tiers,
            ("blocking: the slowest process's copy (memory) or replication until every "
             "holder has it (peer); baseline: a plain copy (memory) or a plain transfer over "
             "the same transport (peer) of one shard, in the same run; x baseline: blocking over "
             "the baseline's time for the same bytes (K replicas: K x the baseline); bytes "
             "and GB/s: every process's, replicas counted. background (--mode async): the "
             "replication's seconds while the loop ran on; steps x: the training steps beside "
             "it over the baseline steps.",)))
    if restarts:
        out.append(Grid("recovery tiers: restarts", (
            Column("scenario", key=True, numeric=False), Column("ckpt"), Column("bytes"),
            Column("seconds"), Column("GB/s"), Column("baseline s", "max"),
            Column("x baseline", numeric=False), Column("served by", numeric=False)), restarts,
            ("process: every process reads its node's copy; node: the last node is "
             "replaced, its processes fetch from peers; group: the last node's replication "
             "group is lost, the shards no tier holds come from storage by the DCP load "
             "plan, the rest from the tiers; storage: the last stored checkpoint's restore. "
             "served by: the tier that served each process (p: process numbers). x baseline: per serving tier, its slowest process over "
             "the slowest plain copy (memory) or plain transfer from the same holder (peer) "
             "of the same bytes. Every byte checked against the save's digests.",
             *(("resharded: onto the restore layout, each process reads its restore ranks' "
                "chunks (DCP's load plan) from the nearest copy, its node's first; memory: "
                "its node's memory copies only; peer: a replica, or bytes from another node "
                "(baseline: a plain copy and a plain transfer of the same bytes); storage: "
                "some of its chunks no tier held, read from storage by the same plan (no "
                "baseline). A process the restore layout gives no rank reads nothing and "
                "is not counted.",)
              if any(r.get("resharded") for r in rows if r["type"] == RESTORE_SUMMARY)
              else ()))))
    return out


def render_tiers(console: Any, loaded: Sequence[dict[str, Any]], width: int | None) -> None:
    from ckptbench.report.table import render

    for run in loaded:
        for grid in tier_grids(run):
            render(console, grid, width)
        for r in run.get("tiers", []):
            if r["type"] == LEVELS:
                console.print("levels as measured (for ckptbench levels, at this run's size): "
                              + " ".join(f"--level {lv}" for lv in r["levels"]),
                              markup=False, highlight=False, soft_wrap=True)
