#!/usr/bin/env python3
"""One rank's restore ceiling per S3 transport, with and without verification.

On a MinIO this script starts (or --endpoint/--bucket, keys from the environment), one rank
of llama3-8b-fsdp2-8 at --scale 4 (one DCP file of about 0.7 GiB) is saved and restored
with ckptbench's defaults, for each --transport, with verification and without it
(RunOptions.verify=False: a diagnostic, the run records its restores as unverified).
Prints restore GB/s and the client's CPU seconds per GB of the restore phase: what one
Python process per rank can move, which decides how many ranks a large client node needs.

    python benchmarks/restore_ceiling.py --transport botocore,crt,obstore --repeat 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.ckpt_turns import DCP_SCALE, DCP_WORKLOAD, run_turn  # noqa: E402
from harness import MinioServer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint")
    ap.add_argument("--bucket")
    ap.add_argument("--transport", default="botocore,crt,obstore")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args(argv)
    load0 = os.getloadavg()
    rows: dict[tuple[str, bool], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="restore-ceiling-") as tmp:
        server = None
        if a.endpoint:
            endpoint, bucket, env = a.endpoint, a.bucket, dict(os.environ)
        else:
            server = MinioServer(data_dir=Path(tmp) / "minio").start()
            endpoint, env, bucket = server.endpoint, server.env(), server.make_bucket()
        exclude = {server.proc.pid} if server is not None and server.proc else set()
        try:
            for i in range(a.repeat):
                order = [(t, v) for t in a.transport.split(",") for v in (True, False)]
                for t, verify in order if i % 2 == 0 else order[::-1]:
                    req = {"workload": DCP_WORKLOAD, "target": f"s3://{bucket}/ceiling",
                           "scale": DCP_SCALE, "ranks": "0", "iterations": a.iterations,
                           "verify": verify,
                           "backend_options": {"endpoint_url": endpoint, "transport": t}}
                    res = run_turn(req, env, Path(tmp), exclude)
                    rows.setdefault((t, verify), []).append(res)
                    print(f"run {i + 1} {t} verify={verify}: restore {res['restore'] / 1e9:.3f} "
                          f"GB/s, {res['cpu_restore']:.2f} CPU s/GB", file=sys.stderr, flush=True)
        finally:
            if server is not None:
                server.stop()
    load = os.getloadavg()
    print(f"one rank of {DCP_WORKLOAD.stem} --scale {DCP_SCALE}, defaults, cpus {os.cpu_count()}, "
          f"load average {load[0]:.1f} (start {load0[0]:.1f}), {a.repeat} round(s) of "
          f"{a.iterations} iterations; medians")
    print(f"{'transport':<10} {'verified':<9} {'restore GB/s':>12} {'CPU s/GB':>9} "
          f"{'save GB/s':>10} {'CPU s/GB':>9}")
    for (t, verify), runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{t:<10} {'yes' if verify else 'no':<9} {med['restore'] / 1e9:>12.3f} "
              f"{med['cpu_restore']:>9.2f} {med['save'] / 1e9:>10.3f} {med['cpu_save']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
