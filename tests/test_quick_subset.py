"""The quick subset (`pytest -m quick`, tests/quick.py) touches every registered backend,
every S3 transport, GlusterFS and every CLI command, and each test it names exists."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import quick


def _collected(config: pytest.Config) -> list[tuple[str, tuple[str, ...]]]:
    """Every test of the suite with its fixtures: this session's collection when it was
    the whole suite, else a collection of the whole suite in a subprocess."""
    if quick.COLLECTED in config.stash:
        return config.stash[quick.COLLECTED]
    code = ("import sys, pytest\n"
            "class P:\n"
            "    def pytest_collection_finish(self, session):\n"
            "        for i in session.items:\n"
            "            print('@@', i.nodeid, ' '.join(getattr(i, 'fixturenames', ())))\n"
            "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider'], "
            "plugins=[P()]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=quick.ROOT, capture_output=True, text=True,
                         timeout=300, check=False).stdout
    return [(line.split()[1], tuple(line.split()[2:])) for line in out.splitlines()
            if line.startswith("@@ ")]


def test_the_quick_subset_touches_every_backend_and_command(
        pytestconfig: pytest.Config) -> None:
    collected = _collected(pytestconfig)
    assert len(collected) > 1000  # the whole suite
    assert quick.uncovered(collected) == []
    assert sum(quick.is_quick(n) for n, _ in collected) < len(collected) // 2


def test_the_check_names_what_the_subset_misses() -> None:
    """Without its Gluster test, with a test that is gone and with a claim its fixtures do
    not back, the check says so (it can fail)."""
    collected = [(f"{name}[x]", ("gluster", "minio_server")) for name in quick.TESTS]
    assert quick.uncovered(collected) == []
    tests = {k: v for k, v in quick.TESTS.items() if "gluster" not in v}
    assert quick.uncovered(collected, tests) == ["nothing in the quick subset touches gluster"]
    gone = {**quick.TESTS, "tests/test_nothing.py::test_gone": ("cli:run",)}
    assert quick.uncovered(collected, gone) == [
        "tests/test_nothing.py::test_gone: no such test (renamed or removed?)"]
    unbacked = [(n, ()) if "gluster" in n else (n, f) for n, f in collected]
    assert any("claims gluster but does not use gluster" in p
               for p in quick.uncovered(unbacked))
