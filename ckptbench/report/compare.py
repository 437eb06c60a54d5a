"""What sets runs apart: each run's options as short facets, and the facets that differ.

Compared runs are told apart by what differs between them (io mode, format, ranks, scale,
payload, ...), never by a workload name they share; what they have in common is said
once. The facets come from the run record (``options``, the backend's options under
``environment.target``, the plan and the host), so results files written before a facet
existed still compare.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckptbench.units import format_size

# Facet order in tables and labels: what people vary most often first.
ORDER = ("workload", "mode", "backend", "io", "format", "codec", "ranks", "scale", "payload", "threads",
         "intra-op", "block", "prefill", "cache", "shift", "seed", "launcher", "fs", "device", "host")


def facets(run: dict[str, Any]) -> dict[str, str]:
    """A run record's options as short strings, in :data:`ORDER` (backend options after)."""
    opts = run.get("options", {})
    env = run.get("environment", {})
    target = env.get("target", {})
    backend_opts = dict(target.get("options") or {})
    plan = run.get("plan", {})
    shift = run.get("restore_shift", {})
    raw: dict[str, Any] = {
        "workload": run.get("workload", {}).get("name"),
        "mode": "async" if opts.get("mode") == "async" else None,  # sync: said by its absence
        "backend": target.get("backend"),
        "io": backend_opts.pop("io", None),
        "format": opts.get("format", "raw"),
        "codec": str(opts.get("codec", "none")).replace(",", ", "),  # wraps at the commas
        "ranks": f"{len(run['ranks'])}/{plan.get('world_size', '?')}" if "ranks" in run else None,
        "scale": run.get("scale"),
        "payload": opts.get("payload"),
        "threads": opts.get("threads"),
        "intra-op": opts.get("intra_op_threads") or None,  # runner.threads (0: not resolved)
        "block": format_size(opts["block_size"]) if "block_size" in opts else None,
        "prefill": format_size(opts["prefill_bytes"]) if "prefill_bytes" in opts else None,
        "cache": opts.get("cache"),
        "shift": shift.get("value") if isinstance(shift, dict) else shift,
        "seed": opts.get("seed"),
        "launcher": run.get("launcher"),
        "fs": target.get("fs_type"),
        "device": target.get("device"),
        "host": env.get("host"),
    }
    out = {k: str(v) for k, v in raw.items() if v is not None}
    out.update({k.replace("_", "-"): _short(v) for k, v in sorted(backend_opts.items())
                if v is not None})
    return out


def _short(value: Any) -> str:
    return format_size(value) if isinstance(value, int) and value >= 1 << 20 else str(value)


# Facets that belong to the storage backend: compared only between runs on the same
# backend (an S3 run has no io mode, a local run no endpoint; that is no difference).
TARGET_FACETS = ("io", "fs", "device")
NAMES = {"s3": "S3", "local": "local", "fsspec": "fsspec", "memory": "memory", "null": "null"}
# How a facet's value reads in a label ({} the value; the value alone where it says what
# it is).
PHRASES = {"ranks": "ranks {}", "scale": "scale 1/{}", "payload": "{} payload",
           "threads": "{} threads", "intra-op": "{} intra-op threads", "block": "{} blocks", "prefill": "prefill {}",
           "cache": "cache {}", "shift": "restore shift {}", "seed": "seed {}",
           "launcher": "{} launcher", "device": "device {}", "host": "host {}"}
SPECIAL = {("io", "direct"): "O_DIRECT", ("codec", "none"): "no codec",
           ("threads", "1"): "1 thread", ("intra-op", "1"): "1 intra-op thread"}


def backend_name(f: dict[str, str]) -> str:
    """'local', 'S3 (botocore)': the backend, and for S3 its transport."""
    name = NAMES.get(f.get("backend", ""), f.get("backend", "unknown backend"))
    return f"{name} ({f['transport']})" if f.get("backend") == "s3" and "transport" in f else name


def _scoped(key: str) -> bool:
    """A facet of the backend (its options, the file system): compared per backend."""
    return key in TARGET_FACETS or key not in ORDER


def differing(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The facets whose values are not the same in every run (one run: none); a backend's
    own facets only where runs on that backend differ in them."""
    all_facets = [facets(r) for r in runs]
    keys = list(dict.fromkeys(k for f in all_facets for k in f))
    if "mode" in keys:
        keys.remove("mode")  # sync runs have none: said after the options it goes with
        keys.append("mode")
    out = []
    for k in keys:
        if _scoped(k):
            groups: dict[str, set[str | None]] = {}
            for f in all_facets:
                groups.setdefault(f.get("backend", "?"), set()).add(f.get(k))
            if any(len(values) > 1 for values in groups.values()):
                out.append(k)
        elif len({f.get(k) for f in all_facets}) > 1:
            out.append(k)
    return out


def value(f: dict[str, str], key: str) -> str:
    """A facet's value for a table cell, in words where the run has none."""
    if key == "backend":
        return backend_name(f)
    if key in f:
        return f[key]
    if key == "mode":
        return "sync"
    if _scoped(key) and "backend" in f:
        return f"none on {backend_name(f)}"
    return "not recorded"


def phrase(f: dict[str, str], key: str) -> str:
    """A facet as a label says it: 'O_DIRECT', '4 threads', 'S3 (botocore)', 'sync'."""
    if key not in f or key == "backend":
        text = value(f, key)
        return text if key in ("backend", "mode") else f"{key} {text}"
    if (key, f[key]) in SPECIAL:
        return SPECIAL[(key, f[key])]
    if key in ORDER:
        return PHRASES.get(key, "codec {}" if key == "codec" else "{}").format(f[key])
    return f"{key} {f[key]}"  # a backend option: its flag's name


def common(runs: Sequence[dict[str, Any]]) -> dict[str, str]:
    """The facets every run shares (said once, above a comparison)."""
    if not runs:
        return {}
    all_facets = [facets(r) for r in runs]
    return {k: v for k, v in all_facets[0].items() if all(f.get(k) == v for f in all_facets[1:])}


def labels(runs: Sequence[dict[str, Any]]) -> list[str]:
    """One short label per run: its differing facets in plain words ('S3 (botocore), sync',
    'O_DIRECT, zarr'); the workload name for one run; '#n' appended where labels would
    still collide."""
    keys = differing(runs)
    out = []
    for r in runs:
        f = facets(r)
        shown = [k for k in keys if not (k == "transport" and "backend" in keys)]
        out.append(", ".join(phrase(f, k) for k in shown) if shown else f.get("workload", "?"))
    if len(set(out)) < len(out):
        out = [f"#{i} {label}" for i, label in enumerate(out, 1)]
    return out


def describe(values: dict[str, str]) -> str:
    """'io=buffered, format=raw, ...' for a caption."""
    return ", ".join(f"{k}={v}" for k, v in values.items())
