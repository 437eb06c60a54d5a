"""The summary as a table: cells built once (a :class:`Grid`), shown in a terminal of any
width or as HTML.

A terminal table never cuts a number: numeric columns keep their full width, and a table
wider than the terminal is split into parts stacked one under the other, each repeating
the columns that name a row (run, phase). Every column header says which statistic it
shows (median iteration, worst iteration, range over iterations, all calls).
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from ckptbench.errors import CkptbenchError
from ckptbench.report import compare, throughput
from ckptbench.units import gbps

STATS = {
    "med": "median over iterations",
    "worst": "the worst iteration (its slowest rank finished last)",
    "min-max": "lowest and highest over iterations",
    "all": "over every call of every iteration",
}
TEXT_CAP = 24  # text cells wider than this wrap (text only: numeric cells never do)


@dataclass(frozen=True)
class Column:
    """A header (its lines: short, never wrapped), the statistic it shows (the last line),
    and whether it names the row (repeated in every part of a split table) or holds
    numbers (never wrapped)."""

    name: str
    stat: str = ""
    key: bool = False
    numeric: bool = True

    @property
    def header(self) -> str:
        return f"{self.name}\n{self.stat}" if self.stat else self.name


@dataclass(frozen=True)
class Grid:
    """A table's cells, its title and the notes printed under it."""

    title: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()

    def width_of(self, i: int) -> int:
        """Column i's width: its widest cell and header line (text capped at TEXT_CAP)."""
        col = self.columns[i]
        lines = [len(line) for line in col.header.splitlines()]
        if col.numeric:
            return max([len(r[i]) for r in self.rows] + lines + [1])
        cap = max([TEXT_CAP, *lines])  # text wraps at spaces to fit the cap
        wrapped = [len(x) for r in self.rows
                   for x in textwrap.wrap(r[i], cap, break_long_words=False) or [""]]
        return max(wrapped + lines + [1])

    def longest_word(self, i: int) -> int:
        """The narrowest column i may be: its longest word or header line."""
        words = [len(w) for r in self.rows for w in r[i].split()]
        return max(words + [len(line) for line in self.columns[i].header.splitlines()] + [1])


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def _data_op(phase: str, latency: dict[str, Any]) -> str:
    op = "write" if phase == "save" else "read"
    return f"{op}_shard" if op not in latency and f"{op}_shard" in latency else op  # zarr


def _slowest(res: dict[str, Any], s: dict[str, Any]) -> tuple[str, float]:
    """The rank that finished last in the worst iteration, and when (summaries written
    before they carried the rank's id: from the per-iteration figures)."""
    if "slowest_rank" in s:
        return str(s["slowest_rank"]), s["slowest_rank_seconds_max"]
    sel = [i for i in res.get("iterations", []) if i["phase"] == s["phase"]]
    if not sel:
        return "-", s["slowest_rank_seconds_max"]
    worst = max(sel, key=lambda i: i["slowest_rank_seconds"])
    return str(worst["slowest_rank"]), worst["slowest_rank_seconds"]


def _run_names(loaded: Sequence[dict[str, Any]]) -> list[str]:
    return [f"#{i}" for i in range(1, len(loaded) + 1)] if len(loaded) > 1 else [""]


def _heading(title: str, loaded: Sequence[dict[str, Any]]) -> tuple[str, list[str]]:
    """The title (one run: its workload) and the notes: one run's options, or what names
    each compared run and what they share."""
    runs = [r["run"] for r in loaded]
    if len(loaded) == 1:
        f = compare.facets(runs[0])
        return f"{title} for {f.get('workload', '?')}", [f"options: {compare.describe(f)}"]
    notes = [f"#{i}: {r['path']}" for i, r in enumerate(loaded, 1)]
    same = compare.common(runs)
    if same:
        notes.append(f"same in all runs: {compare.describe(same)}")
    return title, notes


def unverified(run: dict[str, Any]) -> bool:
    """The run's restores were not verified (--no-verify): flagged wherever shown."""
    return (run.get("options") or {}).get("verify") is False


def torch_run(run: dict[str, Any]) -> bool:
    """The run's format runs torch in its ranks (torch-dcp, torch-save): its times depend
    on torch's intra-op threads (runner.threads)."""
    return str((run.get("options") or {}).get("format", "raw")).startswith("torch")


def threads_cell(run: dict[str, Any], s: dict[str, Any]) -> str:
    """The intra-op threads a phase's ranks ran with ('1', '1-2'), for a torch format's
    run; '-' for the others (they ignore it) and for results that did not record it."""
    t = s.get("intra_op_threads")
    if not torch_run(run) or not isinstance(t, dict):
        return "-"
    lo, hi = t.get("min"), t.get("max")
    return str(lo) if lo == hi else f"{lo}-{hi}"


