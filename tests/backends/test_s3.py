"""The S3 backend against a real MinIO: the conformance suite, multipart and ranged reads,
checksums, retries (through a fault-injecting proxy), errors, fork safety, no secrets."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import time
import uuid
from typing import Any, ClassVar

import pytest

from ckptbench.backends import open_backend
from ckptbench.backends.s3 import S3Backend, S3Options, parse_target, public_endpoint
from ckptbench.errors import BackendError
from ckptbench.testing.conformance import MIB, BackendConformance, read_at, write_object
from harness import FaultProxy, MinioServer, free_port

pytestmark = pytest.mark.s3


@pytest.fixture
def s3env(minio_server: MinioServer, monkeypatch: pytest.MonkeyPatch) -> MinioServer:
    """boto3's standard chain (environment variables) reaches the session's MinIO."""
    for k, v in minio_server.env({}).items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    return minio_server


def s3(target: str, endpoint: str, **options: Any) -> S3Backend:
    return S3Backend(target, S3Options(**{"endpoint_url": endpoint, "part_size": 5 * MIB,
                                          "concurrency": 3, **options}))


class S3Conformance(BackendConformance):
    options: ClassVar[dict[str, Any]] = {}

    @pytest.fixture
    def target(self, s3env: MinioServer) -> str:
        self.server = s3env
        self.secrets = (s3env.access_key, s3env.secret_key)
        return f"s3://{s3env.bucket}/conf/{uuid.uuid4().hex[:10]}"

    def open(self, target: str) -> S3Backend:
        return s3(target, self.server.endpoint, **self.options)

    def put_foreign(self, target: str, name: str, data: bytes) -> None:
        bucket, prefix = parse_target(target)
        self.server.client().put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)

    def listing(self, target: str) -> list[str]:
        bucket, prefix = parse_target(target)
        return sorted(k[len(prefix) + 1:] for k in self.server.list_keys(bucket, prefix + "/"))


class TestS3(S3Conformance):
    pass


class TestS3Checksums(S3Conformance):
    """CRC32 on every request and validated responses (when_supported)."""

    options: ClassVar[dict[str, Any]] = {"checksum": "when_supported", "concurrency": 2}


# --- multipart, ranges, records ---
def test_multipart_parts_and_parallel_ranges(s3env: MinioServer) -> None:
    b = s3(f"s3://{s3env.bucket}/mp/{uuid.uuid4().hex[:8]}", s3env.endpoint, concurrency=4)
    b.prepare()
    data = os.urandom(23 * MIB + 5)
    b.stats()
    write_object(b, "ck/x.bin", data, block=8 * MIB)
    st = b.stats()
    # create + 5 parts + complete = 7 requests, none retried
    assert st["requests"] == 7 and st["retries"] == 0
    head = s3env.client().head_object(Bucket=b.bucket, Key=b._key("ck/x.bin"), PartNumber=1)
    assert head["PartsCount"] == 5
    assert read_at(b, "ck/x.bin", 0, len(data)) == data
    assert b.stats()["requests"] == 4  # one 23 MiB buffer: 4 parallel ranged GETs
    b.remove_tree("ck")
    b.release()


@pytest.mark.parametrize("fault", [None, "503"])
def test_one_part_in_flight_is_sent_by_the_calling_thread(s3env: MinioServer,
                                                          fault: str | None) -> None:
    """--s3-concurrency 1: write() uploads each part itself (no pool thread), in place,
    retried whole; every request carries ckptbench's User-Agent."""
    faults = [fault] if fault else []
    with FaultProxy(s3env.endpoint, faults, lambda m, p: m == "PUT" and "partNumber=2" in p) as proxy:
        b = s3(f"s3://{s3env.bucket}/one/{uuid.uuid4().hex[:8]}", proxy.endpoint, concurrency=1)
        b.prepare()
        b.stats()
        data = os.urandom(16 * MIB + 7)
        w = b.open_write("ck/x", len(data))
        w.write(memoryview(data))  # one block holding all four parts
        assert w.pool is None and all(f.done() for f in w.pending)
        w.sync()
        w.close()
        st = b.stats()
        assert st["requests"] == 1 + 4 + 1 and st["retries"] == len(faults), st
        assert [i[0] for i in proxy.injected] == faults
        assert read_at(b, "ck/x", 0, len(data)) == data
        assert proxy.user_agents and all(ua.startswith("ckptbench/0.") and "botocore/" in ua
                                         for ua in proxy.user_agents), set(proxy.user_agents)
        b.remove_tree("ck")
        b.release()


