"""The ``zarr`` format: zarr v3 sharded arrays (layout: pure geometry; engine: threads)."""

from ckptbench.formats.zarr.engine import ZarrFormat
from ckptbench.formats.zarr.layout import MAX_SHARDS_PER_CHUNK, ZarrLayout

__all__ = ["MAX_SHARDS_PER_CHUNK", "ZarrFormat", "ZarrLayout"]
