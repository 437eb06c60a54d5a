"""Typed backend options: CLI flags generated from them, misplaced and unknown options
refused in one line for every backend, I/O hints and capabilities."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckptbench.backends import OTHER, BackendOptions, IOHints, open_backend, registered
from ckptbench.backends.local import LocalOptions
from ckptbench.backends.options import OptionSpec
from ckptbench.backends.s3 import S3Backend, S3Options
from ckptbench.backends.s3.readahead import SMALL_PER_LARGE
from ckptbench.cli import main
from ckptbench.cli.backend_options import backend_flags
from ckptbench.errors import BackendError

from . import TINY

MIB = 1 << 20
# One target per registered scheme (a new backend adds its line here).
TARGETS = {"file": "DIR", "s3": "s3://bucket/x", "null": "null://", "memory": "memory://t",
           OTHER: "gcs://bucket/x"}


def target_for(scheme: str, tmp_path: Path) -> str:
    return str(tmp_path / "t") if scheme == "file" else TARGETS[scheme]


def example(spec: OptionSpec) -> list[str]:
    """A value click accepts for the flag (the backend's check comes after); none for a
    switch."""
    if spec.switch:
        return []
    if spec.choices:
        return [spec.choices[0]]
    if spec.size:
        return ["8MiB"]
    return [str(spec.minimum) if spec.minimum is not None else "http://127.0.0.1:1"]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["run", str(TINY), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def misplaced() -> list[tuple[str, str, OptionSpec]]:
    """(scheme, flag, spec) for every flag a registered backend does not take."""
    out = []
    for scheme, cls in registered().items():
        mine = cls.Options.cli_fields()
        out += [(scheme, f.flag, f.takers[0][1]) for f in backend_flags() if f.flag not in mine]
    return out


def test_every_scheme_has_an_example_target() -> None:
    assert set(registered()) == set(TARGETS)


@pytest.mark.parametrize(("scheme", "flag", "spec"), misplaced(),
                         ids=[f"{s}{f}" for s, f, _ in misplaced()])
def test_a_flag_for_another_backend_is_one_line(scheme: str, flag: str, spec: OptionSpec,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    cls = registered()[scheme]
    target = target_for(scheme, tmp_path)
    rc, out, err = run_cli(capsys, "--target", target, flag, *example(spec),
                           "--results", str(tmp_path / "r.jsonl"))
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ckptbench: error: {flag} is not an option of the {cls.name} "
                               f"backend (target {target}); its options: ")
    assert not (tmp_path / "t").exists() and not (tmp_path / "r.jsonl").exists()


def test_the_misplaced_cases_named_in_the_issue(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(capsys, "--target", str(tmp_path / "t"), "--part-size", "16MiB")
    assert rc == 2 and "--part-size is not an option of the local backend" in err
    assert "its options: --io" in err
    rc, _, err = run_cli(capsys, "--target", "s3://bucket/x", "--io", "direct")
    assert rc == 2 and "--io is not an option of the s3 backend" in err and "--part-size" in err


@pytest.mark.parametrize(("target", "args", "message"), [
    ("s3://bucket/x", ["--part-size", "1MiB"], "--part-size 1048576: S3 parts must be 5 MiB"),
    ("s3://bucket/x", ["--part-size", "lots"], "--part-size 'lots' is not a size"),
    ("s3://bucket/x", ["--endpoint-url", "127.0.0.1:9000"], "http:// or https://"),
    ("DIR", ["--io", "mmap"], "'mmap' is not one of 'buffered', 'direct'"),
    ("DIR", ["--seed", "-1"], "--seed"),
])
def test_bad_values_are_refused_before_anything_runs(target: str, args: list[str], message: str,
                                                    tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    target = str(tmp_path / "t") if target == "DIR" else target
    rc, out, err = run_cli(capsys, "--target", target, *args,
                           "--results", str(tmp_path / "r.jsonl"))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not (tmp_path / "t").exists() and not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("scheme", sorted(TARGETS))
def test_an_unknown_option_name_is_one_line(scheme: str, tmp_path: Path) -> None:
    cls = registered()[scheme]
    with pytest.raises(BackendError) as err:
        open_backend(target_for(scheme, tmp_path), {"colour": "blue"})
    assert str(err.value).startswith(f"{cls.name} backend: unknown option 'colour'; allowed: ")


def test_flags_are_generated_from_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    text = capsys.readouterr().out
    for cls in registered().values():
        for flag in cls.Options.cli_fields():
            assert flag in text, flag
    part = next(f for f in backend_flags() if f.flag == "--part-size")
    assert {name for name, _, _ in part.takers} == {"s3", "fsspec"}


def test_options_are_typed_and_checked_where_made() -> None:
    assert LocalOptions().io == "buffered"
    o = S3Options.from_flags({"--part-size": "16MiB", "--s3-concurrency": 2}, "s3", "s3://b/x")
    assert (o.part_size, o.concurrency) == (16 * MIB, 2)
    assert S3Options.from_mapping({"part_size": "5MiB", "endpoint_url": None}, "s3").part_size \
        == 5 * MIB
    with pytest.raises(BackendError, match="--s3-concurrency 0: allowed: 1 or more"):
        S3Options(concurrency=0)
    with pytest.raises(BackendError, match="--s3-max-attempts '3': allowed: an integer"):
        S3Options(max_attempts="3")  # type: ignore[arg-type]
    with pytest.raises(BackendError, match="allowed: S3Options"):
        S3Backend("s3://b/x", LocalOptions())  # type: ignore[arg-type]
    assert BackendOptions().to_dict() == {}


def test_io_hints_size_the_s3_connection_pool() -> None:
    b = S3Backend("s3://bucket/x", S3Options(concurrency=3), IOHints(threads=5))
    client: Any = b._client()
    # every GET of a restore's read-ahead at once: large ones and SMALL_PER_LARGE small each
    assert client.meta.config.max_pool_connections == 3 * 5 * (1 + SMALL_PER_LARGE) + 4
    assert S3Backend("s3://bucket/x").hints == IOHints()
    with pytest.raises(BackendError, match="allowed: 1 or more"):
        IOHints(threads=0)


def test_backends_command_lists_every_backend(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["backends", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["backend"] for r in rows] == [cls.name for cls in registered().values()]
    s3 = next(r for r in rows if r["backend"] == "s3")
    assert s3["capabilities"]["shared_file"] is False and "--part-size" in s3["options"]
    local = next(r for r in rows if r["backend"] == "local")
    assert local["capabilities"]["shared_file"] is True and list(local["options"]) == ["--io"]
    assert s3["capabilities"]["unfinished_uploads"] and s3["capabilities"]["transfer_buffers"]
    assert not local["capabilities"]["unfinished_uploads"]
    assert local["capabilities"]["striping"] and not s3["capabilities"]["striping"]