def threads_note(name: str, run: dict[str, Any]) -> str | None:
    """How a torch format's run set its intra-op threads (the run record's why)."""
    t = run.get("intra_op_threads")
    if not torch_run(run) or not isinstance(t, dict) or "value" not in t:
        return None
    return (f"{name + ': ' if name else ''}intra-op threads: {t['value']} per rank process "
            f"({t.get('why', t.get('source', '?'))}); torch's CPU work in a load or save "
            "(torch.load, copies) runs on them: --intra-op-threads sets them.")


def summary_grid(loaded: Sequence[dict[str, Any]]) -> Grid:
    """One row per run and phase, with the options that differ between runs as columns;
    runs of a torch format show the intra-op threads their ranks ran with."""
    runs = [r["run"] for r in loaded]
    keys = compare.differing(runs)
    several = len(loaded) > 1
    threads = any(torch_run(r) for r in runs) and any(
        isinstance(s.get("intra_op_threads"), dict) for res in loaded for s in res["summary"])
    cols = ([Column("run", key=True, numeric=False)] if several else []) + \
        [Column(k, numeric=False) for k in keys] + [
        Column("phase", key=True, numeric=False), Column("iters"), Column("GiB"),
        Column("s", "med"), *([Column("intra-op\nthreads")] if threads else []),
        Column("throughput\nGB/s", "med"), Column("GB/s", "min-max"),
        Column("min rank\nGB/s", "worst"), Column("slowest\nrank", "worst"),
        Column("slowest\nrank s", "worst"), Column("gap s", "med"), Column("op", numeric=False),
        Column("p50 ms", "all"), Column("p99 ms", "all"), Column("cache", numeric=False)]
    rows = []
    for name, res in zip(_run_names(loaded), loaded, strict=True):
        f = compare.facets(res["run"])
        lead = ([name] if several else []) + [compare.value(f, k) for k in keys]
        flag = unverified(res["run"])
        for s in res["summary"]:
            op = _data_op(s["phase"], s["latency"])
            lat = s["latency"].get(op, {})
            rank_id, rank_s = _slowest(res, s)
            cache = s.get("cache") or "-"
            phase = f"{s['phase']} UNVERIFIED" if flag and s["phase"] == "restore" else s["phase"]
            rows.append((*lead, phase, str(s["iterations"]), f"{s['bytes'] / 2**30:.3f}",
                         f"{s['seconds']:.3f}",
                         *([threads_cell(res["run"], s)] if threads else []),
                         gbps(s["throughput_bytes_per_s"]),
                         f"{gbps(s['throughput_min'])}-{gbps(s['throughput_max'])}",
                         gbps(s["rank_throughput_min_bytes_per_s"]), rank_id, f"{rank_s:.3f}",
                         f"{s['first_to_last_gap_s_median']:.3f}", op,
                         _ms(lat.get("p50_s")), _ms(lat.get("p99_s")),
                         cache if isinstance(cache, str) else ",".join(cache)))
    title, notes = _heading("ckptbench results", loaded)
    legend = "; ".join(f"{k}: {v}" for k, v in STATS.items())
    for name, res in zip(_run_names(loaded), loaded, strict=True):
        notes += [f"{name + ': ' if name else ''}{line}"
                  for line in throughput.headlines(res["summary"])]
    notes += [line for name, res in zip(_run_names(loaded), loaded, strict=True)
              if (line := threads_note(name, res["run"])) is not None]
    notes += [f"{throughput.NOTE} min rank GB/s: a rank's bytes over its own span. {legend}."]
    notes += [f"UNVERIFIED {name + ' ' if name else ''}restore: its bytes were not checked "
              "(--no-verify, a diagnostic): not a restore a job could rely on"
              for name, res in zip(_run_names(loaded), loaded, strict=True)
              if unverified(res["run"]) and any(s["phase"] == "restore" for s in res["summary"])]
    for name, res in zip(_run_names(loaded), loaded, strict=True):
        notes += [f"FAILED {name + ' ' if name else ''}{e['phase']} iteration {e['iteration']}: "
                  f"{e['message']}" for e in res["errors"]]
    return Grid(title, tuple(cols), tuple(rows), tuple(notes))


