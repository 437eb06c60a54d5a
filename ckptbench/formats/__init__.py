"""Checkpoint formats: how a plan's chunks become bytes on the target.

Each format is one module implementing :class:`ckptbench.formats.base.Format` and one line
in :data:`FORMATS` (imported on demand: torch stays optional):

* ``raw`` (default): the plan's files written byte for byte as planned;
* ``zarr``: one zarr v3 array per state-dict key, each rank writing its chunks as whole
  shards (the sharding codec), optionally compressed;
* ``torch-dcp``: real torch tensors saved by torch.distributed.checkpoint's own writer.

Every format runs inside the same collective loop (the runner): the same barriers, clock,
manifest commit, cache eviction and digest verification.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ckptbench.errors import SpecError
from ckptbench.formats.codecs import CODEC_NAMES, CodecSpec, parse_codec

if TYPE_CHECKING:
    from ckptbench.backends import Backend
    from ckptbench.formats.base import Format, FormatOptions, Group
    from ckptbench.formats.raw import RawFormat
    from ckptbench.formats.torch_dcp import TorchDcpFormat
    from ckptbench.formats.torch_save import TorchSaveFormat
    from ckptbench.formats.zarr import ZarrFormat
    from ckptbench.plan import Plan

    # mypy checks here that every registered format is a Format (format_class casts)
    CHECKED: tuple[type[Format], ...] = (RawFormat, ZarrFormat, TorchDcpFormat,
                                         TorchSaveFormat)

# name -> "module:Class" (the registry: one line per format)
FORMATS: dict[str, str] = {
    "raw": "ckptbench.formats.raw:RawFormat",
    "zarr": "ckptbench.formats.zarr:ZarrFormat",
    "torch-dcp": "ckptbench.formats.torch_dcp:TorchDcpFormat",
    "torch-save": "ckptbench.formats.torch_save:TorchSaveFormat",
}

__all__ = ["CODEC_NAMES", "FORMATS", "CodecSpec", "check_format", "open_format", "parse_codec"]


def _allowed(name: str) -> SpecError:
    return SpecError(f"--format {name!r} is not allowed; allowed: {', '.join(FORMATS)}")


def format_class(name: str) -> type[Format]:
    """The class of format `name`, imported on demand."""
    if name not in FORMATS:
        raise _allowed(name)
    module, _, cls = FORMATS[name].partition(":")
    return cast("type[Format]", vars(importlib.import_module(module))[cls])


def open_format(name: str, plan: Plan, ranks: list[int], backend: Backend, group: Group,
                options: FormatOptions, progress: Callable[[int], None] | None = None) -> Format:
    """Format `name` for one process's plan ranks."""
    return format_class(name)(plan, ranks, backend, group, options, progress)


def check_format(name: str, codec: str, plan: Plan, ranks: list[int]) -> CodecSpec:
    """Validate a format choice against the plan before anything runs (one-line SpecError)."""
    spec = parse_codec(codec)
    format_class(name).check(plan, ranks, spec)
    return spec
