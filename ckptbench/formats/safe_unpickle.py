"""DCP's ``.metadata`` unpickled with an allow-list: a checkpoint cannot run code on restore.

A torch-dcp restore reads DCP's ``.metadata``, a pickle of DCP's ``Metadata``. A plain
``pickle.load`` of it (what DCP's ``FileSystemReader.read_metadata`` does) calls whatever
the pickle names (``os.system``, ``builtins.exec``, ``subprocess.Popen``...); the xxh3
digest in ckptbench's manifest does not stop that, since whoever can write the checkpoint
can write its manifest too. So ckptbench reads ``.metadata`` with :class:`MetadataUnpickler`,
which resolves only the globals on :data:`ALLOWED` -- exactly what torch 2.15's ``Metadata``
pickle is made of -- and refuses any other one before anything it names is imported or
called (:class:`UnsafePickle`: one line naming the file and the global).

What a ``.metadata`` written by ``dcp.save`` references (torch 2.15, pickle protocol 4):
the dataclasses of ``torch.distributed.checkpoint.metadata`` (``Metadata``,
``TensorStorageMetadata``, ``BytesStorageMetadata``, ``ChunkStorageMetadata``,
``TensorProperties``, ``MetadataIndex``, ``StorageMeta``, and the ``_MEM_FORMAT_ENCODING``
enum ``TensorProperties`` pickles its memory format as), ``filesystem._StorageInfo``,
``torch.Size``, the dtypes by name (``torch.float32``), layouts through
``torch.serialization._get_layout`` (a lookup of a layout by its name), and the
checkpoint's path (``pathlib.PosixPath``). Memory formats pickled by themselves
(``torch._utils`` + ``torch.channels_last``, as torch 2.15 reduces them) and
``collections.OrderedDict`` are allowed too. Containers, strings and numbers are pickle
opcodes, not globals. Everything else is refused.

What is still trusted: the allowed classes themselves, called with the pickle's
arguments (DCP's dataclasses, ``torch.Size``, an enum, paths: they store what they are
given), and what DCP does with the ``Metadata`` afterwards (the chunks it names are read
with ``torch.load(weights_only=True)``).

No torch needed here: the allow-list is by module and name, so the decision
(:func:`allowed`) and the refusals work, and are tested, without it.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from typing import IO, Any

from ckptbench.errors import CkptbenchError

_DTYPES = frozenset({
    "bcomplex32", "bfloat16", "bit", "bits16", "bits1x8", "bits2x4", "bits4x2", "bits8",
    "bool", "cdouble", "cfloat", "chalf", "complex128", "complex32", "complex64", "double",
    "float", "float16", "float32", "float4_e2m1fn_x2", "float64", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "half", "int",
    "int1", "int16", "int2", "int3", "int32", "int4", "int5", "int6", "int64", "int7", "int8",
    "long", "qint32", "qint8", "quint2x4", "quint4x2", "quint8", "short", "uint1", "uint16",
    "uint2", "uint3", "uint32", "uint4", "uint5", "uint6", "uint64", "uint7", "uint8"})
_LAYOUTS = frozenset({"_mkldnn", "jagged", "sparse_bsc", "sparse_bsr", "sparse_coo",
                      "sparse_csc", "sparse_csr", "strided"})
_MEMORY_FORMATS = frozenset({"channels_last", "channels_last_3d", "contiguous_format",
                             "legacy_contiguous_format", "preserve_format"})
_PATHS = frozenset({"Path", "PosixPath", "PurePath", "PurePosixPath", "PureWindowsPath",
                    "WindowsPath"})

# module -> the names in it that a DCP .metadata pickle may load (exact names: no dotted
# attribute paths, which pickle would follow with getattr)
ALLOWED: Mapping[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset({
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"}),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch": frozenset({"Size"}) | _DTYPES | _LAYOUTS | _MEMORY_FORMATS,
    "torch.serialization": frozenset({"_get_layout"}),
    "torch._utils": frozenset(f"torch.{m}" for m in _MEMORY_FORMATS),
    "collections": frozenset({"OrderedDict"}),
    "pathlib": _PATHS,
    "pathlib._local": _PATHS,  # where Python 3.13+ defines them
}

# torch values (not classes or functions) loaded by name: each must be of one of these types
_TORCH_VALUES = {**dict.fromkeys(_DTYPES, "dtype"), **dict.fromkeys(_LAYOUTS, "layout"),
                 **dict.fromkeys(_MEMORY_FORMATS, "memory_format"),
                 **{f"torch.{m}": "memory_format" for m in _MEMORY_FORMATS}}

WHAT_IS_ALLOWED = ("DCP's metadata dataclasses, torch.Size, torch dtypes, layouts and memory "
                   "formats, OrderedDict and paths")


class UnsafePickle(CkptbenchError):
    """A ``.metadata`` pickle that names a global off the allow-list, or that cannot be
    unpickled with it: one line, exit 2, nothing it names run."""


def allowed(module: str, name: str) -> bool:
    """Whether a DCP ``.metadata`` pickle may load global `name` of `module`."""
    return name in ALLOWED.get(module, frozenset())


def _shown(text: str) -> str:
    """A name from the pickle, printable on one line and not too long."""
    text = text.encode("ascii", "backslashreplace").decode().replace("\n", "\\n")
    return text if len(text) <= 120 else text[:117] + "..."


class MetadataUnpickler(pickle.Unpickler):
    """CPython's unpickler, resolving only the globals :func:`allowed` allows; `source`
    (the file's path or URL) names the file in a refusal."""

    def __init__(self, file: IO[bytes], source: str) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if not allowed(module, name):
            raise UnsafePickle(
                f"{self.source}: refused to load {_shown(module)}.{_shown(name)}: DCP's "
                f".metadata may reference only {WHAT_IS_ALLOWED}; a checkpoint from an "
                "untrusted source is read with this allow-list only, and this one is not "
                "restored")
        obj = super().find_class(module, name)
        kind = _TORCH_VALUES.get(name) if module in ("torch", "torch._utils") else None
        if kind is not None and type(obj).__name__ != kind:
            raise UnsafePickle(f"{self.source}: refused to load {module}.{name}: it is a "
                               f"{type(obj).__name__}, not a torch.{kind}")
        return obj

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickle(f"{self.source}: refused: DCP's .metadata holds no persistent "
                           "references")


def load_metadata(file: IO[bytes], source: str) -> Any:
    """The object pickled in `file`, unpickled with the allow-list; UnsafePickle (one
    line) for a refused global or a pickle that does not unpickle."""
    try:
        return MetadataUnpickler(file, source).load()
    except UnsafePickle:
        raise
    except Exception as exc:  # a malformed pickle: one line, not a traceback
        raise UnsafePickle(f"{source}: cannot be unpickled as DCP's metadata "
                           f"({type(exc).__name__}: {_shown(str(exc))}); the checkpoint is "
                           "not restored") from None


def loads_metadata(data: bytes, source: str) -> Any:
    """:func:`load_metadata` of bytes."""
    return load_metadata(io.BytesIO(data), source)


__all__ = ["ALLOWED", "MetadataUnpickler", "UnsafePickle", "allowed", "load_metadata",
           "loads_metadata"]
