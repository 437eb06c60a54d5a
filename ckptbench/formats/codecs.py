"""`--codec NAME[:k=v,...]`: what the zarr format compresses shards with, validated up front.

Names and options (defaults in brackets):

* ``none``: the ``bytes`` codec only (uncompressed);
* ``zstd[:level=N]`` [3], N in 1-22: zarr's ``zstd`` codec (in the zarr v3 spec);
* ``lz4[:acceleration=N]`` [1], N in 1-65537: numcodecs' LZ4 (``numcodecs.lz4``, outside
  the zarr v3 spec: zarr-python and numcodecs read it, TensorStore does not);
* ``blosc[:cname=C,clevel=N,shuffle=S,blocksize=B]`` [zstd, 3, byte, 0]: zarr's ``blosc``
  codec; C in blosclz, lz4, lz4hc, zlib, zstd; N in 0-9; S in none, byte (byte grouping),
  bit (bit grouping); B bytes per block, 0 = automatic. The type size is the element size.

Every codec also takes ``inner_chunks=N`` [1]: the number of inner chunks each shard is
cut into along dimension 0 (the sharding codec's chunk shape). It is a first-order
parameter for zarr's speed, so it is part of the codec spec and recorded with it.

A bad name or option is a :class:`SpecError` with one line, naming what is allowed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from ckptbench.errors import SpecError

CODEC_NAMES = ("none", "zstd", "lz4", "blosc")
SHUFFLES = {"none": "noshuffle", "byte": "shuffle", "bit": "bitshuffle"}
BLOSC_CNAMES = ("blosclz", "lz4", "lz4hc", "zlib", "zstd")
INNER_CHUNKS_MAX = 4096

# option -> (kind, default, allowed): kind "int" takes (lo, hi), "choice" a tuple
_OPTIONS: dict[str, dict[str, tuple[str, Any, Any]]] = {
    "none": {},
    "zstd": {"level": ("int", 3, (1, 22))},
    "lz4": {"acceleration": ("int", 1, (1, 65537))},
    "blosc": {
        "cname": ("choice", "zstd", BLOSC_CNAMES),
        "clevel": ("int", 3, (0, 9)),
        "shuffle": ("choice", "byte", tuple(SHUFFLES)),
        "blocksize": ("int", 0, (0, 1 << 31)),
    },
}
_COMMON = {"inner_chunks": ("int", 1, (1, INNER_CHUNKS_MAX))}


@dataclass(frozen=True)
class CodecSpec:
    """A parsed, validated codec choice."""

    name: str = "none"
    options: dict[str, Any] = field(default_factory=dict)
    inner_chunks: int = 1

    @property
    def compressed(self) -> bool:
        return self.name != "none"

    def text(self) -> str:
        """The canonical spelling, every option explicit (what the records keep)."""
        opts = {**self.options, "inner_chunks": self.inner_chunks}
        return f"{self.name}:" + ",".join(f"{k}={v}" for k, v in opts.items())

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.options, "inner_chunks": self.inner_chunks}

    def zarr_compressors(self, itemsize: int) -> list[Any]:
        """The bytes-to-bytes codecs of each inner chunk (after the ``bytes`` codec)."""
        if self.name == "none":
            return []
        import zarr.codecs as zc

        if self.name == "zstd":
            return [zc.ZstdCodec(level=self.options["level"], checksum=False)]
        if self.name == "blosc":
            o = self.options
            shuffle: Any = SHUFFLES[o["shuffle"]]
            return [zc.BloscCodec(cname=o["cname"], clevel=o["clevel"], shuffle=shuffle,
                                  typesize=itemsize,
                                  blocksize=o["blocksize"])]
        if self.name == "lz4":
            with warnings.catch_warnings():  # "not in the zarr v3 specification": documented
                warnings.simplefilter("ignore")
                try:
                    from zarr.codecs.numcodecs import LZ4
                except ImportError:  # zarr < 3.1.3
                    from numcodecs.zarr3 import LZ4  # type: ignore[no-redef]
                return [LZ4(acceleration=self.options["acceleration"])]
        raise AssertionError(self.name)


def _value(codec: str, key: str, raw: str, spec: tuple[str, Any, Any], text: str) -> Any:
    kind, _default, allowed = spec
    if kind == "int":
        lo, hi = allowed
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise SpecError(f"--codec {text!r}: {key}={raw} is not allowed for {codec};"
                            f" allowed: an integer in {lo}-{hi}")
        return value
    if raw not in allowed:
        raise SpecError(f"--codec {text!r}: {key}={raw} is not allowed for {codec};"
                        f" allowed: {', '.join(allowed)}")
    return raw


def parse_codec(text: str | None) -> CodecSpec:
    """'zstd:level=5,inner_chunks=4' -> CodecSpec; raise SpecError (one line) when bad."""
    text = (text or "none").strip()
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    if name not in _OPTIONS:
        raise SpecError(f"--codec {text!r}: unknown codec {name!r};"
                        f" allowed: {', '.join(CODEC_NAMES)}")
    known = {**_OPTIONS[name], **_COMMON}
    given: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = (s.strip() for s in part.partition("="))
        if not eq or not raw:
            raise SpecError(f"--codec {text!r}: {part!r} is not key=value;"
                            f" allowed keys for {name}: {', '.join(known)}")
        if key not in known:
            raise SpecError(f"--codec {text!r}: unknown option {key!r} for {name};"
                            f" allowed: {', '.join(known)}")
        if key in given:
            raise SpecError(f"--codec {text!r}: option {key!r} is given twice")
        given[key] = _value(name, key, raw, known[key], text)
    options = {k: given.get(k, spec[1]) for k, spec in _OPTIONS[name].items()}
    return CodecSpec(name, options, given.get("inner_chunks", 1))
