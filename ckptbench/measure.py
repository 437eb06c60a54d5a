"""A measured run end to end, for the CLI and for scripts that call the library in process:
the session, then the summary (the report step) appended to the results file.

Sits above the runner and the report in the data flow: the runner records, the report
summarizes, and this glue hands the caller the summary it computed from the records in
memory (the results file is written once and never read back).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckptbench.records import JsonlSink
from ckptbench.report import summarize, view
from ckptbench.runner import Launcher, RunRequest, run_session


def measure(req: RunRequest, results: str | Path, launcher: Launcher | None = None,
            on_progress: Callable[[int], None] | None = None,
            on_start: Callable[[], None] | None = None,
            on_notice: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """Run `req`, write its records and summary to `results` (a new file); return the run
    as :func:`ckptbench.report.view` gives it (None on MPI ranks other than 0). Raises
    RunFailed after the summary of what did run is written. `on_notice` gets one-line
    notes for the user (what interrupted runs left, files left in place)."""
    if launcher is None:
        from ckptbench.runner.launch_local import LocalLauncher

        launcher = LocalLauncher()
    sink = JsonlSink(results) if launcher.root else None
    outcome = None
    try:
        failure = run_session(req, launcher, sink, on_progress, on_start, on_notice)
    finally:
        if sink is not None and sink.is_open:  # also when interrupted: what ran is summarized
            sink.write_all(summarize(sink.records))
            sink.close()
            outcome = view(sink.records, str(results))
    if failure is not None:
        raise failure
    return outcome
