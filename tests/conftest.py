"""Shared fixtures: real files, real processes, a real MinIO server, a real GlusterFS."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "workloads"

# The commands a test starts print no progress (how many lines a run prints depends on the
# machine's load, and many tests assert what stderr says); tests/test_progress.py turns it
# on where it is under test.
os.environ.setdefault("CKPTBENCH_PROGRESS", "off")


def _still_ignored(signum: int, frame: object) -> None:
    """Ignores the signal in this process; unlike SIG_IGN, a handler is not inherited
    through exec."""


# The signal tests send SIGINT and SIGHUP to the commands they start and expect them to
# stop. A suite started in the background of a script (SIGINT ignored) or under nohup
# (SIGHUP ignored) would pass that SIG_IGN to every command it starts, and ckptbench keeps
# an ignored signal ignored (test_nohup_still_ignores_sighup starts its own nohup). So the
# commands start with the default dispositions, and this process still ignores them.
for _sig in (signal.SIGINT, signal.SIGHUP):
    if signal.getsignal(_sig) is signal.SIG_IGN:
        signal.signal(_sig, _still_ignored)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While inside: SIGTERM (a CI timeout) is an interrupt, so session fixtures tear
    down the services they started instead of pytest ending without teardown."""
    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def tiny_workload() -> Path:
    return WORKLOADS / "tiny.toml"


# --- MinIO: one real server for the whole session (S3 tests never skip in CI) ---
@pytest.fixture(scope="session")
def minio_server():
    """A real MinIO on 127.0.0.1 (free port, temporary data directory), live before the
    first S3 test and stopped after the last. No binary fails loudly unless
    CKPTBENCH_SKIP_S3=1; .ci/setup builds it from source (pinned)."""
    import os

    from harness import MinioServer, find_binary

    if not find_binary("minio"):
        if os.environ.get("CKPTBENCH_SKIP_S3") == "1":
            pytest.skip("no minio binary and CKPTBENCH_SKIP_S3=1")
        pytest.fail("no `minio` binary on PATH or in $(go env GOPATH)/bin: run .ci/setup "
                    "(go install github.com/minio/minio@<pinned>) or set CKPTBENCH_SKIP_S3=1",
                    pytrace=False)
    server = MinioServer().start()
    server.bucket = server.make_bucket("ckptbench-test")
    try:
        yield server
    finally:
        server.stop()


# --- GlusterFS: one real server with two volumes for the whole session ---
@pytest.fixture(scope="session")
def gluster():
    """A real GlusterFS (harness.gluster.GlusterBed): glusterd on a 127.0.1.N
    address, volume `ckb` over two bricks mounted twice (`plain`, `other`: two clients),
    volume `ckbshard` with the shard translator (4MB) mounted once (`shard`); everything
    it started is ended after the last test. Skipped only where FUSE is unavailable (no
    /dev/fuse, or not root); missing Gluster packages fail (.ci/setup installs them)."""
    from harness import ToolError
    from harness.gluster import GlusterBed, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    # A CI timeout's SIGTERM would end pytest without teardown, and glusterd's daemonized
    # bricks and the mounts would stay: as an interrupt, the session tears down first.
    with sigterm_interrupts():
        try:
            bed = GlusterBed.start()
        except ToolError as exc:
            pytest.fail(f"GlusterFS: {exc}", pytrace=False)
        try:
            yield bed
        finally:
            bed.stop()


@pytest.fixture
def gluster_dir(gluster, request):
    """A new directory on the plain volume (first client), removed after the test."""
    import shutil
    import uuid

    path = gluster.plain.path / f"{request.node.name[:40]}-{uuid.uuid4().hex[:6]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --- Slurm: one cluster of emulated nodes for the whole session ---
@pytest.fixture(scope="session")
def slurm():
    """A real Slurm cluster (harness.slurm.SlurmCluster): munged, slurmctld and
    two slurmd daemons (nodes n1, n2 on 127.0.0.1, 8 CPUs each: the sbatch templates
    run side by side) in a directory of its own;
    everything it started is ended after the last test. Skipped only where the daemons
    cannot run (not Linux, not root); missing packages fail (.ci/setup installs them)."""
    from harness import ToolError
    from harness.slurm import SlurmCluster, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    # As for Gluster: a CI timeout's SIGTERM tears the cluster down first (slurmstepd and
    # its tasks are detached from the daemons and would stay).
    with sigterm_interrupts():
        try:
            cluster = SlurmCluster(nodes=2, cpus=8).start()
        except ToolError as exc:
            pytest.fail(f"Slurm: {exc}", pytrace=False)
        try:
            yield cluster
        finally:
            cluster.stop()


# --- the quick subset (`pytest -m quick`, tests/quick.py) ---
def _whole_suite(config: pytest.Config) -> bool:
    """The session collects every test (no file or directory narrowed it down)."""
    given = {Path(a.split("::")[0]).resolve() for a in config.args}
    return given <= {ROOT, ROOT / "tests"}


# --- parallel runs (`pytest -n 2 --dist loadgroup`, pytest-xdist) ---
ONE_START_SERVICES = ("gluster", "slurm")


def _service_group(fixtures: tuple[str, ...] | list[str]) -> str | None:
    """The group whose tests share one worker: a GlusterFS server (bricks, volumes,
    mounts: about 17 s to start) and a Slurm cluster (munged, slurmctld, two slurmd) are
    started once per session, by the one worker that runs every test using them. MinIO
    starts in a second: each worker has its own, on a free port."""
    return next((name for name in ONE_START_SERVICES if name in fixtures), None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the quick subset (before -m selects); with the whole suite collected, keep
    what the subset check needs, and refuse `-m quick` when the subset misses a backend
    or a command (tests/quick.py)."""
    from tests import quick

    collected = [(item.nodeid, tuple(getattr(item, "fixturenames", ()))) for item in items]
    for item in items:
        if quick.is_quick(item.nodeid):
            item.add_marker(pytest.mark.quick)
        group = _service_group(getattr(item, "fixturenames", ()))
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    if not _whole_suite(config):
        return
    config.stash[quick.COLLECTED] = collected
    if "quick" in (config.getoption("markexpr") or ""):
        problems = quick.uncovered(collected)
        if problems:
            raise pytest.UsageError("the quick subset (tests/quick.py): " + "; ".join(problems))
