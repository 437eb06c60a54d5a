"""--codec and --format: parsing, canonical spelling, one-line errors (exit 2)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ckptbench.cli import main
from ckptbench.errors import SpecError
from ckptbench.formats import CodecSpec, check_format, parse_codec
from ckptbench.plan import build_plan
from ckptbench.spec import load_workload

from .conftest import TINY


def test_defaults_and_canonical_text() -> None:
    assert parse_codec(None) == CodecSpec()
    assert parse_codec("none").text() == "none:inner_chunks=1"
    assert parse_codec("zstd").text() == "zstd:level=3,inner_chunks=1"
    assert parse_codec("ZSTD:level=19, inner_chunks=8").text() == "zstd:level=19,inner_chunks=8"
    assert parse_codec("lz4").options == {"acceleration": 1}
    blosc = parse_codec("blosc:shuffle=bit,cname=lz4")
    assert blosc.options == {"cname": "lz4", "clevel": 3, "shuffle": "bit", "blocksize": 0}
    assert blosc.to_dict()["inner_chunks"] == 1
    # The text parses back to the same spec (what the records keep can be rerun).
    for text in ("none", "zstd:level=7", "lz4:acceleration=4", "blosc:clevel=5,shuffle=none",
                 "none:inner_chunks=16"):
        spec = parse_codec(text)
        assert parse_codec(spec.text()) == spec


def test_zarr_codecs() -> None:
    import zarr.codecs as zc

    assert parse_codec("none").zarr_compressors(2) == []
    (z,) = parse_codec("zstd:level=5").zarr_compressors(4)
    assert isinstance(z, zc.ZstdCodec) and z.level == 5
    (b,) = parse_codec("blosc:shuffle=byte").zarr_compressors(2)
    assert isinstance(b, zc.BloscCodec) and b.typesize == 2 and b.shuffle.value == "shuffle"
    (b,) = parse_codec("blosc:shuffle=bit").zarr_compressors(4)
    assert b.shuffle.value == "bitshuffle" and b.cname.value == "zstd"
    (lz,) = parse_codec("lz4:acceleration=3").zarr_compressors(4)
    assert lz.to_dict() == {"name": "numcodecs.lz4", "configuration": {"acceleration": 3}}


@pytest.mark.parametrize("text, match", [
    ("nope", "unknown codec 'nope'; allowed: none, zstd, lz4, blosc"),
    ("zstd:level=99", "level=99 is not allowed for zstd; allowed: an integer in 1-22"),
    ("zstd:level=fast", "level=fast is not allowed"),
    ("zstd:lvl=3", "unknown option 'lvl' for zstd; allowed: level, inner_chunks"),
    ("zstd:level", "'level' is not key=value"),
    ("zstd:level=3,level=4", "option 'level' is given twice"),
    ("lz4:acceleration=0", "allowed: an integer in 1-65537"),
    ("blosc:cname=snappy", "cname=snappy is not allowed for blosc; allowed: blosclz, lz4, lz4hc"),
    ("blosc:shuffle=word", "allowed: none, byte, bit"),
    ("blosc:clevel=10", "an integer in 0-9"),
    ("none:inner_chunks=0", "inner_chunks=0 is not allowed"),
    ("none:level=3", "unknown option 'level' for none; allowed: inner_chunks"),
])
def test_bad_codecs_are_one_line(text: str, match: str) -> None:
    with pytest.raises(SpecError, match=match) as err:
        parse_codec(text)
    assert "\n" not in str(err.value)


def test_codec_needs_the_zarr_format() -> None:
    plan = build_plan(load_workload(TINY))
    with pytest.raises(SpecError, match="--codec 'zstd' needs --format zarr"):
        check_format("raw", "zstd", plan, list(range(4)))
    assert check_format("raw", "none", plan, [0]) == CodecSpec()
    assert check_format("zarr", "lz4", plan, [0, 1]).name == "lz4"


@pytest.mark.parametrize("args, match", [
    (["--format", "zarr", "--codec", "zstd:level=99"], "level=99 is not allowed for zstd"),
    (["--format", "zarr", "--codec", "nope"], "unknown codec 'nope'"),
    (["--codec", "zstd"], "needs --format zarr"),
    (["--format", "parquet"], "'parquet' is not one of 'raw', 'zarr', 'torch-dcp'"),
])
def test_cli_bad_codec_is_one_line_exit_2(args: list[str], match: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "target"
    code = main(["run", str(TINY), "--target", str(target), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert match in err and err.startswith("ckptbench: error: ") and "\n" not in err
    assert not target.exists()  # refused before anything was created


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_cli_torch_dcp_without_torch_is_one_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(TINY), "--target", str(tmp_path / "t"), "--format", "torch-dcp"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--format torch-dcp needs torch" in err and "\n" not in err
