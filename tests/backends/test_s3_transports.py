"""The S3 backend's other data paths (``--s3-transport crt`` and ``obstore``) against a
real MinIO: the conformance suite, faults from the proxy in front of the real server
(retried, or one line when retries run out), aborted uploads, fork safety, no secrets in
errors or records; and the default sizing rules (docs/s3.md, "Defaults")."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import os
import subprocess
import sys
import uuid
from typing import Any, ClassVar

import pytest

from ckptbench.backends.options import IOHints
from ckptbench.backends.s3 import S3Backend, S3Options
from ckptbench.backends.s3.sizing import Sizing
from ckptbench.errors import BackendError
from ckptbench.testing.conformance import MIB, read_at, write_object
from harness import FaultProxy, MinioServer

from .test_s3 import S3Conformance, s3

pytestmark = pytest.mark.s3
PACKAGES = {"crt": "awscrt", "obstore": "obstore"}


def _needs(transport: str) -> pytest.MarkDecorator:
    """Skip a transport whose package is not installed, saying which and how to get it."""
    package = PACKAGES[transport]
    return pytest.mark.skipif(
        importlib.util.find_spec(package) is None,
        reason=f"--s3-transport {transport} needs the {package} package (pip install "
               "'ckptbench[s3-transports]'; the test extra has it)")


TRANSPORTS = [pytest.param(t, marks=_needs(t)) for t in PACKAGES]


class TestS3DefaultsReadAhead(S3Conformance):
    """botocore with the chosen defaults: ranged GETs kept in flight ahead of the reader."""

    options: ClassVar[dict[str, Any]] = {"concurrency": None, "part_size": None}


@_needs("crt")
class TestS3Crt(S3Conformance):
    options: ClassVar[dict[str, Any]] = {"transport": "crt"}


@_needs("obstore")
class TestS3Obstore(S3Conformance):
    options: ClassVar[dict[str, Any]] = {"transport": "obstore"}


@_needs("crt")
class TestS3CrtChecksums(S3Conformance):
    """CRC32 trailers on uploads, responses validated where MinIO sends a checksum."""

    options: ClassVar[dict[str, Any]] = {"transport": "crt", "checksum": "when_supported"}


@_needs("obstore")
class TestS3ObstoreChecksums(S3Conformance):
    """object_store's request checksum (SHA-256) on uploads."""

    options: ClassVar[dict[str, Any]] = {"transport": "obstore", "checksum": "when_supported"}


def _data(method: str, path: str) -> bool:
    return method in ("PUT", "GET") and "/ck/" in path


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("faults", [["503", "503"], ["500"], ["reset", "reset"]],
                         ids=["throttle", "server", "reset"])
def test_transient_faults_are_retried(s3env: MinioServer, transport: str,
                                      faults: list[str]) -> None:
    with FaultProxy(s3env.endpoint, faults, _data) as proxy:
        b = s3(f"s3://{s3env.bucket}/tr/{uuid.uuid4().hex[:8]}", proxy.endpoint,
               transport=transport)
        b.prepare()
        data = os.urandom(12 * MIB + 5)
        write_object(b, "ck/x", data, block=4 * MIB)
        assert read_at(b, "ck/x", 0, len(data)) == data
        assert len(proxy.injected) == len(faults)
        assert b.describe()["transfer"] == {**b.describe()["transfer"], "transport": transport,
                                            "retries_counted": False}
        b.remove_tree("ck")
        b.release()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_body_cut_mid_read_is_retried(s3env: MinioServer, transport: str) -> None:
    b0 = s3(f"s3://{s3env.bucket}/cut/{uuid.uuid4().hex[:8]}", s3env.endpoint)
    b0.prepare()
    data = os.urandom(3 * MIB)
    write_object(b0, "ck/x", data)
    with FaultProxy(s3env.endpoint, ["truncate"], lambda m, p: m == "GET" and "/ck/" in p) as proxy:
        b = s3(b0.target, proxy.endpoint, transport=transport)
        assert read_at(b, "ck/x", 0, len(data)) == data
        assert proxy.injected and proxy.injected[0][0] == "truncate"
    b0.remove_tree("ck")
    b0.release()


