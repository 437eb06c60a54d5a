"""Checkpoint formats: how a plan's chunks become bytes on the target.

* ``raw`` (default): ckptbench's own engine, the plan's files written as planned
  (:class:`ckptbench.runner.engine.RankEngine`).
* ``zarr``: one zarr v3 array per state-dict key, each rank writing its chunks as whole
  shards (the sharding codec), optionally compressed (:mod:`ckptbench.formats.zarr_format`).
* ``torch-dcp``: real torch tensors saved by torch.distributed.checkpoint's own writer
  (needs torch; :mod:`ckptbench.formats.torch_dcp`).

Every format runs inside the same collective loop (runner.driver): the same barriers,
clock, manifest commit, cache eviction and digest verification.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckptbench.errors import SpecError
from ckptbench.formats.codecs import CODEC_NAMES, CodecSpec, parse_codec

if TYPE_CHECKING:
    from ckptbench.plan import Plan

FORMATS = ("raw", "zarr", "torch-dcp")

__all__ = ["CODEC_NAMES", "FORMATS", "CodecSpec", "check_format", "engine_class", "parse_codec"]


def engine_class(name: str) -> Any:
    """The engine class of format `name` (imported on demand: torch stays optional)."""
    if name == "raw":
        from ckptbench.runner.engine import RankEngine

        return RankEngine
    if name == "zarr":
        from ckptbench.formats.zarr_format import ZarrEngine

        return ZarrEngine
    if name == "torch-dcp":
        from ckptbench.formats.torch_dcp import TorchDcpEngine

        return TorchDcpEngine
    raise SpecError(f"--format {name!r} is not allowed; allowed: {', '.join(FORMATS)}")


def check_format(name: str, codec: str, plan: Plan, ranks: list[int]) -> CodecSpec:
    """Validate a format choice against the plan before anything runs (one-line SpecError)."""
    if name not in FORMATS:
        raise SpecError(f"--format {name!r} is not allowed; allowed: {', '.join(FORMATS)}")
    spec = parse_codec(codec)
    if name != "zarr" and spec != CodecSpec():
        raise SpecError(f"--codec {codec!r} needs --format zarr (--format {name} writes"
                        " uncompressed bytes); allowed here: --codec none")
    if name == "zarr":
        from ckptbench.formats.zarr_format import ZarrLayout

        ZarrLayout(plan, spec)  # raises SpecError when the chunks do not fit zarr arrays
    elif name == "torch-dcp":
        from ckptbench.formats.torch_dcp import check_plan

        check_plan(plan, ranks)
    return spec
