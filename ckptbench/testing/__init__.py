"""The harness that tests and benchmarks share: a real MinIO server, a fault-injecting
proxy in front of it, and the reference tools (warp, fio) run and read.

Importable without pytest; nothing here runs at import. Every process it starts runs in
a process group of its own and dies with the harness (processes.py says how).
"""

from __future__ import annotations

from ckptbench.testing.fault_proxy import FaultProxy
from ckptbench.testing.fio import FioJob, run_fio
from ckptbench.testing.minio import MinioServer, empty_trash
from ckptbench.testing.processes import (
    Finished,
    ToolError,
    find_binary,
    free_port,
    go_bin_dir,
    require_binary,
    run,
)
from ckptbench.testing.warp import WarpOptions, WarpResult, run_warp

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