def test_one_part_in_flight_fails_in_one_line(s3env: MinioServer) -> None:
    with FaultProxy(s3env.endpoint, ["500"] * 5,
                    lambda m, p: m == "PUT" and "partNumber=" in p) as proxy:
        b = s3(f"s3://{s3env.bucket}/onefail/{uuid.uuid4().hex[:8]}", proxy.endpoint,
               concurrency=1, max_attempts=2)
        b.prepare()
        w = b.open_write("ck/x", 12 * MIB)
        with pytest.raises(BackendError) as err:
            w.write(memoryview(bytes(12 * MIB)))
            w.sync()
        assert "server error 500" in str(err.value) and "upload part 1" in str(err.value)
        w.abort()
        assert len(proxy.injected) == 2
        b.remove_tree("ck")
        b.release()


def test_part_size_grows_past_ten_thousand_parts() -> None:
    b = S3Backend("s3://bucket/p", S3Options(part_size=8 * MIB))
    assert b.part_size_for(10 * MIB) == 8 * MIB
    assert b.part_size_for(200 << 30) >= (200 << 30) / 10_000


def test_when_supported_stores_crc32(s3env: MinioServer) -> None:
    b = s3(f"s3://{s3env.bucket}/crc/{uuid.uuid4().hex[:8]}", s3env.endpoint,
           checksum="when_supported")
    b.prepare()
    write_object(b, "multi", os.urandom(11 * MIB))
    write_object(b, "single", os.urandom(1000))
    c = s3env.client()
    for key in ("multi", "single"):
        head = c.head_object(Bucket=b.bucket, Key=b._key(key), ChecksumMode="ENABLED")
        assert any(k.startswith("ChecksumCRC32") for k in head), head.keys()
    assert b.describe()["checksum"] == {"request": "when_supported", "response": "when_supported"}
    b.remove_tree("multi")
    b.remove_tree("single")
    b.release()


def test_remove_tree_aborts_leftover_uploads(s3env: MinioServer) -> None:
    b = s3(f"s3://{s3env.bucket}/left/{uuid.uuid4().hex[:8]}", s3env.endpoint)
    b.prepare()
    c = s3env.client()
    c.create_multipart_upload(Bucket=b.bucket, Key=b._key("run/ck/x"))
    b.remove_tree("run")
    assert not c.list_multipart_uploads(Bucket=b.bucket, Prefix=b._key("run/")).get("Uploads")
    b.release()
    assert s3env.list_keys(b.bucket, b.prefix + "/") == []


def _child_writes(b: S3Backend, key: str, q: Any) -> None:
    try:
        write_object(b, key, b"from the child" * 1000)
        q.put(("ok", b.stats()["requests"]))
    except BaseException as exc:
        q.put(("error", repr(exc)))


def test_fork_after_prepare_uses_a_client_per_process(s3env: MinioServer) -> None:
    b = s3(f"s3://{s3env.bucket}/fork/{uuid.uuid4().hex[:8]}", s3env.endpoint)
    b.prepare()
    parent_client = b._client()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child_writes, args=(b, f"ck/child-{i}", q)) for i in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(r[0] == "ok" and r[1] == 1 for r in results), results
    assert b._client() is parent_client  # the parent's own client, untouched
    for i in range(2):
        assert b.get(f"ck/child-{i}") == b"from the child" * 1000
    b.remove_tree("ck")
    b.release()


# --- retries: real faults in front of the real server ---
def _data_requests(method: str, path: str) -> bool:
    return method in ("PUT", "GET") and "/ck/" in path


