"""Corruption between save and restore (issue 16, item 3): what restore calls verified.

Each test runs the real CLI on a real local target; sabotage_run.py damages the committed
checkpoint's files after the save, before the restore. A damaged checkpoint must fail the
run (exit 1) with one line that names what is wrong, and the restore phase record must
say it was not verified.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .runs import TINY, one_line, records, sabotaged

NORM = "model.norm.weight/zarr.json"  # a float32 array of the tiny workload
INTACT = "its bytes are intact (identical to those written); the digest recorded in the manifest differs"


def run_damaged(tmp_path: Path, action: str, fmt: str) -> tuple[str, list[dict]]:
    results = tmp_path / "r.jsonl"
    r = sabotaged(action, str(TINY), "--target", str(tmp_path / "t"), "--format", fmt,
                  "--results", str(results), cwd=tmp_path)
    line = one_line(r, 1)
    restores = [p for p in records(results) if p["type"] == "phase" and p["phase"] == "restore"]
    assert [p["verified"] for p in restores] == [False]
    errors = [e for e in records(results) if e["type"] == "error"]
    assert errors and errors[0]["kind"] == "verification", errors
    return line, errors


@pytest.mark.parametrize("action, needle", [
    # an array's dtype: same item size, so every chunk's bytes still match their digests
    (f"set-field:{NORM}:data_type=\"int32\"", f"{NORM} differs from the one written"),
    # its codecs: a reader would decode the shard differently
    (f"set-field:{NORM}:codecs=[{{\"name\": \"bytes\"}}]", f"{NORM} differs from the one written"),
    ("write:zarr.json", "/zarr.json differs from the one written"),  # the group, garbled
    ("unlink:zarr.json", "/checkpoint-1/zarr.json is missing"),  # the group, deleted
])
def test_zarr_metadata_is_verified(tmp_path: Path, action: str, needle: str) -> None:
    line, _ = run_damaged(tmp_path, action, "zarr")
    assert "metadata object " in line and needle in line


def test_a_truncated_zarr_shard_is_a_named_verification_failure(tmp_path: Path) -> None:
    """A shard cut to half its size (a copy that stopped part way): the codec's checksum
    ValueError was the whole line; now the chunk and its shard are named."""
    shard = "model.layers.0.attention.wv.weight/c/1/0"
    line, _ = run_damaged(tmp_path, f"truncate:{shard}", "zarr")
    assert "chunk model.layers.0.attention.wv.weight at offsets" in line
    assert "zarr shard run-" in line and f"/checkpoint-1/{shard} cannot be decoded" in line
    assert "truncated or altered" in line and not line.startswith("ckptbench: error: ValueError")


@pytest.mark.parametrize("action, needle", [
    ("manifest-garbage", "not UTF-8 text"),
    ("manifest-list", "a JSON list, not an object with 'files'"),
    ("manifest-no-files", "no 'files' object"),
    ("manifest-no-digests", "/__0_0.distcp has no 'digests' list"),
    ("manifest-short-digests", "has 47 chunk digests where the plan has 48 chunks"),
])
def test_damaged_manifest_is_one_line_naming_it(tmp_path: Path, action: str, needle: str
                                                ) -> None:
    line, errors = run_damaged(tmp_path, action, "raw")
    assert "manifest run-" in line and "/checkpoint-1/.metadata: " in line and needle in line
    assert "Error:" not in line  # no raw KeyError / ValueError / AttributeError
    assert errors[0]["message"] in line


@pytest.mark.parametrize("fmt", ["raw", "zarr"])
def test_wrong_recorded_digest_says_the_bytes_are_intact(tmp_path: Path, fmt: str) -> None:
    """The chunk on disk is fine, its digest in the manifest was changed: no offset past
    the chunk's end, but what happened."""
    line, _ = run_damaged(tmp_path, "manifest-wrong-digest", fmt)
    assert "chunk model.tok_embeddings.weight" in line and INTACT in line
    assert " of 256000)" not in line and "byte 256000" not in line


def test_where_bytes_differ_stays_inside_the_chunk() -> None:
    from ckptbench.formats.verify import describe_difference

    want = np.arange(100, dtype=np.uint8)
    assert describe_difference(want.copy(), want).startswith(INTACT)
    got = want.copy()
    got[37] ^= 1
    assert describe_difference(got, want) == "bytes differ from chunk byte 37 of 100"
    assert describe_difference(want[:60], want) == "only 60 of its 100 bytes were read back"
    assert describe_difference(np.concatenate([want, want[:3]]), want) == \
        "103 bytes were read back where 100 were written"