@pytest.mark.parametrize("transport", ["botocore", *TRANSPORTS])
@pytest.mark.parametrize("fault", ["503", "reset"], ids=["throttle", "reset"])
def test_a_restore_out_of_attempts_names_the_options(s3env: MinioServer, transport: str,
                                                     fault: str) -> None:
    """A restore whose GETs fail on every attempt (SlowDown, a reset connection: an
    endpoint giving up under the load) ends with one line naming the options that size
    the load, as botocore's does, whichever engine retried (issue 29)."""
    b0 = s3(f"s3://{s3env.bucket}/give-up/{uuid.uuid4().hex[:8]}", s3env.endpoint)
    b0.prepare()
    data = os.urandom(3 * MIB)
    write_object(b0, "ck/x", data)
    with FaultProxy(s3env.endpoint, [fault] * 200,
                    lambda m, p: m == "GET" and "/ck/" in p) as proxy:
        b = s3(b0.target, proxy.endpoint, max_attempts=2, transport=transport)
        with pytest.raises(BackendError) as err:
            read_at(b, "ck/x", 0, len(data))
    msg = str(err.value)
    assert "\n" not in msg and s3env.secret_key not in msg, msg
    assert "--s3-concurrency (now" in msg and "--s3-max-attempts (now 2)" in msg, msg
    b0.remove_tree("ck")
    b0.release()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_retries_exhausted_is_one_line_and_leaves_no_upload(s3env: MinioServer,
                                                            transport: str) -> None:
    with FaultProxy(s3env.endpoint, ["503"] * 50,
                    lambda m, p: m == "PUT" and "partNumber=" in p) as proxy:
        b = s3(f"s3://{s3env.bucket}/slow/{uuid.uuid4().hex[:8]}", proxy.endpoint,
               max_attempts=2, transport=transport)
        b.prepare()
        with pytest.raises(BackendError) as err:
            h = b.open_write("ck/x", 12 * MIB)
            try:
                h.write(memoryview(os.urandom(12 * MIB)))
                h.sync()
            except BackendError:
                h.abort()
                raise
        msg = str(err.value)
        assert "\n" not in msg and b.target in msg, msg
        assert s3env.secret_key not in msg and s3env.access_key not in msg
        assert 2 <= len(proxy.injected) <= 6, proxy.injected  # 2 attempts per part in flight
        ups = s3env.client().list_multipart_uploads(Bucket=b.bucket, Prefix=b._key("ck/"))
        assert not ups.get("Uploads")
        b.remove_tree("ck")
        b.release()


@pytest.mark.parametrize("transport", ["botocore", *TRANSPORTS])
def test_abort_aborts_the_multipart_upload(s3env: MinioServer, transport: str) -> None:
    b = s3(f"s3://{s3env.bucket}/ab/{uuid.uuid4().hex[:8]}", s3env.endpoint, transport=transport)
    b.prepare()
    h = b.open_write("ck/x", 20 * MIB)
    h.write(memoryview(os.urandom(11 * MIB)))
    h.abort()
    ups = s3env.client().list_multipart_uploads(Bucket=b.bucket, Prefix=b._key("ck/"))
    assert not ups.get("Uploads")
    assert not b.exists("ck/x")
    b.release()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_wrong_secret_key_is_one_line_without_secrets(s3env: MinioServer, transport: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    b = s3(f"s3://{s3env.bucket}/wk/{uuid.uuid4().hex[:8]}", s3env.endpoint, transport=transport)
    b.prepare()
    wrong = "wrong" + s3env.secret_key[5:]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    other = s3(b.target, s3env.endpoint, transport=transport)
    with pytest.raises(BackendError) as err:
        write_object(other, "ck/x", os.urandom(6 * MIB))
    msg = str(err.value)
    assert "SignatureDoesNotMatch" in msg and "\n" not in msg, msg
    assert wrong[5:] not in msg and s3env.access_key not in msg
    assert wrong[5:] not in json.dumps(other.describe())
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3env.secret_key)
    b.remove_tree("ck")
    b.release()


def _child_round_trip(b: S3Backend, key: str, q: Any) -> None:
    try:
        data = key.encode() * 100_000
        write_object(b, key, data)
        q.put(("ok", read_at(b, key, 0, len(data)) == data))
    except BaseException as exc:
        q.put(("error", str(exc)))


def _fork_round_trips(b: S3Backend, n: int) -> list[tuple[str, Any]]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child_round_trip, args=(b, f"ck/child-{i}", q)) for i in range(n)]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    return results


_FORKED_RANKS = """
import sys
from ckptbench.backends.s3 import S3Backend, S3Options
from tests.backends.test_s3_transports import _fork_round_trips
b = S3Backend(sys.argv[2], S3Options(endpoint_url=sys.argv[1], transport=sys.argv[3]))
b.prepare()
print(_fork_round_trips(b, 2))
b.remove_tree("ck")
b.release()
"""


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ranks_forked_after_prepare_each_make_their_transport(s3env: MinioServer,
                                                              transport: str) -> None:
    """As the runner does, in a fresh process: prepare, fork the ranks, move data in each."""
    target = f"s3://{s3env.bucket}/fork/{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", _FORKED_RANKS, s3env.endpoint, target, transport],
                         capture_output=True, text=True, timeout=120, env=env, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "[('ok', True), ('ok', True)]", out


@_needs("crt")
def test_crt_survives_a_fork_after_use(s3env: MinioServer) -> None:
    b = s3(f"s3://{s3env.bucket}/fork/{uuid.uuid4().hex[:8]}", s3env.endpoint, transport="crt")
    b.prepare()
    write_object(b, "ck/parent", b"p" * 1000)  # the parent's CRT client exists before the fork
    assert _fork_round_trips(b, 2) == [("ok", True), ("ok", True)]
    assert read_at(b, "ck/parent", 0, 1000) == b"p" * 1000
    b.remove_tree("ck")
    b.release()