@pytest.mark.parametrize("faults, reason", [
    (["503", "503"], "retries_throttle"),
    (["500"], "retries_server"),
    (["reset", "reset"], "retries_connection"),
])
def test_transient_errors_are_retried_and_counted(s3env: MinioServer, faults: list[str],
                                                  reason: str) -> None:
    with FaultProxy(s3env.endpoint, faults, _data_requests) as proxy:
        b = s3(f"s3://{s3env.bucket}/retry/{uuid.uuid4().hex[:8]}", proxy.endpoint)
        b.prepare()
        b.stats()
        data = os.urandom(12 * MIB)
        write_object(b, "ck/x", data)
        assert read_at(b, "ck/x", 0, len(data)) == data
        st = b.stats()
        assert len(proxy.injected) == len(faults)
        assert st["retries"] == len(faults) and st[reason] == len(faults), st
        b.remove_tree("ck")
        b.release()


@pytest.mark.parametrize("size", [20 * MIB + 3, 5 * MIB], ids=["multipart", "single"])
@pytest.mark.parametrize("fault", ["503", "reset"])
def test_bodies_sent_in_place_are_resent_whole(s3env: MinioServer, size: int, fault: str) -> None:
    """Parts and objects sent straight from the caller's buffer (no copy) are rewound and
    sent again whole on a retry, and the caller's buffer is free when write() returns."""
    with FaultProxy(s3env.endpoint, [fault], lambda m, p: m == "PUT" and "/ck/" in p) as proxy:
        b = s3(f"s3://{s3env.bucket}/inplace/{uuid.uuid4().hex[:8]}", proxy.endpoint,
               concurrency=2)
        assert b.zero_copy
        b.prepare()
        b.stats()
        data = os.urandom(size)
        write_object(b, "ck/x", data, block=24 * MIB)  # one write() holds every part
        assert proxy.injected and proxy.injected[0][0] == fault
        assert b.stats()["retries"] == 1
        assert read_at(b, "ck/x", 0, size) == data
        b.remove_tree("ck")
        b.release()


def test_a_body_cut_mid_read_is_retried(s3env: MinioServer) -> None:
    b0 = s3(f"s3://{s3env.bucket}/cut/{uuid.uuid4().hex[:8]}", s3env.endpoint)
    b0.prepare()
    data = os.urandom(3 * MIB)
    write_object(b0, "ck/x", data)
    with FaultProxy(s3env.endpoint, ["truncate"], lambda m, p: m == "GET" and "/ck/" in p) as proxy:
        b = s3(b0.target, proxy.endpoint)
        b.stats()
        assert read_at(b, "ck/x", 0, len(data)) == data
        assert proxy.injected and proxy.injected[0][0] == "truncate"
        st = b.stats()
        assert st["retries_connection"] == 1, st
    b0.remove_tree("ck")
    b0.release()


def test_retries_exhausted_is_one_line(s3env: MinioServer) -> None:
    with FaultProxy(s3env.endpoint, ["503"] * 10, _data_requests) as proxy:
        b = s3(f"s3://{s3env.bucket}/slow/{uuid.uuid4().hex[:8]}", proxy.endpoint, max_attempts=2)
        b.prepare()
        with pytest.raises(BackendError) as err:
            write_object(b, "ck/x", b"abc")
        msg = str(err.value)
        assert "throttling" in msg and "SlowDown" in msg and "\n" not in msg
        assert b.stats()["retries_throttle"] == 1, proxy.injected
        b.remove_tree("ck")
        b.release()


