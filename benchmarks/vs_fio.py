#!/usr/bin/env python3
"""ckptbench against fio on the same directory: same files, same bytes, same concurrency.

For each plan rank that ckptbench runs, fio gets one job section writing a file of
exactly that rank's bytes (one data file per rank, DCP style), all jobs at once, with
the same block size. Modes, each compared like with like:

* buffered: fio --direct=0 --ioengine=psync --end_fsync=1  vs  ckptbench --io buffered
* direct:   fio --direct=1 --ioengine=psync                vs  ckptbench --io direct
* both with fio's fallocate=none: by default fio preallocates its files before its clock
  starts, work a checkpointer does inside its own (blocks are allocated as it writes)
* reads of what each wrote, after evicting the page cache (fio invalidate=1 plus
  drop_caches when permitted; ckptbench's own cache rules). Like fio, each rank reads
  its whole file in --bs blocks (`--restore-plan files`); `--restore-plan dcp` times
  ckptbench's default restore instead, DCP's per-chunk reads (many smaller reads, which
  fio's sequential job does not make: a different workload, not the same one faster or
  slower).

Like fio, whose buffers are filled before it starts, ckptbench is given a --prefill large
enough to generate each rank's payload before its clock starts; the bytes are still
unique per block, file and iteration, and every byte is verified on restore.

The machine is left as it is unless asked. On a VM with free page reporting (memory the
guest frees goes back to the host, and the tool that holds more memory or starts later
after a cache drop pays for faulting it back in: machine_state.py says why),
`--page-reporting pause` (root) turns reporting off for the run, backs the memory the
run needs once and restores the setting at the end. Before each tool's save the page
cache is dropped, the machine is left --settle seconds, and --warm-memory is touched by
a process that exits at once (the remedy, per turn, that needs no root).

Runs alternate in ABBA order (fio, ckptbench, ckptbench, fio, ...) so drift and the
other tool's file deletions hit both. Two ratios are printed: ckptbench's median over
fio's median ("ratio"), and the median of the ratios of each run pair ("pairs", which
holds better when the machine's speed drifts between pairs). fio bandwidth is total bytes / slowest job's time
(group_reporting), which is ckptbench's aggregate definition too.

    python benchmarks/vs_fio.py --dir /mnt/nvme/bench --repeat 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.machine_state import (  # noqa: E402
    add_reporting_option,
    drop_caches,
    memory_for_run,
    pairs_ratio,
    parse_warm,
    prepare_turn,
    turns,
    warm_size,
)
from ckptbench.errors import CkptbenchError, SpecError  # noqa: E402
from ckptbench.fields import parse_ranks  # noqa: E402
from ckptbench.measure import build_request, measure  # noqa: E402
from ckptbench.plan import build_plan  # noqa: E402
from ckptbench.spec import load_workload, scaled  # noqa: E402
from ckptbench.units import parse_size  # noqa: E402
from harness import FioJob, find_binary, run_fio  # noqa: E402


def run_ckptbench(workload: Path, directory: Path, scale: int, ranks: str, bs: int,
                  direct: bool, prefill: int, restore_plan: str) -> tuple[float, float]:
    """ckptbench's save and restore throughput in bytes/s, run in process through the
    library, as `ckptbench run` would."""
    results = directory / "ckptbench.jsonl"
    results.unlink(missing_ok=True)
    req = build_request(workload, str(directory / "ckptbench"), scale=scale, ranks=ranks,
                        block_size=bs, prefill_bytes=prefill, restore_plan=restore_plan,
                        backend_options={"io": "direct" if direct else "buffered"})
    outcome = measure(req, results)
    summaries = {s["phase"]: s["throughput_bytes_per_s"] for s in (outcome or {}).get("summary", [])}
    return summaries["save"], summaries["restore"]


Row = tuple[str, str, float, float, float, list[float], list[float]]


def compare(args: argparse.Namespace, base: Path, sizes: list[int], prefill: int,
            warm: int) -> list[Row]:
    """Each mode's ABBA turns: (mode, phase, fio median, ckptbench median, ratio, runs)."""
    rows: list[Row] = []
    for mode in args.modes.split(","):
        direct = mode == "direct"
        fio_w, fio_r, ck_w, ck_r = [], [], [], []
        for i, tool in turns(args.repeat, "fio"):
            prepare_turn(warm, args.settle)
            if tool == "fio":
                fdir = base / "fio"
                fdir.mkdir(exist_ok=True)
                job = FioJob(fdir, sizes, args.bs, direct)
                fio_w.append(run_fio(job, "write"))
                drop_caches()
                fio_r.append(run_fio(job, "read"))
                shutil.rmtree(fdir)
                w, r = fio_w[-1], fio_r[-1]
            else:
                w, r = run_ckptbench(args.workload, base, args.scale, args.ranks, args.bs,
                                     direct, prefill, args.restore_plan)
                ck_w.append(w)
                ck_r.append(r)
            print(f"{mode} run {i + 1}: {tool} save {w / 1e9:.3f} restore {r / 1e9:.3f} GB/s",
                  file=sys.stderr, flush=True)
        for phase, f, c in (("save", fio_w, ck_w), ("restore", fio_r, ck_r)):
            fm, cm = statistics.median(f), statistics.median(c)
            rows.append((mode, phase, fm, cm, cm / fm, f, c))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="directory on the storage to test (default: a temp dir)")
    ap.add_argument("--workload", type=Path, default=ROOT / "workloads" / "llama3-8b-fsdp2-8.toml")
    ap.add_argument("--scale", type=int, default=4)
    ap.add_argument("--ranks", default="0-1")
    ap.add_argument("--bs", type=int, default=8 << 20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default="buffered,direct")
    ap.add_argument("--restore-plan", choices=("files", "dcp"), default="files",
                    help="ckptbench's restore: whole files in --bs blocks as fio reads them "
                         "(files), or DCP's per-chunk reads, ckptbench run's default (dcp)")
    ap.add_argument("--prefill", default="rank",
                    help="ckptbench --prefill: 'rank' (each rank's bytes: no payload generated "
                    "on the clock) or a size such as 64MiB (ckptbench's default)")
    ap.add_argument("--settle", type=float, default=8.0,
                    help="seconds to wait after dropping caches before each save (see above)")
    ap.add_argument("--warm-memory", default="auto",
                    help="memory to touch (then free) before each save, after the settle; 'auto' "
                    "is twice the bytes saved plus 1 GiB, at most half the available memory; 0: none")
    add_reporting_option(ap)
    args = ap.parse_args()
    try:
        prefill_size = None if args.prefill == "rank" else parse_size(args.prefill, "--prefill")
        warm = parse_warm(args.warm_memory)
    except SpecError as exc:
        ap.error(str(exc))
    if not find_binary("fio"):
        print("fio is not installed (apt-get install fio)", file=sys.stderr)
        return 2
    plan = build_plan(scaled(load_workload(args.workload), args.scale))
    ranks = parse_ranks(args.ranks, plan.world_size)
    sizes = plan.rank_bytes()[ranks].tolist()
    if min(sizes) < args.bs:
        ap.error(f"--scale {args.scale}: a rank has {min(sizes)} bytes, less than --bs {args.bs}; "
                 "fio writes whole blocks only")
    prefill = prefill_size or max(sizes) + args.bs  # 'rank': all of a rank's payload
    if warm is None:
        warm = warm_size(sum(sizes))
    base = args.dir or Path(tempfile.mkdtemp(prefix="vs_fio-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"workload {args.workload.name} --scale {args.scale} --ranks {args.ranks}: "
          f"{len(sizes)} files/jobs, {sum(sizes) / 2**30:.3f} GiB, bs {args.bs >> 20} MiB, dir {base}")
    fio_bytes = FioJob(base, sizes, args.bs, direct=False).moved_bytes()  # whole blocks only
    print(f"fio moves {fio_bytes} bytes ({fio_bytes / sum(sizes):.2%} of ckptbench's {sum(sizes)}: "
          f"whole blocks only); rates are compared")
    print(f"settle {args.settle:g} s, warm-up {warm / 2**30:.2f} GiB before each save")
    with memory_for_run(args, sum(sizes)) as memory_state:
        print(memory_state)
        try:
            rows = compare(args, base, sizes, prefill, warm)
        except CkptbenchError as exc:  # a tool or the run failed: one line, no traceback
            raise SystemExit(f"vs_fio: {exc}") from None
    print(f"{'mode':9s} {'phase':8s} {'fio GB/s':>9s} {'ckpt GB/s':>10s} {'ratio':>6s} "
          f"{'pairs':>6s}   runs (fio | ckptbench)")
    for mode, phase, fm, cm, ratio, f, c in rows:
        pairs = pairs_ratio(f, c)
        runs = " ".join(f"{x / 1e9:.2f}" for x in f) + " | " + " ".join(f"{x / 1e9:.2f}" for x in c)
        print(f"{mode:9s} {phase:8s} {fm / 1e9:9.3f} {cm / 1e9:10.3f} {ratio:6.2f} {pairs:6.2f}   {runs}")
    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
