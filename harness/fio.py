"""fio, run and read: the POSIX reference tool of the side-by-side benchmark.

One fio job per file, all jobs at once, each writing (or reading back) one file of a
given size with one block size, psync, as a checkpoint's ranks write their files.
Bandwidth is fio's group figure: total bytes over the slowest job's time, which is
ckptbench's aggregate throughput too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.processes import ToolError, require_binary, run

RW = ("write", "read")


@dataclass(frozen=True)
class FioJob:
    """Files of `sizes` bytes (one job each) in `directory`, `bs`-byte psync calls."""

    directory: Path
    sizes: Sequence[int]
    bs: int
    direct: bool

    def moved_bytes(self) -> int:
        """What fio moves: each file rounded down to whole blocks."""
        return sum(n // self.bs * self.bs for n in self.sizes)


def jobfile(job: FioJob, rw: str) -> str:
    """fio's job file for `rw` ('write' or 'read').

    Writes end with an fsync (end_fsync=1) and do not preallocate (fallocate=none: fio
    otherwise lays out each file before its clock, work a checkpointer does inside its
    own); reads invalidate the page cache of their files first (invalidate=1).
    """
    if rw not in RW:
        raise ValueError(f"fio rw {rw!r}: allowed are {', '.join(RW)}")
    lines = ["[global]", f"directory={job.directory}", f"rw={rw}", f"bs={job.bs}",
             "ioengine=psync", "fallocate=none", f"direct={int(job.direct)}",
             "end_fsync=1" if rw == "write" else "invalidate=1",
             "group_reporting=1", "thread=0", ""]
    for i, size in enumerate(job.sizes):
        lines += [f"[rank{i}]", f"filename=rank{i}.fio", f"size={size}", ""]
    return "\n".join(lines)


def parse_bandwidth(stdout: str, rw: str) -> float:
    """Bytes/s of the group from `fio --output-format=json` (text before the JSON, such
    as fio's warnings, is skipped)."""
    data = json.loads(stdout[stdout.index("{"):])
    return float(data["jobs"][0]["write" if rw == "write" else "read"]["bw_bytes"])


def run_fio(job: FioJob, rw: str) -> float:
    """Run the job file for `rw` to its end; the group's bytes/s. A failure is a
    one-line ToolError."""
    binary = require_binary("fio")
    path = job.directory / f"job-{rw}.fio"
    path.write_text(jobfile(job, rw))
    done = run([binary, "--output-format=json", str(path)])
    if done.returncode:
        raise ToolError(f"fio {rw} failed ({done.returncode}): {done.tail()}")
    try:
        return parse_bandwidth(done.stdout, rw)
    except (ValueError, KeyError, IndexError) as exc:
        raise ToolError(f"fio {rw}: no bandwidth in its JSON output ({exc})") from exc