def storage_grid(loaded: Sequence[dict[str, Any]]) -> Grid | None:
    """Logical vs stored bytes and throughput, for runs whose format records stored bytes
    (zarr after its codec); None when no run does."""
    several = len(loaded) > 1
    rows = []
    for name, res in zip(_run_names(loaded), loaded, strict=True):
        codec = compare.facets(res["run"]).get("codec", "-")
        for s in res["summary"]:
            if "stored_bytes" not in s:
                continue
            ratio = s.get("compression_ratio")
            rows.append(((name,) if several else ()) + (
                s["phase"], codec, f"{s['bytes'] / 2**30:.3f}", f"{s['stored_bytes'] / 2**30:.3f}",
                "-" if ratio is None else f"{ratio:.3f}", gbps(s["throughput_bytes_per_s"]),
                gbps(s["stored_throughput_bytes_per_s"])))
    if not rows:
        return None
    cols = ([Column("run", key=True, numeric=False)] if several else []) + [
        Column("phase", key=True, numeric=False), Column("codec", numeric=False),
        Column("logical GiB"), Column("stored GiB"), Column("ratio", "med"),
        Column("logical GB/s", "med"), Column("stored GB/s", "med")]
    return Grid("stored bytes (zarr: after the codec)", tuple(cols), tuple(rows))


def restore_plan_grid(loaded: Sequence[dict[str, Any]]) -> Grid | None:
    """Restores that ran a restore plan: the layout restored onto, the bytes its plan gives
    the restoring ranks and the bytes read, the job's amplification, and the fill-ins a
    subset wrote for it off the clock (None when no run restored by a plan)."""
    several = len(loaded) > 1
    rows = []
    for name, res in zip(_run_names(loaded), loaded, strict=True):
        for s in res["summary"]:
            planned = s.get("planned_read_bytes")
            if s["phase"] != "restore" or planned is None:
                continue
            rows.append(((name,) if several else ()) + (
                s.get("restore_layout", f"world_size={s.get('restore_world_size', '?')}"),
                f"{s.get('restore_ranks', '-')}/{s.get('restore_world_size', '-')}",
                f"{planned / 2**30:.3f}", f"{s['bytes'] / 2**30:.3f}",
                f"{s.get('amplification', 0.0):.3f}", f"{s.get('fill_in_bytes', 0) / 2**30:.3f}"))
    if not rows:
        return None
    cols = ([Column("run", key=True, numeric=False)] if several else []) + [
        Column("restore\nlayout", key=True, numeric=False), Column("ranks\nrun/all"),
        Column("planned\nGiB"), Column("read\nGiB"),
        Column("amplif.\njob"), Column("fill-in\nGiB")]
    notes = ("planned: the bytes the DCP restore plan gives the restoring ranks; amplif.: "
             "bytes the whole job reads on this layout over the checkpoint's bytes; fill-in: "
             "the saved chunks a --ranks subset did not write but its restoring ranks read, "
             "written off the clock before the restore (in no phase's figures; the record "
             "names their files).",)
    return Grid("restore plan", tuple(cols), tuple(rows), notes)


PART_NOTES = {
    "data": "the ranks' writes or reads (first rank's start to last rank's end)",
    "gather": "the ranks' reports reaching the coordinator, its check that the files are there",
    "coordinator": "its CPU: the manifest built and encoded",
    "metadata": "the manifest written (save) or read (restore, the slowest reader)",
    "commit": "the rename that commits it (0: one PUT writes and commits)",
    "setup": "restore: from the manifest to the first data read (the reads planned, the "
             "reader's clients and handles made, its first requests sent; the last rank's)",
    "first_byte": "restore: the first data read's wait (on a store, the first GET's bytes "
                  "arriving; the last rank's)",
}
# torch-dcp's load (formats.dcp_load), one rank's: where its parts differ from the above
DCP_PART_NOTES = {
    "metadata": "DCP's .metadata read and unpickled",
    "planning": "DCP's local and global load plans and their scatter",
    "data": "the reads of DCP's files (the OS reads beneath its buffered streams, timed)",
    "deserialise": "the rest of reading the items: torch.load, narrowing, copies into the "
                   "pieces (on torch's intra-op threads)",
    "sync": "waiting for the other ranks (DCP's closing all_gather)",
}