# --- bad input: one line, no secrets ---
def test_wrong_secret_key(s3env: MinioServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong" + s3env.secret_key[5:])
    b = s3(f"s3://{s3env.bucket}/x", s3env.endpoint)
    with pytest.raises(BackendError) as err:
        b.prepare()
    msg = str(err.value)
    assert "wrong credentials" in msg and "SignatureDoesNotMatch" in msg and "allowed" in msg
    assert s3env.secret_key[5:] not in msg and s3env.access_key not in msg


def test_unknown_access_key(s3env: MinioServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody" + uuid.uuid4().hex[:8])
    with pytest.raises(BackendError, match=r"wrong credentials .InvalidAccessKeyId"):
        s3(f"s3://{s3env.bucket}/x", s3env.endpoint).prepare()


def test_no_credentials(s3env: MinioServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(BackendError, match="no usable credentials"):
        s3(f"s3://{s3env.bucket}/x", s3env.endpoint).prepare()


def test_missing_bucket(s3env: MinioServer) -> None:
    with pytest.raises(BackendError, match="bucket 'no-such-bucket-ckpt' does not exist"):
        s3("s3://no-such-bucket-ckpt/x", s3env.endpoint).prepare()


def test_unreachable_endpoint_fails_fast(s3env: MinioServer) -> None:
    t0 = time.monotonic()
    with pytest.raises(BackendError, match=re.escape("cannot reach the endpoint http://127.0.0.1:")):
        s3(f"s3://{s3env.bucket}/x", f"http://127.0.0.1:{free_port()}").prepare()
    assert time.monotonic() - t0 < 10


def test_endpoint_from_boto3_configuration(s3env: MinioServer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3env.endpoint)
    b = S3Backend(f"s3://{s3env.bucket}/envcfg/{uuid.uuid4().hex[:6]}")
    b.prepare()
    assert b.describe()["endpoint"] == s3env.endpoint
    assert b.describe()["addressing_style"] == "path"
    b.release()


@pytest.mark.parametrize("target, options, match", [
    ("s3://", {}, "not a bucket name"),
    ("s3://Bad_Bucket/x", {}, "not a bucket name"),
    ("s3://bucket/../x", {}, "not allowed in the prefix"),
    ("s3://bucket/x", {"part_size": MIB}, "5 MiB to 5 GiB"),
    ("s3://bucket/x", {"checksum": "md5"}, "allowed: when_required, when_supported"),
    ("s3://bucket/x", {"endpoint_url": "127.0.0.1:9000"}, "http:// or https://"),
    ("s3://bucket/x", {"colour": "blue"}, "unknown option 'colour'"),
])
def test_bad_options_are_one_line(target: str, options: dict[str, Any], match: str) -> None:
    with pytest.raises(BackendError, match=match):
        open_backend(target, options)


def test_describe_never_holds_credentials(s3env: MinioServer) -> None:
    b = S3Backend(f"s3://{s3env.bucket}/d", S3Options(
        endpoint_url=f"http://user:{s3env.secret_key}@127.0.0.1:{s3env.port}"))
    text = json.dumps(b.describe())
    assert s3env.secret_key not in text and s3env.access_key not in text
    assert b.describe()["endpoint"] == s3env.endpoint
    assert b.describe()["auth"] == "env"
    assert public_endpoint("https://a:b@host:1/p?q") == "https://host:1/p"


def test_open_backend_routes_s3() -> None:
    assert isinstance(open_backend("s3://bucket/p", {}), S3Backend)


def test_restore_gets_back_off_when_every_attempt_loses_its_connection(
        s3env: MinioServer) -> None:
    """A GET whose every botocore attempt lost its connection (an endpoint overloaded) is
    sent again after a longer backoff with the process's window halved, as a save's part
    is; past those rounds the failure names the options that size the load."""
    b0 = s3(f"s3://{s3env.bucket}/getback/{uuid.uuid4().hex[:8]}", s3env.endpoint)
    b0.prepare()
    data = os.urandom(3 * MIB)
    write_object(b0, "ck/x", data)
    gets = lambda m, p: m == "GET" and "/ck/" in p  # noqa: E731
    with FaultProxy(s3env.endpoint, ["reset"] * 3, gets) as proxy:
        b = s3(b0.target, proxy.endpoint, max_attempts=2)
        assert read_at(b, "ck/x", 0, len(data)) == data
        assert len(proxy.injected) == 3
        assert b.stats()["retries_connection"] >= 2
    with FaultProxy(s3env.endpoint, ["reset"] * 20, gets) as proxy:
        b = s3(b0.target, proxy.endpoint, max_attempts=2)
        with pytest.raises(BackendError) as err:
            read_at(b, "ck/x", 0, len(data))
        msg = str(err.value)
        assert "lost (ConnectionClosedError) on every attempt" in msg, msg
        assert "--s3-concurrency (now 3)" in msg and "--s3-max-attempts (now 2)" in msg, msg
        assert len(proxy.injected) == 2 * 3  # botocore's 2 attempts, in 1 + 2 rounds
    b0.remove_tree("ck")
    b0.release()


def test_retries_after_lost_connections_wait_for_the_narrowed_window(
        s3env: MinioServer) -> None:
    """Parts whose connections were lost are retried by botocore inside the call: each retry
    takes a place in the window the losses halved, so the endpoint that was overloaded gets
    fewer parts at once, not all of them again (an 8-rank save on a loaded MinIO kept every
    part in flight through its retries, and none arrived within the server's 30 s)."""
    parts = lambda m, p: m == "PUT" and "partNumber=" in p  # noqa: E731
    with FaultProxy(s3env.endpoint, ["reset"] * 8, parts, hold_s=2.5) as proxy:
        b = s3(f"s3://{s3env.bucket}/narrow/{uuid.uuid4().hex[:8]}", proxy.endpoint,
               concurrency=8)
        b.prepare()
        data = os.urandom(8 * 5 * MIB)
        write_object(b, "ck/x", data, block=len(data))  # one block: 8 parts at once
        assert len(proxy.injected) == 8 and b.stats()["retries_connection"] >= 8
        # 8 losses halve the window to 1 place, and parts stored grow it again (by one
        # place per window stored): without the wait, all 8 parts were sent again at once
        assert proxy.peak <= 3, proxy.peak
        assert read_at(b, "ck/x", 0, len(data)) == data
        b.remove_tree("ck")
        b.release()


def test_a_server_that_stops_reading_a_body_for_a_while_does_not_abort_the_part(
        s3env: MinioServer) -> None:
    """urllib3 bounds sending a request by botocore's connect timeout (urllib3 #857): a
    server short of CPU that stops reading a part's body for longer than that (here 3 s,
    against a connect timeout of 1 s) must not abort the part: the body has the read
    timeout. Before, the part was cut and sent again from its first byte."""
    parts = lambda m, p: m == "PUT" and "partNumber=" in p  # noqa: E731
    with FaultProxy(s3env.endpoint, ["pause"], parts) as proxy:
        b = s3(f"s3://{s3env.bucket}/pause/{uuid.uuid4().hex[:8]}", proxy.endpoint,
               connect_timeout=1.0, part_size=32 * MIB, concurrency=1)
        b.prepare()
        b.stats()
        data = os.urandom(40 * MIB)
        write_object(b, "ck/x", data, block=len(data))
        assert [i[0] for i in proxy.injected] == ["pause"]
        assert b.stats()["retries"] == 0
        assert read_at(b, "ck/x", 0, len(data)) == data
        b.remove_tree("ck")
        b.release()


def test_a_part_sent_slowly_but_steadily_is_not_aborted(s3env: MinioServer) -> None:
    """A part assembled in a part buffer goes out 1 MiB per send, each with the send
    timeout: a link slower than the part's size over that timeout (here 32 MiB at 4 MiB/s,
    against timeouts of 5 s) is not a reason to abort it. Before, the part was one send
    bounded as a whole, and was cut and sent again."""
    parts = lambda m, p: m == "PUT" and "partNumber=" in p  # noqa: E731
    with FaultProxy(s3env.endpoint, ["slow"], parts) as proxy:  # part 1
        b = s3(f"s3://{s3env.bucket}/slow/{uuid.uuid4().hex[:8]}", proxy.endpoint,
               connect_timeout=1.0, read_timeout=5.0, part_size=32 * MIB, concurrency=1)
        b.prepare()
        b.stats()
        data = os.urandom(40 * MIB)
        write_object(b, "ck/x", data)  # blocks of 1 MiB, copied into the part's buffer
        assert [i[0] for i in proxy.injected] == ["slow"]
        assert b.stats()["retries"] == 0
        assert read_at(b, "ck/x", 0, len(data)) == data
        b.remove_tree("ck")
        b.release()
