"""ckptbench.redact: the one rule that keeps credentials out of records and descriptions."""

from __future__ import annotations

import json
from collections import namedtuple
from typing import Any

import pytest

from ckptbench.backends.base import Backend
from ckptbench.records import SCHEMA, JsonlSink, read_records
from ckptbench.redact import REDACTED, is_secret_name, public_url, redact


@pytest.mark.parametrize("name", [
    "aws_secret_access_key", "aws_access_key_id", "secret_key", "secret", "password", "passwd",
    "token", "session_token", "sas_token", "key", "account_key", "api_key", "clientSecret",
    "AWSSecretKey", "x-amz-security-token", "credentials", "private_key",
])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "auth", "chunk_key", "state_keys", "stream_key", "keys", "monkey", "endpoint", "part_size",
    "anon", "checksum", "sessions_total", "bucket", "prefix",
])
def test_names_that_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)


def test_nested_values_lists_and_named_tuples() -> None:
    Login = namedtuple("Login", "login password")  # aiohttp's BasicAuth is one of these
    given = {"aws_secret_access_key": "x", "nested": [{"password": "p", "ok": 1}],
             "storage_options": {"key": "AKIA", "secret": "s", "anon": True,
                                 "auth": Login("me", "pw")}}
    assert redact(given) == {
        "aws_secret_access_key": REDACTED, "nested": [{"password": REDACTED, "ok": 1}],
        "storage_options": {"key": REDACTED, "secret": REDACTED, "anon": True,
                            "auth": {"login": "me", "password": REDACTED}}}


@pytest.mark.parametrize(("text", "public"), [
    ("http://user:pw@127.0.0.1:9000", "http://127.0.0.1:9000"),
    ("https://a:b@host:1/p?q#f", "https://host:1/p"),
    ("https://acct.blob.core.windows.net/c/x?sv=1&sig=SECRET", "https://acct.blob.core.windows.net/c/x"),
    ("s3://bucket/prefix", "s3://bucket/prefix"),  # nothing to hide: kept as it is
    ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
    ("s3://b/x: connection lost? retry", "s3://b/x: connection lost? retry"),  # a sentence
    ("no url here", "no url here"),
])
def test_urls(text: str, public: str) -> None:
    assert redact(text) == public


def test_public_url_drops_user_query_and_fragment() -> None:
    assert public_url("https://a:b@host:1/p?q") == "https://host:1/p"


class _Talkative(Backend):
    """A backend whose details would leak, but for describe() going through redact."""

    name = "talkative"

    def details(self) -> dict[str, Any]:
        return {"endpoint": "http://me:hunter2@127.0.0.1:1", "session_token": "hunter2",
                "auth": "env"}

    def prepare(self) -> None: ...
    def release(self) -> None: ...
    def open_write(self, key: str, size: int) -> Any: raise AssertionError
    def open_read(self, key: str) -> Any: raise AssertionError
    def put_atomic(self, key: str, data: bytes) -> None: raise AssertionError
    def get(self, key: str) -> bytes: raise AssertionError
    def exists(self, key: str) -> bool: return False
    def delete(self, keys: Any) -> None: ...
    def list_names(self, prefix: str, limit: int) -> list[str]: return []


def test_describe_and_records_go_through_redact(tmp_path: Any) -> None:
    d = _Talkative("talk://x").describe()
    assert "hunter2" not in json.dumps(d)
    assert d["endpoint"] == "http://127.0.0.1:1" and d["auth"] == "env"
    writer = JsonlSink(tmp_path / "r.jsonl")
    writer.open()
    writer.write({"type": "run", "schema": SCHEMA,
                  "raw": {"endpoint": "http://me:hunter2@h:1", "token": "t0k"}})
    writer.close()
    assert "hunter2" not in (tmp_path / "r.jsonl").read_text()
    assert next(read_records(tmp_path / "r.jsonl"))["raw"] == {"endpoint": "http://h:1",
                                                               "token": REDACTED}