def _rank_rows(s: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, parts) of a summary's rows: the phase's parts, or for a format that timed
    its ranks' parts (torch-dcp's load) the slowest rank's and the median rank's."""
    given = s.get("rank_parts")
    if not isinstance(given, dict) or not given:
        return [(s["phase"], s.get("parts"))]
    out = []
    for which in ("slowest", "median"):
        r = given.get(which)
        if isinstance(r, dict):
            ranks = sorted({str(x) for x in r.get("ranks") or []}, key=lambda x: (len(x), x))
            out.append((f"{s['phase']}: {which} rank {','.join(ranks) or '?'}", r.get("parts")))
    return out


def parts_grid(loaded: Sequence[dict[str, Any]]) -> Grid | None:
    """Each phase's median seconds by named part and their share of the phase (None when
    no run recorded parts); a torch-dcp restore's as two rows, its slowest rank's (the
    one the others waited for) and its median rank's, with their intra-op threads."""
    several = len(loaded) > 1
    rows_of = [(name, res, label, given) for name, res in zip(_run_names(loaded), loaded,
                                                              strict=True)
               for s in res["summary"] for label, given in _rank_rows(s)]
    names = list(dict.fromkeys(k for *_, given in rows_of if isinstance(given, dict)
                               for k in given))
    dcp = any("rank_parts" in s for res in loaded for s in res["summary"])
    rows = []
    for name, res, label, given in rows_of:
        parts = {k: float(v) for k, v in given.items() if isinstance(v, int | float)
                 and not isinstance(v, bool)} if isinstance(given, dict) else {}
        if not parts:  # none recorded (or none a number: a results file altered)
            continue
        total = sum(parts.values()) or 1.0
        cells = [f"{parts[k]:.3f} ({100 * parts[k] / total:.0f}%)" if k in parts else "-"
                 for k in names]
        phase = label.split(":")[0]
        s = next(x for x in res["summary"] if x["phase"] == phase)
        rows.append(((name,) if several else ()) + (
            label, *([threads_cell(res["run"], s)] if dcp else []), *cells))
    if not rows:
        return None
    cols = ([Column("run", key=True, numeric=False)] if several else []) + [
        Column("phase", key=True, numeric=False),
        *([Column("intra-op\nthreads")] if dcp else []),
        *(Column(f"{k} s", "med") for k in names)]
    plain = [k for k in dict.fromkeys(k for _, _, label, given in rows_of
                                      if ": " not in label and isinstance(given, dict)
                                      for k in given) if k in PART_NOTES]
    notes = ["Where each phase's seconds went (they add up to the phase's seconds; the share "
             "in brackets): " + "; ".join(f"{k}: {PART_NOTES[k]}" for k in plain) + "."
             ] if plain else []
    if dcp:
        notes.append("torch-dcp restore: one rank's dcp.load in parts (they add up to its "
                     "load's seconds): " + "; ".join(f"{k}: {v}" for k, v in
                                                    DCP_PART_NOTES.items() if k in names)
                     + ". slowest rank: the one whose own work (all but sync) ended last, "
                     "which the others waited for; median rank: the median of that work.")
    return Grid("the phases in parts", tuple(cols), tuple(rows), tuple(notes))


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def async_grid(loaded: Sequence[dict[str, Any]]) -> Grid | None:
    """--mode async runs: what the loop waited, the time until durable, the steps and the
    interference (None when no run is asynchronous)."""
    several = len(loaded) > 1
    rows = []
    for name, res in zip(_run_names(loaded), loaded, strict=True):
        for a in res.get("async", []):
            ratio, inter = a["blocking_over_limit"]["median"], a["interference"]
            rows.append(((name,) if several else ()) + (
                str(a["checkpoints"]), _s(a["blocking_s"]["median"]), _s(a["blocking_s"]["p99"]),
                str(a["waited_checkpoints"]), _s(a["snapshot_s"]["median"]),
                _s(a["limit_s"]["median"]), "-" if ratio is None else f"{ratio:.2f}",
                _s(a["persist_s"]["median"]), _s(a["persist_s"]["p99"]),
                _s(a["durable_after_s"]["median"]), _s(a["calibrated_step_s"]),
                _s(a["baseline_step_s"]), _s(a["during_step_s"]),
                "-" if inter is None else f"{100 * inter:+.1f} %"))
    if not rows:
        return None
    cols = ([Column("run", key=True, numeric=False)] if several else []) + [
        Column("ckpts"), Column("blocking s", "med"), Column("blocking s", "p99"),
        Column("waited"), Column("snapshot s", "med"), Column("limit s", "med"),
        Column("x limit", "med"), Column("persist s", "med"), Column("persist s", "p99"),
        Column("durable\nafter s", "med"), Column("step s", "calib"), Column("step s", "base"),
        Column("step s", "during"), Column("interference")]
    notes = ("Per checkpoint the slowest process; med, p99: over checkpoints. limit: the "
             "state's bytes over one plain copy into staging, timed just before each snapshot; "
             "x limit: blocking (without waits for the last persist) over it. step s: calib(rated "
             "on the idle machine), base(line loop without checkpoints), during persists.",)
    return Grid("asynchronous checkpoints", tuple(cols), tuple(rows), notes)


