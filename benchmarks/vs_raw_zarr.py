"""The zarr format against the raw format on the same plan and target (and DCP's own writer).

Runs ``ckptbench run`` for every configuration, several rounds interleaved (raw, zarr,
compressed zarr, torch-dcp, raw, ...) so that a drifting disk or a noisy neighbour hits
every configuration alike. Each round and configuration has two runs: a save-only run
(``--no-restore``: iterations of save, then deletion of the checkpoint) for the save
figures, and a round trip (save, evict, restore, verify) for the restore figures, so the
save numbers do not carry the previous iteration's restore and cache eviction. Reported:
the median over all iterations of all rounds of

* save and restore throughput, logical (plan bytes / time) and stored (bytes after the
  codec / time), and the compression ratio (logical / stored);
* the ratio per state kind (bf16 weights, fp32 Adam moments), from the op records;
* zarr uncompressed vs raw save throughput: the ratio of the medians, and the median of
  the per-round ratios (the closing note, with the compressed figures).

Uncompressed runs use the random payload (what raw measures); compressed ones the
realistic payload (trained-checkpoint statistics), since random bytes do not compress.

    python benchmarks/vs_raw_zarr.py                       # a mid-size bf16 workload, /tmp
    python benchmarks/vs_raw_zarr.py --workload workloads/llama3-8b-fsdp2-8.toml --scale 16
    python benchmarks/vs_raw_zarr.py --torch-python /path/to/venv-with-torch/bin/python
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ckptbench.records import read_records
from ckptbench.report import iteration_stats

# About 400 MB per checkpoint: bf16 weights and fp32 AdamW moments, FSDP2 over 4 ranks.
MID_WORKLOAD = """\
[workload]
name = "mid-bf16"
description = "mid-size custom Llama: bf16 weights + fp32 AdamW, FSDP2 over 4 ranks (~400 MB)"
[model]
name = "custom"
layers = 2
dim = 1024
heads = 8
kv_heads = 4
ffn_dim = 2816
vocab_size = 8000
[state]
param_dtype = "bfloat16"
optimizer = "adamw"
optimizer_dtype = "float32"
[parallel]
world_size = 4
layout = "fsdp2"
"""

DEFAULT_CODECS = ["zstd", "lz4", "blosc:shuffle=byte", "blosc:cname=lz4,shuffle=bit"]


def run_one(python: str, workload: Path, target: Path, results: Path, fmt: str, codec: str,
            payload: str, args: argparse.Namespace, restore: bool) -> list[dict[str, Any]]:
    cmd = [python, "-m", "ckptbench", "run", str(workload), "--target", str(target),
           "--format", fmt, "--codec", codec, "--payload", payload,
           "--iterations", str(args.iterations if not restore else args.restore_iterations),
           "--scale", str(args.scale), "--results", str(results)]
    if not restore:
        cmd.append("--no-restore")
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"vs_raw_zarr: {' '.join(cmd[3:])} failed: {done.stderr.strip()[-400:]}")
    return list(read_records(results))


def kind_of(obj: str) -> str | None:
    array = obj.split("/", 1)[0]
    if array.startswith("model."):
        return "weights"
    if array.endswith(("exp_avg", "exp_avg_sq")):
        return "adam moments"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", type=Path, default=None, help="a workload file [a ~400 MB bf16 one]")
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--target", type=Path, default=None, help="a local directory [a new one in /tmp]")
    ap.add_argument("--iterations", type=int, default=5, help="per save-only run")
    ap.add_argument("--restore-iterations", type=int, default=2, help="per round-trip run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of every run")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--codecs", nargs="*", default=DEFAULT_CODECS)
    ap.add_argument("--torch-python", default=None,
                    help="a python with torch for the torch-dcp runs [this one, if it has torch]")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ckptbench-vs-raw-"))
    workload = args.workload
    if workload is None:
        workload = work / "mid-bf16.toml"
        workload.write_text(MID_WORKLOAD)
    target = args.target or work / "target"
    torch_python = args.torch_python or (sys.executable if importlib.util.find_spec("torch") else None)

    configs: list[tuple[str, str, str, str]] = [  # label, format, codec, payload
        ("raw", "raw", "none", "random"),
        ("zarr", "zarr", "none", "random"),
        *[(f"zarr {c}", "zarr", c, "realistic") for c in args.codecs],
    ]
    if torch_python:
        configs.append(("torch-dcp", "torch-dcp", "none", "random"))

    per_iter: dict[str, dict[str, list[dict[str, Any]]]] = {c[0]: {"save": [], "restore": []}
                                                            for c in configs}
    by_kind: dict[str, dict[str, list[int]]] = {}
    round_ratio: list[float] = []
    started = time.time()
    for rnd in range(args.rounds):
        round_save: dict[str, float] = {}
        for label, fmt, codec, payload in configs:
            python = torch_python if fmt == "torch-dcp" else sys.executable
            assert python
            stem = f"{label.replace(' ', '_').replace(':', '-')}-{rnd}"
            recs = run_one(python, workload, target, work / f"{stem}.jsonl", fmt, codec, payload,
                           args, restore=False)
            per_iter[label]["save"] += [i for i in iteration_stats(recs) if i["phase"] == "save"]
            trip = run_one(python, workload, target, work / f"{stem}-trip.jsonl", fmt, codec,
                           payload, args, restore=True)
            per_iter[label]["restore"] += [i for i in iteration_stats(trip)
                                           if i["phase"] == "restore"]
            saves = [i["throughput_bytes_per_s"] for i in per_iter[label]["save"][-args.iterations:]]
            round_save[label] = statistics.median(saves)
            for r in recs:
                kind = kind_of(r["object"]) if r["type"] == "op" and r["op"] == "write_shard" else None
                if kind:
                    k = by_kind.setdefault(label, {}).setdefault(kind, [0, 0])
                    k[0] += r["bytes"]
                    k[1] += r["stored_bytes"]
        round_ratio.append(round_save["zarr"] / round_save["raw"])
        print(f"round {rnd + 1}/{args.rounds}: zarr/raw save {round_ratio[-1]:.2f} "
              f"({time.time() - started:.0f} s)", file=sys.stderr)

    recs0 = list(read_records(next(work.glob("raw-0.jsonl"))))
    run0 = recs0[0]
    per_ckpt = run0["bytes_per_iteration"]
    print(f"\nworkload {run0['workload']['name']} (scale {args.scale}): {per_ckpt / 1e6:.0f} MB per "
          f"checkpoint, {len(run0['ranks'])} ranks; "
          f"target {target} ({run0['environment']['target'].get('fs_type', '?')}); "
          f"{args.rounds} rounds x ({args.iterations} save-only + {args.restore_iterations} "
          "round-trip iterations), medians over all iterations")
    head = (f"{'config':46s} {'save GB/s':>9s} {'stored':>7s} {'restore':>8s} {'stored':>7s} "
            f"{'ratio':>6s}  save min-max")
    print(head)
    print("-" * len(head))
    figures: dict[str, Any] = {}
    for label, _fmt, codec, payload in configs:
        sv, rs = per_iter[label]["save"], per_iter[label]["restore"]
        save = statistics.median(i["throughput_bytes_per_s"] for i in sv) / 1e9
        rest = statistics.median(i["throughput_bytes_per_s"] for i in rs) / 1e9 if rs else float("nan")
        has_stored = "stored_bytes" in sv[0]
        ssave = statistics.median(i["stored_throughput_bytes_per_s"] for i in sv) / 1e9 if has_stored else save
        srest = statistics.median(i["stored_throughput_bytes_per_s"] for i in rs) / 1e9 if has_stored and rs else rest
        ratio = statistics.median(i["compression_ratio"] for i in sv) if has_stored else 1.0
        lo = min(i["throughput_bytes_per_s"] for i in sv) / 1e9
        hi = max(i["throughput_bytes_per_s"] for i in sv) / 1e9
        name = f"{label} ({payload})"
        print(f"{name:46s} {save:9.3f} {ssave:7.3f} {rest:8.3f} {srest:7.3f} {ratio:6.3f}  {lo:.3f}-{hi:.3f}")
        figures[label] = {"codec": codec, "payload": payload, "save_GBps": save,
                          "save_stored_GBps": ssave, "restore_GBps": rest,
                          "restore_stored_GBps": srest, "ratio": ratio,
                          "save_min_GBps": lo, "save_max_GBps": hi}
    if by_kind:
        print("\ncompression ratio by state kind (logical / stored bytes of the shards written):")
        for label, kinds in by_kind.items():
            if label == "zarr":
                continue
            parts = ", ".join(f"{k} {v[0] / v[1]:.3f}" for k, v in sorted(kinds.items()))
            print(f"  {label:32s} {parts}")
            figures[label]["ratio_by_kind"] = {k: v[0] / v[1] for k, v in kinds.items()}

    raw, zarr = figures["raw"]["save_GBps"], figures["zarr"]["save_GBps"]
    med_round = statistics.median(round_ratio)
    compressed = "; ".join(
        f"{label[5:]} {f['save_GBps']:.3f} GB/s logical = {f['save_stored_GBps']:.3f} GB/s stored "
        f"at {f['ratio']:.2f}x" for label, f in figures.items() if label.startswith("zarr "))
    verdict = "meets" if min(zarr / raw, med_round) >= 0.8 else "does NOT meet"
    print(f"\nclosing note: zarr (uncompressed) saves at {zarr:.3f} GB/s against raw {raw:.3f} GB/s "
          f"= {zarr / raw:.2f}x (median of per-round ratios {med_round:.2f}x; rounds: "
          f"{', '.join(f'{x:.2f}' for x in round_ratio)}), which {verdict} the 0.8x target. "
          f"Compressed (realistic payload): {compressed}."
          + (f" torch-dcp (DCP's FileSystemWriter): {figures['torch-dcp']['save_GBps']:.3f} GB/s "
             f"save, {figures['torch-dcp']['restore_GBps']:.3f} GB/s restore."
             if "torch-dcp" in figures else ""))
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, "round_ratio": round_ratio}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