@_needs("obstore")
def test_obstore_after_a_fork_after_use_is_one_line(s3env: MinioServer) -> None:
    """obstore's runtime does not survive a fork: a clear refusal, not a hang."""
    b = s3(f"s3://{s3env.bucket}/fork/{uuid.uuid4().hex[:8]}", s3env.endpoint,
           transport="obstore")
    b.prepare()
    write_object(b, "ck/parent", b"p" * 1000)
    (status, msg), = _fork_round_trips(b, 1)
    assert status == "error" and "forked after obstore was used" in msg and "\n" not in msg
    b.remove_tree("ck")
    b.release()


def test_missing_package_is_one_line(monkeypatch: pytest.MonkeyPatch, s3env: MinioServer) -> None:
    import ckptbench.backends.s3.transport as t

    monkeypatch.setitem(t.MODULES, "crt", ("ckptbench.backends.s3.crt", "no_such_pkg_ckpt"))
    b = s3(f"s3://{s3env.bucket}/np/{uuid.uuid4().hex[:8]}", s3env.endpoint, transport="crt")
    with pytest.raises(BackendError, match="--s3-transport crt needs the no_such_pkg_ckpt"):
        b.open_write("ck/x", 1)


def test_transport_is_an_option_and_bad_values_are_one_line() -> None:
    o = S3Options.from_flags({"--s3-transport": "obstore"}, "s3", "s3://b/x")
    assert o.transport == "obstore"
    with pytest.raises(BackendError, match="--s3-transport 'curl' is not allowed; allowed: "
                                           "botocore, crt, obstore"):
        S3Options(transport="curl")


# --- defaults: chosen from the object size, the threads and the ranks per host ---
def test_default_sizing_rules() -> None:
    one = Sizing(None, None, threads=1, ranks_per_host=1, cpus=64)
    assert one.in_flight == 16
    assert Sizing(None, None, threads=1, ranks_per_host=8, cpus=64).in_flight == 4
    assert Sizing(None, None, threads=4, ranks_per_host=2, cpus=64).in_flight == 4
    assert Sizing(None, None, threads=1, ranks_per_host=64, cpus=64).in_flight == 4  # >= 4 a rank
    assert Sizing(None, None, threads=1, ranks_per_host=2, cpus=2).in_flight == 4  # >= 4 a rank
    assert Sizing(None, None, threads=1, ranks_per_host=1, cpus=2).in_flight == 4  # 2 per CPU
    assert Sizing(None, None, threads=1, ranks_per_host=1, cpus=6).in_flight == 12
    assert one.part_for(3 * MIB) == 5 * MIB  # small objects: one PUT
    assert one.part_for(64 * MIB) == 64 * MIB  # up to 64 MiB: one PUT
    assert one.part_for(700 * MIB) == 44 * MIB  # the whole object in flight in 16 parts
    assert one.part_for(100 * MIB) == 16 * MIB  # parts of at least 16 MiB
    assert one.part_for(10 << 30) == 64 * MIB  # and at most 64 MiB ...
    assert one.part_for(1 << 40) == 105 * MIB  # ... unless 10,000 parts need more
    given = Sizing(8 * MIB, 3)
    assert (given.in_flight, given.part_for(700 * MIB), given.part_for(1 * MIB)) == (3, 8 * MIB,
                                                                                        8 * MIB)


def test_defaults_follow_ranks_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    for var in ("MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE", "PMI_LOCAL_SIZE"):
        monkeypatch.delenv(var, raising=False)
    b = S3Backend("s3://bucket/x", S3Options(), IOHints(threads=1, ranks_per_host=8))
    assert b.concurrency == 4 and b.describe()["ranks_per_host"] == 8
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")  # the MPI launcher's word wins
    b = S3Backend("s3://bucket/x", S3Options(), IOHints(threads=1, ranks_per_host=16))
    assert b.sizing.ranks_per_host == 2 and b.describe()["concurrency_chosen"] is True


@_needs("crt")
def test_botocore_path_signs_with_botocore_even_with_awscrt(s3env: MinioServer,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore signs through the CRT when awscrt is installed; the botocore transport
    keeps botocore's own SigV4 (the CRT's read each signed body through Python)."""
    import botocore.auth

    signed: list[str] = []
    plain = botocore.auth.S3SigV4Auth.add_auth

    def spy(self: Any, request: Any) -> None:
        signed.append(type(self).__module__)
        plain(self, request)

    monkeypatch.setattr(botocore.auth.S3SigV4Auth, "add_auth", spy)
    b = s3(f"s3://{s3env.bucket}/sig/{uuid.uuid4().hex[:8]}", s3env.endpoint)
    b.prepare()
    write_object(b, "ck/x", b"signed" * 1000)
    assert read_at(b, "ck/x", 0, 6000) == b"signed" * 1000
    assert signed and set(signed) == {"botocore.auth"}, signed
    b.remove_tree("ck")
    b.release()
