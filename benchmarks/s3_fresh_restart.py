#!/usr/bin/env python3
"""A restarting job's S3 save and restore against warp's put and get, one fresh process per run.

The protocol of issue 35: warp `put` and `get` of 64 MiB objects, 4 concurrent, for
--duration each, against `ckptbench run workloads/llama3-8b-fsdp2-8.toml --scale 4
--ranks 0-1 --prefill 2GiB --target s3://BUCKET/rN --json` with every S3 setting at its
default, each run a new `python -m ckptbench` process (its imports, clients, connections
and buffers all made afresh, as a job restarting after a failure makes them). The
machine is left as it is (free page reporting, governor, other load). Turns alternate
ABBA (warp, ckptbench, ckptbench, warp, ...); the ratio is ckptbench's median over warp's,
"pairs" the median of the per-round ratios. Each turn's 1-minute load average is printed
next to it: on a shared machine the figures say little without it.

`--code NAME=PATH` (repeatable) runs ckptbench from each of several source trees in the
same rounds (PYTHONPATH=PATH), so that two versions are compared turn by turn. The
restore's named parts (runner.parts: metadata, setup, first_byte, data) are printed as
medians per code tree.

    python benchmarks/s3_fresh_restart.py --repeat 4
    python benchmarks/s3_fresh_restart.py --code main=/tmp/main-tree --code new=. --repeat 3
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.machine_state import pairs_ratio  # noqa: E402
from harness import MinioServer, WarpOptions, run_warp  # noqa: E402

RUN = ["run", "workloads/llama3-8b-fsdp2-8.toml", "--scale", "4", "--ranks", "0-1",
       "--prefill", "2GiB", "--json"]


def load() -> float:
    return os.getloadavg()[0]


def ckptbench_turn(path: Path, endpoint: str, target: str, env: dict[str, str],
                   extra: list[str]) -> dict[str, Any]:
    """One fresh `python -m ckptbench run` from source tree `path`; its summary's save and
    restore throughput and the restore's parts."""
    cmd = [sys.executable, "-m", "ckptbench", *RUN, "--target", target, "--endpoint-url",
           endpoint, *extra]
    done = subprocess.run(cmd, cwd=path, env={**env, "PYTHONPATH": str(path)},
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode:
        raise SystemExit(f"s3_fresh_restart: ckptbench failed ({done.returncode}): "
                         f"{done.stderr.strip()[-400:]}")
    out = json.loads(done.stdout)
    by = {s["phase"]: s for s in out["summary"]}
    return {"save": by["save"]["throughput_bytes_per_s"],
            "restore": by["restore"]["throughput_bytes_per_s"],
            "parts": by["restore"].get("parts", {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="ABBA rounds")
    ap.add_argument("--duration", default="10s", help="warp's duration per operation")
    ap.add_argument("--code", action="append", default=[],
                    help="NAME=PATH: a ckptbench source tree to run (repeatable) "
                    "[default: this one]")
    ap.add_argument("--json", dest="json_out", help="also write every turn here")
    ap.add_argument("extra", nargs="*", help="after --: more `ckptbench run` arguments")
    a = ap.parse_args(argv)
    codes = dict(c.split("=", 1) for c in a.code) or {"ckptbench": str(ROOT)}
    rows: dict[str, list[Any]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="s3-fresh-") as tmp:
        workdir = Path(tmp)
        server = MinioServer(data_dir=workdir / "minio").start()
        try:
            bucket = server.make_bucket("ckptbench-fresh")
            env = server.env()
            env.update(WARP_ACCESS_KEY=server.access_key, WARP_SECRET_KEY=server.secret_key)
            host = server.endpoint.split("://", 1)[1]
            warp = WarpOptions(host, "warp-fresh", 64 << 20, 4, a.duration)
            n = 0
            for i in range(a.repeat):
                order = ["warp", *codes] if i % 2 == 0 else [*reversed(codes), "warp"]
                for tool in order:
                    server.empty_trash()
                    la = load()
                    if tool == "warp":
                        put, get = (run_warp(op, warp, env, workdir) for op in ("put", "get"))
                        rows["warp_put"].append(put.bytes_per_s)
                        rows["warp_get"].append(get.bytes_per_s)
                        rows["load:warp"].append(la)
                        print(f"round {i + 1}: warp PUT {put.bytes_per_s / 1e9:.3f} GET "
                              f"{get.bytes_per_s / 1e9:.3f} GB/s (load {la:.1f})",
                              file=sys.stderr, flush=True)
                        continue
                    n += 1
                    ck = ckptbench_turn(Path(codes[tool]), server.endpoint,
                                        f"s3://{bucket}/r{n}", env, a.extra)
                    rows[f"save:{tool}"].append(ck["save"])
                    rows[f"restore:{tool}"].append(ck["restore"])
                    rows[f"parts:{tool}"].append(ck["parts"])
                    rows[f"load:{tool}"].append(la)
                    print(f"round {i + 1}: {tool} save {ck['save'] / 1e9:.3f} restore "
                          f"{ck['restore'] / 1e9:.3f} GB/s (load {la:.1f}) parts "
                          + " ".join(f"{k} {v:.3f}" for k, v in ck["parts"].items()),
                          file=sys.stderr, flush=True)
        finally:
            server.stop()
    report(rows, codes, a.repeat)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=2))
    return 0


def report(rows: dict[str, list[Any]], codes: dict[str, str], repeat: int) -> None:
    med = statistics.median
    print(f"\n{repeat} ABBA rounds, fresh process per ckptbench run, cpus {os.cpu_count()}; "
          f"load average (1 min) at each turn's start: warp "
          + " ".join(f"{x:.1f}" for x in rows["load:warp"]))
    print(f"{'code':<12} {'op':<4} {'warp GB/s':>9} {'ckpt GB/s':>9} {'ratio':>6} {'pairs':>6}"
          "   runs (warp | ckptbench) [load]")
    for tool in codes:
        for op, w in (("save", "warp_put"), ("restore", "warp_get")):
            ours = rows[f"{op}:{tool}"]
            runs = (" ".join(f"{x / 1e9:.3f}" for x in rows[w]) + " | "
                    + " ".join(f"{x / 1e9:.3f}" for x in ours) + " ["
                    + " ".join(f"{x:.1f}" for x in rows[f"load:{tool}"]) + "]")
            print(f"{tool:<12} {op:<4} {med(rows[w]) / 1e9:>9.3f} {med(ours) / 1e9:>9.3f} "
                  f"{med(ours) / med(rows[w]):>6.2f} {pairs_ratio(rows[w], ours):>6.2f}   {runs}")
        parts = rows[f"parts:{tool}"]
        names = list(dict.fromkeys(k for p in parts for k in p))
        print(f"{tool:<12} restore parts (median s): "
              + ", ".join(f"{k} {med(p.get(k, 0.0) for p in parts):.3f}" for k in names))


if __name__ == "__main__":
    sys.exit(main())
