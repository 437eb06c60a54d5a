"""The harness that the repository's tests and benchmarks share: a real MinIO server, a
fault-injecting proxy in front of it, GlusterFS on one machine, and the reference tools
(warp, fio) run and read. Not part of the installed package (pyproject installs
``ckptbench*`` only): it is imported from a checkout, whose root is on the path.

Importable without pytest; nothing here runs at import. Every process it starts runs in
a process group of its own and dies with the harness (processes.py says how).
"""

from __future__ import annotations

from harness.fault_proxy import FaultProxy
from harness.fio import FioJob, run_fio
from harness.minio import MinioServer, empty_trash
from harness.processes import (
    Finished,
    ToolError,
    find_binary,
    free_port,
    go_bin_dir,
    require_binary,
    run,
)
from harness.warp import WarpOptions, WarpResult, run_warp

__all__ = [
    "FaultProxy",
    "Finished",
    "FioJob",
    "MinioServer",
    "ToolError",
    "WarpOptions",
    "WarpResult",
    "empty_trash",
    "find_binary",
    "free_port",
    "go_bin_dir",
    "require_binary",
    "run",
    "run_fio",
    "run_warp",
]