def table_width(widths: Sequence[int]) -> int:
    """Characters a rich table with the default box takes: each cell padded by one space
    on each side, a rule between and around the columns."""
    return sum(widths) + 3 * len(widths) + 1


def split(grid: Grid, limit: int | None) -> list[list[tuple[int, int]]]:
    """(column index, width) of each part: every part within `limit` characters (None: one
    part), the key columns in all of them, the other columns in order. A text column too
    wide for a part of its own is narrowed (it wraps, down to its longest word)."""
    widths = [grid.width_of(i) for i in range(len(grid.columns))]
    if limit is None:
        return [list(enumerate(widths))]
    keys = [i for i, c in enumerate(grid.columns) if c.key]
    for i, c in enumerate(grid.columns):
        excess = table_width([widths[j] for j in [*keys, i]]) - limit
        if not c.numeric and not c.key and excess > 0:
            widths[i] = max(widths[i] - excess, grid.longest_word(i))
    parts: list[list[int]] = []
    part = list(keys)
    for i in (i for i, c in enumerate(grid.columns) if not c.key):
        if len(part) > len(keys) and table_width([widths[j] for j in [*part, i]]) > limit:
            parts.append(part)
            part = list(keys)
        part.append(i)
    parts.append(part)
    return [[(i, widths[i]) for i in sorted(p)] for p in parts]


def render(console: Console, grid: Grid, width: int | None) -> None:
    """Print `grid` within `width` columns (None: as wide as the table needs)."""
    parts = split(grid, width)
    for n, part in enumerate(parts, 1):
        title = grid.title if len(parts) == 1 else f"{grid.title} ({n} of {len(parts)})"
        table = Table(title=title, title_justify="left")
        for i, w in part:
            col = grid.columns[i]
            table.add_column(col.header, justify="right" if col.numeric else "left",
                             no_wrap=col.numeric, overflow="fold", min_width=w, max_width=w)
        for row in grid.rows:
            table.add_row(*(row[i] for i, _ in part))
        need = table_width([w for _, w in part])
        console.print(table, width=max(need, width or 0), crop=False)
    for note in grid.notes:
        console.print(note, width=width, highlight=False, markup=False, crop=False)


def render_summary(console: Console, loaded: Sequence[dict[str, Any]], width: int | None) -> None:
    """The summary table, the restore plan's table when a restore ran one, the stored-bytes
    table when a run recorded stored bytes, and the asynchronous checkpoints' table for
    --mode async runs."""
    render(console, summary_grid(loaded), width)
    for extra in (restore_plan_grid(loaded), parts_grid(loaded), storage_grid(loaded),
                  async_grid(loaded)):
        if extra is not None:
            render(console, extra, width)


def output_width(wide: bool, width: int | None) -> int | None:
    """The width tables must fit: None with `wide` (as wide as they need, for logs and
    pipes read later), else `width`, else the terminal's (``$COLUMNS``; 80 when the output
    is a pipe, as under mpirun)."""
    if wide:
        return None
    return width or Console().width


class ClosedOutput(CkptbenchError):
    """Standard output's reader went away (``| head``): one line saying what was cut
    short, exit status 1 (not bad input)."""

    exit_code = 1


def closed_stdout(what: str) -> ClosedOutput:
    """The error for `what` cut short by a closed standard output; standard output is
    pointed at /dev/null first, so Python's flush at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return ClosedOutput(f"standard output: its reader closed it (broken pipe, e.g. `| head`) "
                        f"before {what} was written whole")


def write_stdout(data: bytes, what: str) -> None:
    """All of `data` to standard output, or :func:`closed_stdout`'s error (a buffered
    write of a large page can stop short at a closed pipe without raising)."""
    sys.stdout.flush()
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(sys.stdout.fileno(), view):]
    except BrokenPipeError:
        raise closed_stdout(what) from None


class _Console(Console):
    """rich's console, but a closed pipe is a :class:`ClosedOutput`, not a silent exit 1."""

    def on_broken_pipe(self) -> None:
        raise closed_stdout("the table")


def console_for(width: int | None, plain: bool = False) -> Console:
    """A console that prints `width` columns (None: as many as a line needs); `plain`: no
    colours or styles even on a terminal (MPI ranks print to a pseudo-terminal that
    mpirun copies into logs)."""
    return _Console(width=width or 100_000, force_terminal=False if plain else None)
