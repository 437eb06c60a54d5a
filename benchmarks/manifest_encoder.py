"""The coordinator's own part of a save, at a workload's full chunk count: what process 0
spends building and encoding the manifest (runner.driver's commit) against the data time
of the same run, without storage (the put is a no-op).

    PYTHONPATH=. python benchmarks/manifest_encoder.py WORKLOAD [--ranks 8] [--all-ranks]

Two cases, printed as JSON:

* a subset of ranks (what ``ckptbench run --ranks 0-7`` does): the manifest holds the
  subset's files, padded to DCP's ``.metadata`` size of the whole plan;
* ``--all-ranks``: every rank's files, as a run of the whole job would commit: each
  process encodes its files' entries (timed per rank: they run in parallel, so the
  slowest rank's is what the save waits for) and the coordinator joins them.

The padding is made before the clock (``ManifestWriter.prepare``), as a run does.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ckptbench.formats.manifest import (
    ManifestWriter,
    encode_members,
    manifest_bytes,
    manifest_files,
)
from ckptbench.plan import Plan, build_plan
from ckptbench.spec import load_workload


class _Drop:
    """A backend whose put costs nothing: the coordinator's CPU alone is timed."""

    def put_atomic(self, key: str, data: Any) -> None:
        return None


def _digests(plan: Plan, ranks: range) -> dict[int, list[int]]:
    out = {}
    for r in ranks:
        for f in plan.files_of_rank(r):
            span = plan.chunks_of_file(f)
            n = int((plan.chunk_nbytes[span.start:span.stop] > 0).sum())
            out[f] = [0x0123456789ABCDEF] * n
    return out


def coordinator_s(plan: Plan, writer: ManifestWriter, ranks: range, pieces: bool
                  ) -> dict[str, float]:
    """Seconds: the ranks' encoding (the slowest rank's, when `pieces`) and the
    coordinator's build and encoding."""
    rank_s = 0.0
    files: list[bytes] | None = None
    digests = _digests(plan, ranks)
    if pieces:
        files = []
        for r in ranks:
            mine = {f: digests[f] for f in plan.files_of_rank(r)}
            t0 = time.perf_counter()
            files.append(encode_members(manifest_files(plan, "run/ckpt", mine)))
            rank_s = max(rank_s, time.perf_counter() - t0)
    t0 = time.perf_counter()
    manifest: dict[str, Any] = {"workload_spec": plan.workload.to_dict()}
    if files is None:
        manifest["files"] = manifest_files(plan, "run/ckpt", digests)
    times = writer.commit(_Drop(), "run/ckpt/.metadata", manifest, files)  # type: ignore[arg-type]
    return {"ranks_encode_s": rank_s, "coordinator_s": time.perf_counter() - t0,
            "encode_s": (times.encoded - times.start) / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--all-ranks", action="store_true")
    args = ap.parse_args()
    plan = build_plan(load_workload(args.workload))
    writer = ManifestWriter(manifest_bytes(plan, "raw"))
    t0 = time.perf_counter()
    writer.prepare()
    out: dict[str, Any] = {"workload": plan.workload.name, "chunks": plan.n_chunks,
                           "manifest_bytes": writer.size,
                           "prepare_s (off the clock)": time.perf_counter() - t0,
                           f"subset of {args.ranks} ranks": coordinator_s(
                               plan, writer, range(args.ranks), pieces=False)}
    if args.all_ranks:
        out["all ranks"] = coordinator_s(plan, writer, range(plan.world_size), pieces=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
