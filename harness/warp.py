"""MinIO's warp, run and read: the S3 reference tool of the side-by-side benchmark.

warp runs one operation (`put`, `get`) for a fixed duration with C concurrent requests
on objects of S bytes and prints a report; its "Average" is the steady state (warp
averages 1-s segments after dropping the first and last two). Credentials go to warp
through WARP_ACCESS_KEY / WARP_SECRET_KEY in its environment, never on its command line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.processes import ToolError, require_binary, run

_REPORT = re.compile(r"Report:\s*(PUT|GET)\..*?Ran:\s*([\dhms.]+).*?\*\s*Average:\s*([\d.]+)\s*"
                     r"(KiB|MiB|GiB)/s", re.DOTALL)
_UNIT = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
OPS = ("put", "get")


@dataclass(frozen=True)
class WarpOptions:
    """One warp operation's settings.

    multipart=False adds --disable-multipart (one PUT per object); signed=False adds
    --disable-sha256-payload (UNSIGNED-PAYLOAD, as over https).
    """

    host: str  # host:port, no scheme
    bucket: str
    obj_size: int
    concurrency: int
    duration: str = "10s"  # warp's syntax: 10s, 1m30s
    multipart: bool = True
    signed: bool = True


@dataclass(frozen=True)
class WarpResult:
    """warp's average for one operation, how long it ran, and the CPU warp used
    (its preparation included: for `get`, uploading the objects it then reads)."""

    op: str
    bytes_per_s: float
    seconds: float
    cpu_seconds: float

    @property
    def cpu_per_gb(self) -> float:
        """CPU seconds per GB (1e9 B) moved in the measured window."""
        return self.cpu_seconds / max(1e-9, self.bytes_per_s * self.seconds / 1e9)


def duration_seconds(text: str) -> float:
    """warp's '1m5s' / '6s' / '1h0m0.5s' -> seconds."""
    return sum(float(v) * {"h": 3600, "m": 60, "s": 1}[u]
               for v, u in re.findall(r"([\d.]+)([hms])", text))


def parse_report(stdout: str) -> tuple[float, float] | None:
    """(average bytes/s, seconds run) from warp's report, None if it has none."""
    m = _REPORT.search(stdout)
    if not m:
        return None
    return float(m.group(3)) * _UNIT[m.group(4)], duration_seconds(m.group(2))


def warp_command(binary: str, op: str, opts: WarpOptions, benchdata: Path) -> list[str]:
    """The command line for `op` (no credentials: those are in the environment)."""
    if op not in OPS:
        raise ValueError(f"warp op {op!r}: allowed are {', '.join(OPS)}")
    cmd = [binary, op, "--host", opts.host, "--bucket", opts.bucket, "--obj.size",
           str(opts.obj_size), "--concurrent", str(opts.concurrency), "--duration", opts.duration,
           "--no-color", "--benchdata", str(benchdata)]
    if op == "put" and not opts.multipart:
        cmd.append("--disable-multipart")
    if not opts.signed:
        cmd.append("--disable-sha256-payload")
    if op == "get":
        cmd += ["--objects", str(max(2 * opts.concurrency, 8))]
    return cmd


def run_warp(op: str, opts: WarpOptions, env: Mapping[str, str], workdir: Path) -> WarpResult:
    """Run `warp op` to its end in `workdir` (where it writes its benchdata file). `env`
    must hold WARP_ACCESS_KEY and WARP_SECRET_KEY. A failure is a one-line ToolError."""
    for key in ("WARP_ACCESS_KEY", "WARP_SECRET_KEY"):
        if not env.get(key):
            raise ToolError(f"warp {op}: {key} is not set in its environment")
    cmd = warp_command(require_binary("warp"), op, opts, workdir / f"warp-{op}")
    done = run(cmd, env=env, cwd=workdir)
    report = parse_report(done.stdout)
    if done.returncode or report is None:
        raise ToolError(f"warp {op} failed ({done.returncode}): {done.tail()}")
    rate, seconds = report
    return WarpResult(op, rate, seconds, done.cpu_seconds)
