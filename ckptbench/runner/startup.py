"""The start of a restart that this machine can measure, recorded in every run.

A restart's *start* part (``cadence.restart``: processes, imports, CUDA and collective
initialisation) is a stated default per mechanism. Two pieces of it ckptbench pays itself
and can measure here: a fresh process's interpreter start and imports (this process's age
when the CLI has imported its commands), and the set-up of the run's ranks (local: the
forks until every rank runs; MPI: MPI's initialisation, the slowest rank's). They are
written as a ``startup`` record, so that a user can set the default against them
(``ckptbench levels --restart-part warm-spare.start=...``, or ``--measured-start``).
CUDA, NCCL and the training framework's own imports are not among them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

NOT_MEASURED = "CUDA and NCCL initialisation, the training framework's imports"
_marks: dict[str, float | None] = {}


def process_age_s() -> float | None:
    """Seconds since this process was created (Linux: /proc; 10 ms steps), else None."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - start_ticks / ticks)


def mark_imported() -> None:
    """The CLI, once its commands are imported: this process's start and imports so far."""
    _marks["imported"] = process_age_s()


def startup_record(ranks_set_up_s: float | None, how: str, processes: int) -> dict[str, Any]:
    """What this run measured of a restart's start (process 0's process; the ranks')."""
    imported, now = _marks.get("imported"), process_age_s()
    return {"type": "startup",
            "process_start_and_imports_s": None if imported is None else round(imported, 3),
            "to_run_s": None if now is None else round(now, 3),
            "ranks_set_up_s": None if ranks_set_up_s is None else round(ranks_set_up_s, 4),
            "ranks_set_up": how, "processes": processes, "not_measured": NOT_MEASURED}
