"""The quick subset, `pytest -m quick`: a few minutes on 2 cores, every backend and every
CLI command still touched once against the real thing (files, MinIO per S3 transport,
GlusterFS, the CLI as a subprocess). The full suite (`pytest`, CI) runs everything.

The subset is named here, not in the test files: whole modules of fast tests (pure
functions, in-process CLI calls), and single tests, each with what it touches. The check
(:func:`uncovered`) runs when the subset is collected and is itself a test: a backend
registered in ckptbench.backends, an S3 transport or a CLI command that no quick test
touches fails it, and so does a name here that no longer matches a test.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The session's whole collection ((node id, fixture names)), kept by conftest for the test.
COLLECTED = pytest.StashKey[list[tuple[str, tuple[str, ...]]]]()

# Whole modules: each test in them takes well under a second.
MODULES: tuple[str, ...] = (
    "tests/test_layers.py",
    "tests/test_units.py",
    "tests/test_cadence.py",
    "tests/test_cli_cadence.py",
    "tests/test_redact.py",
    "tests/test_report.py",
    "tests/test_quick_subset.py",
    "tests/plan/test_order.py",
    "tests/plan/test_models.py",
    "tests/plan/test_tier_plan.py",
    "tests/formats/test_codecs.py",
    "tests/backends/test_options.py",
    "tests/backends/test_owned_dirs.py",
)

RUN_ROUND_TRIP = "test_runner_round_trip_verified"  # conformance: the runner, save+restore

# Single tests (a node id, or the start of one: all its parametrizations) -> what each
# touches: "backend:<scheme>" (a key of ckptbench.backends.BACKENDS, '*' for fsspec),
# "s3:<transport>", "gluster", "cli:<command>".
TESTS: dict[str, tuple[str, ...]] = {
    f"tests/backends/test_local.py::TestLocalBuffered::{RUN_ROUND_TRIP}": ("backend:file",),
    f"tests/backends/test_local.py::TestLocalDirect::{RUN_ROUND_TRIP}": ("backend:file",),
    "tests/backends/test_memory.py::TestMemory": ("backend:memory",),
    "tests/backends/test_null.py::test_run_tiny_saves_on_null": ("backend:null",),
    f"tests/backends/test_fsspec.py::TestFsspecMemory::{RUN_ROUND_TRIP}": ("backend:*",),
    f"tests/backends/test_s3.py::TestS3::{RUN_ROUND_TRIP}": ("backend:s3", "s3:botocore"),
    f"tests/backends/test_s3_transports.py::TestS3Crt::{RUN_ROUND_TRIP}": ("s3:crt",),
    f"tests/backends/test_s3_transports.py::TestS3Obstore::{RUN_ROUND_TRIP}": ("s3:obstore",),
    "tests/formats/test_formats_s3.py::test_torch_dcp_through_s3torchconnector_on_minio":
        ("s3:s3torchconnector",),  # skipped without torch and s3torchconnector
    f"tests/backends/test_gluster.py::TestGlusterBuffered::{RUN_ROUND_TRIP}": ("gluster",),
    "tests/test_s3_run.py::test_run_tiny_on_minio": ("cli:run",),
    "tests/plan/test_plan.py::test_cli_plan_prints_summary_and_json": ("cli:plan",),
    "tests/runner/test_run_local.py::test_round_trip_tiny": ("cli:run",),
    "tests/test_throughput.py::test_run_report_and_cadence_print_the_same_throughput":
        ("cli:run", "cli:report", "cli:cadence"),
    "tests/test_throughput.py::test_sweep_prints_the_throughput_run_and_cadence_print":
        ("cli:sweep",),
    "tests/adversarial/test_clean.py::test_clean_lists_then_removes_kept_debris_and_empty_by_name":
        ("cli:clean", "cli:run"),
    "tests/adversarial/test_clean.py::test_restore_leaves_nothing_behind": ("cli:restore",),
    "tests/test_cli_levels.py::test_text_names_each_level_and_the_schedule": ("cli:levels",),
    "tests/test_cli_levels.py::test_simulate_text_and_a_bound": ("cli:simulate",),
    "tests/runner/test_tier_relaunch.py::test_a_lost_memory_copy_is_served_by_its_peer":
        ("cli:relaunch",),
    "tests/test_mlperf.py::test_mlperf_command_reports_both_ways": ("cli:mlperf",),
    "tests/backends/test_options.py::test_backends_command_lists_every_backend":
        ("cli:backends",),
}

# What a test that claims to touch these must use (a cross-check of the claims above).
FIXTURES = {"gluster": "gluster", "backend:s3": "minio_server"}


def is_quick(nodeid: str) -> bool:
    path = nodeid.split("::", 1)[0]
    return path in MODULES or any(nodeid.startswith(t) for t in TESTS)


def required() -> set[str]:
    """Everything the quick subset must touch, from ckptbench's own registries."""
    from ckptbench.backends import BACKENDS
    from ckptbench.backends.s3.options import TRANSPORTS
    from ckptbench.cli import _register, cli

    _register()
    return ({f"backend:{s}" for s in BACKENDS} | {f"s3:{t}" for t in TRANSPORTS} | {"gluster"}
            | {f"cli:{c}" for c in cli.commands})


def uncovered(collected: Sequence[tuple[str, Iterable[str]]],
              tests: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """What the quick subset misses, from the collected tests ((node id, fixture names)):
    each thing required() that no quick test touches, each entry of `tests` that matches no
    test, and each claim that a test's fixtures do not back. Empty: the subset is whole."""
    tests = TESTS if tests is None else tests
    touched: set[str] = set()
    problems: list[str] = []
    for prefix, claims in tests.items():
        matched = [(n, set(f)) for n, f in collected if n.startswith(prefix)]
        if not matched:
            problems.append(f"{prefix}: no such test (renamed or removed?)")
            continue
        for claim in claims:
            fixture = FIXTURES.get(claim)
            if fixture and not any(fixture in f for _, f in matched):
                problems.append(f"{prefix}: claims {claim} but does not use {fixture}")
            touched.add(claim)
    problems += [f"nothing in the quick subset touches {r}" for r in sorted(required() - touched)]
    return problems
