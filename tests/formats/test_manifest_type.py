"""The manifest as one type (formats.manifest.Manifest): decoded from its bytes with one
line per damage, encoded back to the same bytes, checked against what a restore reads,
and a kept checkpoint's manifest accepted or refused field by field."""

from __future__ import annotations

import json

import pytest

from ckptbench.errors import CkptbenchError, VerificationError
from ckptbench.formats.base import file_jobs
from ckptbench.formats.manifest import Manifest, manifest_files
from ckptbench.plan import build_plan
from ckptbench.testing.conformance import tiny_workload

PLAN = build_plan(tiny_workload())
JOBS = file_jobs(PLAN, [0], "run/checkpoint-1", 1, 0)


def committed() -> dict[str, object]:
    digests = {j.index: list(range(len(j.regions))) for j in JOBS}
    return {"schema": Manifest.SCHEMA, "format": "raw", "payload": "random", "seed": 0,
            "iteration": 1, "ranks": [0], "workload_spec": PLAN.workload.to_dict(),
            "files": manifest_files(PLAN, "run/checkpoint-1", digests)}


def test_encode_decode_round_trip() -> None:
    fields = committed()
    data = Manifest("k", fields).encode(1 << 12)
    back = Manifest.decode(data, "k", len(data))
    assert back == {**json.loads(json.dumps(fields)), "size": len(data)}  # JSON: tuples as lists
    assert back.format == "raw"
    back.check_size()
    back.covers(JOBS)
    back.accept(("raw",))
    assert back.encode(len(data)) == data


@pytest.mark.parametrize(("data", "said"), [
    (b"{\"a\": \"\xc3\x28\"}\n", "not UTF-8"), (b"{not json\n", "not JSON"), (b"[1, 2]\n", "a JSON list")])
def test_damage_is_one_line(data: bytes, said: str) -> None:
    with pytest.raises(VerificationError, match=said) as err:
        Manifest.decode(data, "run/checkpoint-1/.metadata")
    assert "\n" not in str(err.value) and "run/checkpoint-1/.metadata" in str(err.value)


def test_covers_names_the_missing_entry_and_the_short_digests() -> None:
    fields = committed()
    files = dict(fields["files"])  # type: ignore[call-overload]
    name = JOBS[0].name
    with pytest.raises(VerificationError, match=f"{name}: missing"):
        Manifest("k", {**fields, "files": {}}).covers(JOBS)
    files[name] = {**files[name], "digests": [1]}
    with pytest.raises(VerificationError, match="chunk digests where the plan has"):
        Manifest("k", {**fields, "files": files}).covers(JOBS)


def test_size_and_format_checked() -> None:
    with pytest.raises(VerificationError, match="truncated or altered"):
        Manifest("k", {"size": 10}, stored=9).check_size()
    with pytest.raises(VerificationError, match="not the number of bytes"):
        Manifest("k", {"size": "10"}, stored=10).check_size()
    with pytest.raises(VerificationError, match="written as 'zarr', not 'raw'"):
        Manifest("k", {"format": "zarr"}).written_as("raw")


@pytest.mark.parametrize(("field", "value", "said"), [
    ("schema", "other/1", "schema"), ("format", "zarr", "--format"),
    ("workload_spec", None, "workload_spec"), ("ranks", [], "ranks is"),
    ("seed", -1, "seed is"), ("iteration", 0, "iteration is"), ("payload", "x", "payload is")])
def test_a_kept_manifest_refused_field_by_field(field: str, value: object, said: str) -> None:
    with pytest.raises(CkptbenchError, match=said) as err:
        Manifest("ck/.metadata", {**committed(), field: value}).accept(("raw", "torch-dcp"))
    assert str(err.value).startswith("ck/.metadata: ")
