"""The manifest's encoding (formats.manifest_encoding): the JSON line, its total size, padding that
is the same incompressible stream however often the buffer is reused, entries encoded
in pieces equal to one encoding, and the null backend keeping only a manifest's head."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from ckptbench.backends.null import KEPT, NullBackend
from ckptbench.formats.manifest import Manifest
from ckptbench.formats.manifest_encoding import (
    ManifestWriter,
    _body,
    encode_manifest,
    encode_members,
)


class Kept:
    """A backend that keeps the bytes of each put (a copy: the writer reuses its buffer)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def put_atomic(self, key: str, data: bytes | memoryview) -> None:
        self.data[key] = bytes(data)


@pytest.mark.parametrize("size", [0, 10, 1000, 4097])
def test_encode_manifest_sizes(size: int) -> None:
    m = {"schema": "x", "files": {"a": {"digests": [1, 2]}}}
    data = encode_manifest(m, size)
    got = Manifest.decode(data)
    assert got == {**m, "size": len(data)}
    assert len(data) == max(size, len(json.dumps({**m, "size": len(data)})) + 1)
    assert encode_manifest({**got, "size": 7}, len(data)) == data  # a parsed one re-encodes


def test_the_writer_reuses_its_padding_and_restores_it() -> None:
    """A long manifest, then a short one: the bytes after the short JSON are the padding
    again, as a fresh writer has them, and incompressible."""
    size = 1 << 16
    b = Kept()
    w = ManifestWriter(size)
    w.prepare()
    w.commit(b, "a", {"x": "y" * 20000})  # type: ignore[arg-type]
    short = {"x": 1}
    w.commit(b, "b", short)  # type: ignore[arg-type]
    fresh = Kept()
    w2 = ManifestWriter(size)
    w2.prepare()
    w2.commit(fresh, "b", short)  # type: ignore[arg-type]
    assert b.data["b"] == fresh.data["b"]
    assert len(b.data["b"]) == size and Manifest.decode(b.data["b"]) == {**short, "size": size}
    assert b.data["b"] == encode_manifest(short, size)
    tail = b.data["b"][len(json.dumps({**short, "size": size})) + 1:]
    assert b"y" * 8 not in tail  # not the longer JSON before
    assert len(zlib.compress(tail)) > 0.99 * len(tail)


def test_json_past_the_padding_is_whole() -> None:
    b = Kept()
    w = ManifestWriter(100)
    w.prepare()
    m = {"files": {f"f{i}": {"digests": [i]} for i in range(50)}}
    times = w.commit(b, "k", m)  # type: ignore[arg-type]
    assert Manifest.decode(b.data["k"]) == {**m, "size": len(b.data["k"])}
    assert times.start <= times.encoded <= times.renamed == times.end  # one request


def test_entries_in_pieces_equal_one_encoding() -> None:
    a = {"run/c/a": {"rank": 0, "digests": [1]}, "run/c/b": {"rank": 0, "digests": []}}
    c = {"run/c/c": {"rank": 1, "digests": [3, 4]}}
    head = {"schema": "s", "objects": {"o": 5}}
    pieces = _body(head, 0, [encode_members(a), b"", encode_members(c)])
    whole = _body({**head, "files": {**a, **c}}, 0)
    assert json.loads(pieces) == json.loads(whole)
    assert json.loads(_body({}, 0, [])) == {"files": {}, "size": len(_body({}, 0, [])) + 1}


def test_the_null_backend_keeps_a_manifests_head_only() -> None:
    b = NullBackend("null://t")
    data = np.arange(3 * KEPT, dtype=np.uint8).tobytes()
    b.put_atomic("r/c/.metadata", memoryview(data))
    assert b.exists("r/c/.metadata") and b.get("r/c/.metadata") == data[:KEPT]
