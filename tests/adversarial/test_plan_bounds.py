"""Plan size is bounded before any planning work: a typo in world_size or layers is one
line naming the field, the estimated memory and what this machine has, within seconds,
not minutes of planning; every shipped workload, the 16,384- and 131,072-rank 405B plans
and the 2,072-file 1T MoE plan still plan (issue 16, item 5; issue 28, item 3).

This suite (tests/adversarial) keeps the abuse cases of issue 16 so that later features
inherit them: a new layout must keep its plans bounded the same way.
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ckptbench.errors import SpecError
from ckptbench.plan import build_plan
from ckptbench.spec import load_workload, with_restore

from .helpers import WORKLOADS, assert_refused, ckptbench


def _toml(tables: dict[str, dict[str, Any]]) -> str:
    lines = []
    for section, values in tables.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in values.items()]
    return "\n".join(lines) + "\n"


def _tiny(**changes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    tables = tomllib.loads((WORKLOADS / "tiny.toml").read_text())
    for section, values in changes.items():
        tables.setdefault(section, {}).update(values)
    return tables


@pytest.mark.parametrize(("section", "values", "needles"), [
    ("parallel", {"world_size": 10_000_000, "tp": 1}, ["[parallel] world_size = 10000000", "1,048,576"]),
    ("model", {"layers": 1_000_000}, ["[model] layers = 1000000", "4,096"]),
    ("checkpoint", {"threads": 100_000}, ["[checkpoint] threads = 100000", "1,024"]),
], ids=["world_size", "layers", "threads"])
def test_huge_fields_are_refused_at_once(tmp_path: Path, section: str, values: dict[str, Any],
                                         needles: list[str]) -> None:
    path = tmp_path / "w.toml"
    path.write_text(_toml(_tiny(**{section: values})))
    started = time.monotonic()
    result = ckptbench("plan", str(path), timeout=60, memory_limit=4 << 30)
    assert_refused(result, *needles, "allowed")
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("parallel", [
    {"world_size": 1_048_576, "tp": 1},               # at the field limit: the product is too big
    {"world_size": 262_144, "tp": 8, "pp": 1},
], ids=["tiny-model-1M-ranks", "tiny-model-256k-ranks"])
def test_plans_too_large_overall_are_refused_naming_the_fields(tmp_path: Path,
                                                               parallel: dict[str, Any]) -> None:
    """Estimates of 190 GB and 770 GB: more than any machine this runs on has."""
    path = tmp_path / "w.toml"
    layers = 64 if parallel["world_size"] > 262_144 else 1024
    path.write_text(_toml(_tiny(parallel=parallel, model={"layers": layers, "heads": 8,
                                                          "kv_heads": 8})))
    started = time.monotonic()
    result = ckptbench("plan", str(path), timeout=60, memory_limit=4 << 30)
    assert_refused(result, "plan too large", "[parallel] world_size", "[model] layers",
                   "estimated", "this machine has available")
    assert time.monotonic() - started < 30


def test_the_bound_is_memory_against_what_is_available() -> None:
    """The same plan (405B on 131,072 ranks, 28 million items, about 2 GiB) is refused where
    1 GiB is available and accepted where 64 GiB are, before any planning work."""
    from ckptbench.plan.bounds import check_plan_size, check_restore_size, plan_bytes

    w = load_workload(WORKLOADS / "llama3.1-405b-tp8-pp16-fsdp-131072.toml")
    assert 1 << 30 < plan_bytes(w) < 3 << 30
    with pytest.raises(SpecError, match=r"plan too large: about 28,075,121 items, an estimated "
                                        r"\S+ to plan, from \[parallel\] world_size = 131,072"):
        check_plan_size(w, available=1 << 30)
    check_plan_size(w, available=64 << 30)
    restore = with_restore(w, {"world_size": 130_944}, "--restore-world-size")
    with pytest.raises(SpecError, match=r"restore plan too large: .* world_size = 130,944"):
        check_restore_size(restore, available=1 << 30)
    check_restore_size(restore, available=64 << 30)


def test_megatron_plan_too_large_is_refused(tmp_path: Path) -> None:
    tables = tomllib.loads((WORKLOADS / "mlperf-llama3-1t.toml").read_text())
    tables["parallel"].update(world_size=1_048_576, pp=1, zero_stage=3)
    path = tmp_path / "w.toml"
    path.write_text(_toml(tables))
    result = ckptbench("plan", str(path), timeout=60, memory_limit=4 << 30)
    assert_refused(result, "plan too large", "world_size = 1,048,576")


def _workloads() -> list[Any]:
    """Every shipped workload; the 131,072-rank plan (6 s of CPU) is marked slow."""
    return [pytest.param(p, marks=pytest.mark.slow) if "131072" in p.stem else p
            for p in sorted(WORKLOADS.glob("*.toml"))]


@pytest.mark.parametrize("path", _workloads(), ids=lambda p: p.stem)
def test_every_shipped_workload_still_plans(path: Path) -> None:
    plan = build_plan(load_workload(path))
    assert plan.n_chunks > 0
    if path.stem == "mlperf-llama3-1t":
        assert plan.n_files == 2072
    if path.stem == "llama3.1-405b-tp8-pp16-fsdp-16384":
        assert plan.world_size == 16_384
    if path.stem == "llama3.1-405b-tp8-pp16-fsdp-131072":
        assert (plan.world_size, plan.n_files, plan.n_chunks) == (131_072, 131_072, 16_643_487)
        assert plan.total_bytes == 4_870_240_670_148  # the same bytes as on 16,384 ranks
