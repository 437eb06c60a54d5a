#!/usr/bin/env python3
"""ckptbench's S3 backend against MinIO's warp: same server, object size and concurrency.

warp runs `put` then `get` for a fixed duration with C concurrent operations on objects of
S bytes; ckptbench then saves and restores a checkpoint made of S-byte objects (one object
per tensor: a custom model whose every matrix is S bytes, files = per-chunk, one rank with
C I/O threads, so C objects move at once). Two modes, each compared like with like:

* single:    warp --disable-multipart (one PUT per object)  vs  --part-size S (one PUT)
* multipart: warp's default for S > 16 MiB (minio-go: 16 MiB parts, uploaded one after
             the other: warp's data reader has no ReadAt)    vs  --part-size 16MiB
                                                                 --s3-concurrency 1

warp GETs each object whole; so does ckptbench (--block-size S --s3-concurrency 1: one
GET per object, read into one buffer), in both modes.

Payload signing is compared like with like (--signing): "signed" is both tools' default
over http (a SHA-256 of every body in the signature: warp's streaming signature,
botocore's signed payload); "unsigned" sends UNSIGNED-PAYLOAD from both (warp
--disable-sha256-payload, ckptbench --s3-payload-signing off), as both do over https.

ckptbench's restore includes what the benchmark is for: every byte restored is verified
against its digest. Its payload (and digests) are generated before the clock (--prefill
of the whole checkpoint), as in vs_fio; warp generates its data as it sends.

    python benchmarks/vs_warp.py                      # starts its own MinIO (ckptbench.testing)
    python benchmarks/vs_warp.py --obj-size 64MiB --concurrency 8 --duration 20s
    python benchmarks/vs_warp.py --endpoint http://host:9000 --bucket b   # keys from env

The checkpoint's object count is rounded up to a multiple of C where the model allows
(model_layers), so each wave of the save moves C objects at once, as warp's steady state
does. Before each tool's turn the MinIO this script started has its trash emptied
(harness.minio.empty_trash says why) and the page cache is dropped (when
permitted); turns alternate in ABBA order (warp, ckptbench, ckptbench, warp, ...) over
--repeat, and each turn's share of CPU stolen by the hypervisor (a busy neighbour on the
host) is printed with it.

The machine is left as it is unless asked. On a VM with free page reporting (memory the
guest frees goes back to the host, and faulting it back in costs about 4 s of CPU per GB
inside whichever tool touches it), `--page-reporting pause` (root) turns reporting off
for the run, backs the memory a turn needs once and restores the setting at the end,
also on SIGTERM or SIGHUP (machine_state.reporting_paused). --warm-memory (touch memory
before each turn, as vs_fio does) is off by default here: with reporting paused it has
nothing left to do, and without that a warm-up is undone within seconds.

Prints a table of GB/s (1e9 B/s) and ckptbench / warp for PUT (save) and GET (restore):
the ratio of the medians, and the median of the ratios of each alternating run pair
("pairs", which holds better when the machine's speed drifts between pairs).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.ckpt_turns import (  # noqa: E402
    DCP_RANKS,
    DCP_SCALE,
    DCP_WORKLOAD,
    dcp_request,
    run_turn,
)
from benchmarks.machine_state import (  # noqa: E402
    add_reporting_option,
    cpu_ticks,
    memory_for_run,
    pairs_ratio,
    parse_warm,
    prepare_turn,
    stolen_share,
    warm_size,
)
from ckptbench.errors import CkptbenchError, SpecError  # noqa: E402
from ckptbench.units import parse_size  # noqa: E402
from harness import (  # noqa: E402
    MinioServer,
    ToolError,
    WarpOptions,
    find_binary,
    run_warp,
)

MIB = 1 << 20
DCP_WORKLOAD_NAME = DCP_WORKLOAD.stem


def model_layers(objects: int, concurrency: int) -> int:
    """Layers of a model with at least `objects` matrices (7 per layer, plus the embeddings
    and the output), their count a multiple of the concurrency where one is within C
    layers: then every wave of the save moves C objects at once, as warp's steady state
    does, and no thread is left alone with a last object (37 objects on 4 threads were
    waves of 4 and a straggler)."""
    first = max(1, math.ceil((objects - 2) / 7))
    return next((n for n in range(first, first + concurrency) if matrices(n) % concurrency == 0),
                first)


def matrices(layers: int) -> int:
    """The obj_size objects of workload(obj_size, layers): 7 per layer, embeddings, output."""
    return 7 * layers + 2


def prefill_bytes(layers: int, concurrency: int, obj_size: int) -> int:
    """--prefill that makes each thread's whole share before the clock: C x (ceil(matrices
    / C) + 1) objects, the one over for the norm vectors (the engine spreads each size
    evenly over the threads, and gives a thread whose share fits a buffer per block)."""
    return concurrency * (-(-matrices(layers) // concurrency) + 1) * obj_size


def workload(obj_size: int, layers: int) -> str:
    """A model whose every matrix is obj_size bytes of fp32 (dim x dim), one object each:
    7 * layers + 2 of them (and each layer's two norm vectors, dim * 4 bytes each)."""
    dim = math.isqrt(obj_size // 4)
    if dim * dim * 4 != obj_size or dim % 64:
        raise SystemExit(f"vs_warp: --obj-size must be 4*d*d bytes with d a multiple of 64 "
                         f"(16MiB, 64MiB, 256MiB, ...), not {obj_size}")
    return f"""
[workload]
name = "vs-warp-{obj_size // MIB}MiB"
description = "every tensor one {obj_size // MIB} MiB object"

[model]
name = "custom"
layers = {layers}
dim = {dim}
heads = {dim // 64}
kv_heads = {dim // 64}
head_dim = 64
ffn_dim = {dim}
vocab_size = {dim}

[state]
param_dtype = "float32"
optimizer = "none"

[parallel]
world_size = 1
layout = "fsdp2"

[checkpoint]
files = "per-chunk"
"""


def shares(values: list[float]) -> str:
    """[0.021, 0.003] -> '2.1% 0.3%'."""
    return " ".join(f"{x:.1%}" for x in values)


def ckptbench_request(endpoint: str, bucket: str, obj_size: int, concurrency: int,
                      layers: int, iterations: int, multipart: bool, signed: bool,
                      transport: str, workdir: Path) -> dict[str, Any]:
    """The warp-shaped checkpoint: one block per object, so each restore is one GET of the
    whole object, as warp's GETs are. The whole checkpoint's payload is generated before
    the clock, as the engine's rule and vs_fio have it; warp generates its data as it
    sends."""
    wl = workdir / "vs-warp.toml"
    wl.write_text(workload(obj_size, layers))
    return {"workload": wl, "target": f"s3://{bucket}/vs-warp", "threads": concurrency,
            "iterations": iterations, "block_size": obj_size,
            "prefill_bytes": prefill_bytes(layers, concurrency, obj_size),
            "backend_options": {"endpoint_url": endpoint, "transport": transport,
                                "payload_signing": "on" if signed else "off",
                                "part_size": 16 << 20 if multipart else obj_size,
                                "concurrency": 1}}


def main(argv: list[str] | None = None) -> int:
    try:
        return compare(argv)
    except CkptbenchError as exc:  # a tool missing or failed, or the run: one line
        raise SystemExit(f"vs_warp: {exc}") from None


def compare(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", help="use this S3 endpoint (keys from AWS_ACCESS_KEY_ID/"
                    "AWS_SECRET_ACCESS_KEY) instead of starting a MinIO")
    ap.add_argument("--bucket", default=None, help="with --endpoint: an existing bucket")
    ap.add_argument("--obj-size", default="64MiB")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--duration", default="15s", help="warp's duration per operation")
    ap.add_argument("--objects", type=int, default=0,
                    help="objects per ckptbench checkpoint, at least (rounded up to a multiple "
                    "of --concurrency where the model allows) [default: 8 per thread]")
    ap.add_argument("--iterations", type=int, default=3, help="ckptbench iterations (median)")
    ap.add_argument("--repeat", type=int, default=1, help="alternate warp/ckptbench N times")
    ap.add_argument("--mode", choices=["single", "multipart", "both"], default="both")
    ap.add_argument("--signing", choices=["signed", "unsigned", "both"], default="both",
                    help="payload signing of both tools (see above)")
    ap.add_argument("--warm-memory", default="0",
                    help="memory to touch (then free) before each tool's turn; 'auto' is twice "
                    "the bytes ckptbench moves plus 1 GiB, at most half the available memory "
                    "[default: 0, none: see above]")
    add_reporting_option(ap)
    ap.add_argument("--workload", choices=["warp", "dcp", "both"], default="both",
                    help="warp-shaped objects with matched settings, and/or the DCP-shaped "
                    "checkpoint with ckptbench's defaults against warp's")
    ap.add_argument("--transport", default="botocore",
                    help="ckptbench's --s3-transport values to compare, comma-separated "
                    "(botocore,crt,obstore); crt is left out of the signed rows")
    ap.add_argument("--json", dest="json_out", help="also write the numbers here")
    a = ap.parse_args(argv)
    try:
        obj_size = parse_size(a.obj_size, "--obj-size")
        warm = parse_warm(a.warm_memory)
    except SpecError as exc:
        ap.error(str(exc))
    layers = model_layers(a.objects or 8 * a.concurrency, a.concurrency)
    objects = matrices(layers)
    if warm is None:
        warm = warm_size(2 * a.iterations * objects * obj_size)
    if not find_binary("warp"):
        raise ToolError("no `warp` binary on PATH or in $(go env GOPATH)/bin; build it with "
                        ".ci/setup")
    transports = a.transport.split(",")
    modes = [(m, sg) for m in (["single", "multipart"] if a.mode == "both" else [a.mode])
             for sg in (["signed", "unsigned"] if a.signing == "both" else [a.signing])]

    load0 = os.getloadavg()
    server: MinioServer | None = None
    with (tempfile.TemporaryDirectory(prefix="vs-warp-") as tmp,
          memory_for_run(a, a.iterations * objects * obj_size) as memory_state):
        print(memory_state, file=sys.stderr, flush=True)
        workdir = Path(tmp)
        if a.endpoint:
            endpoint, bucket = a.endpoint, a.bucket
            if not bucket:
                raise SystemExit("vs_warp: --endpoint needs --bucket")
            key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
            if not key or not secret:
                raise SystemExit("vs_warp: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
            env = dict(os.environ)
            warp_bucket = f"{bucket}-warp"
        else:
            server = MinioServer(data_dir=workdir / "minio").start()
            endpoint, env = server.endpoint, server.env()
            key, secret = server.access_key, server.secret_key
            bucket = server.make_bucket("ckptbench-vs-warp")
            warp_bucket = "warp-vs-ckptbench"  # warp creates and empties its own bucket
        env.update(WARP_ACCESS_KEY=key, WARP_SECRET_KEY=secret)  # never on a command line
        host = endpoint.split("://", 1)[1].rstrip("/")
        exclude = {server.proc.pid} if server is not None and server.proc else set()
        groups: list[tuple[str, WarpOptions, dict[str, dict[str, Any]]]] = []
        if a.workload in ("warp", "both"):
            for mode, signing in modes:
                mp, signed = mode == "multipart", signing == "signed"
                reqs = {t: ckptbench_request(endpoint, bucket, obj_size, a.concurrency, layers,
                                             a.iterations, mp, signed, t, workdir)
                        for t in transports if not (signed and t == "crt")}  # crt: unsigned
                groups.append((f"{mode}/{signing}", WarpOptions(
                    host, warp_bucket, obj_size, a.concurrency, a.duration, multipart=mp,
                    signed=signed), reqs))
        if a.workload in ("dcp", "both"):  # warp's defaults against ckptbench's
            groups.append(("dcp/defaults", WarpOptions(host, warp_bucket, 64 * MIB, 4, a.duration),
                           {t: dcp_request(endpoint, bucket, t, a.iterations) for t in transports}))
        rows: dict[str, dict[str, list[float]]] = {}
        try:
            for name, warp_opts, reqs in groups:
                r = rows.setdefault(name, collections.defaultdict(list))
                for i in range(a.repeat):
                    order = ["warp", *reqs] if i % 2 == 0 else [*reversed(reqs), "warp"]
                    for tool in order:
                        if server is not None:  # only a server this script started
                            server.empty_trash()
                        prepare_turn(warm)
                        ticks = cpu_ticks()
                        if tool == "warp":
                            for op in ("put", "get"):
                                res = run_warp(op, warp_opts, env, workdir)
                                r[f"warp_{op}"].append(res.bytes_per_s)
                                r[f"cpu_warp_{op}"].append(res.cpu_per_gb)
                            r["steal_warp"].append(stolen_share(ticks, cpu_ticks()))
                            print(f"{name} run {i + 1}: warp PUT {r['warp_put'][-1] / 1e9:.3f} GET "
                                  f"{r['warp_get'][-1] / 1e9:.3f} GB/s (CPU stolen "
                                  f"{shares(r['steal_warp'][-1:])})", file=sys.stderr, flush=True)
                            continue
                        ck = run_turn(reqs[tool], env, workdir, exclude)
                        for k in ("save", "restore", "cpu_per_gb", "cpu_save", "cpu_restore"):
                            r[f"{k}:{tool}"].append(ck[k])
                        r[f"steal:{tool}"].append(stolen_share(ticks, cpu_ticks()))
                        print(f"{name} run {i + 1}: ckptbench[{tool}] save {ck['save'] / 1e9:.3f} "
                              f"restore {ck['restore'] / 1e9:.3f} GB/s, CPU s/GB save "
                              f"{ck['cpu_save']:.2f} restore {ck['cpu_restore']:.2f} (CPU stolen "
                              f"{shares(r[f'steal:{tool}'][-1:])})", file=sys.stderr, flush=True)
        finally:
            if server is not None:
                server.stop()

    med = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in rows.items()}
    load = os.getloadavg()
    print(f"\nwarp-shaped: object size {obj_size / MIB:g} MiB ({objects} per ckptbench "
          f"checkpoint, and {2 * layers + 1} norm vectors), concurrency {a.concurrency}; "
          f"dcp: {DCP_WORKLOAD_NAME} --scale {DCP_SCALE} --ranks {DCP_RANKS} with ckptbench's "
          f"defaults against warp's (64 MiB objects, 4 concurrent); endpoint "
          f"{'MinIO (local, started here)' if server else endpoint}, cpus {os.cpu_count()}, "
          f"load average {load[0]:.1f} (start {load0[0]:.1f}), {a.repeat} alternating run(s), "
          f"warm-up {warm / 2**30:.2f} GiB")
    print(memory_state)
    print(f"{'mode':<17} {'transport':<9} {'op':<4} {'warp GB/s':>9} {'ckpt GB/s':>9} "
          f"{'ratio':>6} {'pairs':>6} {'CPU s/GB warp|ckpt':>19}   runs (warp | ckptbench)")
    for mode, m in med.items():
        for t in sorted({k.split(":")[1] for k in m if ":" in k}):
            for op, w, c in (("PUT", "warp_put", "save"), ("GET", "warp_get", "restore")):
                runs = (" ".join(f"{x / 1e9:.3f}" for x in rows[mode][w]) + " | "
                        + " ".join(f"{x / 1e9:.3f}" for x in rows[mode][f"{c}:{t}"]))
                pairs = pairs_ratio(rows[mode][w], rows[mode][f"{c}:{t}"])
                cpu = f"{m[f'cpu_warp_{w[5:]}']:.2f}|{m[f'cpu_{c}:{t}']:.2f}"
                print(f"{mode:<17} {t:<9} {op:<4} {m[w] / 1e9:>9.3f} {m[f'{c}:{t}'] / 1e9:>9.3f} "
                      f"{m[f'{c}:{t}'] / m[w]:>6.2f} {pairs:>6.2f} {cpu:>19}   {runs}")
    print("CPU s/GB: the client's CPU per GB moved, medians. warp's put and get turns (its get "
          "includes uploading the objects it reads); ckptbench's timed phase alone (requests, "
          "copies, verification, payload made inside the clock; not start-up or --prefill). "
          "Whole ckptbench runs "
          "(start-up and payload included): " + "; ".join(
              f"{mode}[{k.split(':')[1]}] {v:.2f}" for mode, m in med.items()
              for k, v in m.items() if k.startswith("cpu_per_gb:")))
    print("CPU stolen by the hypervisor per turn (other guests' load; under 2% is a quiet "
          "host): " + "; ".join(
              f"{mode}: warp {shares(rows[mode]['steal_warp'])} | " + " | ".join(
                  f"{k.split(':')[1]} {shares(v)}" for k, v in rows[mode].items()
                  if k.startswith("steal:")) for mode in med))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"obj_size": obj_size, "concurrency": a.concurrency,
                                                "load": load, "runs": rows, "median": med},
                                               indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
