"""Plan size is bounded before any planning work: a typo in world_size or layers is one
line naming the field and the limit within seconds, not minutes of planning; every
shipped workload, the 16,384-rank 405B plan and the 2,072-file 1T MoE plan still plan
(issue 16, item 5).

This suite (tests/adversarial) keeps the abuse cases of issue 16 so that later features
inherit them: a new layout must keep its plans bounded the same way.
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ckptbench.plan import build_plan
from ckptbench.spec import load_workload, parse_workload

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
    path = tmp_path / "w.toml"
    path.write_text(_toml(_tiny(parallel=parallel, model={"layers": 64, "heads": 8, "kv_heads": 8})))
    started = time.monotonic()
    result = ckptbench("plan", str(path), timeout=60, memory_limit=4 << 30)
    assert_refused(result, "plan too large", "[parallel] world_size", "[model] layers",
                   "at most 16,000,000 items")
    assert time.monotonic() - started < 30


def test_megatron_plan_too_large_is_refused(tmp_path: Path) -> None:
    tables = tomllib.loads((WORKLOADS / "mlperf-llama3-1t.toml").read_text())
    tables["parallel"].update(world_size=1_048_576, pp=1, zero_stage=3)
    path = tmp_path / "w.toml"
    path.write_text(_toml(tables))
    result = ckptbench("plan", str(path), timeout=60, memory_limit=4 << 30)
    assert_refused(result, "plan too large", "world_size = 1,048,576")


@pytest.mark.parametrize("path", sorted(WORKLOADS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_workload_still_plans(path: Path) -> None:
    plan = build_plan(load_workload(path))
    assert plan.n_chunks > 0
    if path.stem == "mlperf-llama3-1t":
        assert plan.n_files == 2072
    if path.stem == "llama3.1-405b-tp8-pp16-fsdp-16384":
        assert plan.world_size == 16_384


def test_405b_on_65536_ranks_is_within_the_bound() -> None:
    """Checked without planning it (25 s): the bound must not refuse a 4x Llama 3 cluster."""
    from ckptbench.plan.bounds import MAX_PLAN_ITEMS, plan_items

    tables = tomllib.loads((WORKLOADS / "llama3.1-405b-tp8-pp16-fsdp-16384.toml").read_text())
    tables["parallel"]["world_size"] = 65_536
    assert plan_items(parse_workload(tables)) <= MAX_PLAN_ITEMS
