"""A checkpoint's commit manifest: one type that owns its schema, its encoding, the checks
a restore makes before it trusts it, and the acceptance of a kept checkpoint.

The runner commits it last (atomically), so a checkpoint without one is incomplete. It
holds what a restore verifies against (each file's chunks and digests, the metadata
objects' digests) and what ``ckptbench restore`` needs to run a checkpoint again (the
workload, the ranks that wrote, payload and seed). Its bytes on storage, a JSON line and
padding, are ``manifest_encoding``'s.

A damaged manifest fails the restore with one line naming the manifest and what is
wrong, never a KeyError from deep inside a format.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NotRequired, TypedDict, TypeGuard

import numpy as np

from ckptbench.backends import Backend
from ckptbench.errors import CkptbenchError, VerificationError
from ckptbench.fields import shown
from ckptbench.formats.manifest_encoding import (
    READ_BLOCK,
    CommitTimes,
    ManifestWriter,
    encode_manifest,
    encode_members,
    manifest_bytes,
    read_manifest_bytes,
)
from ckptbench.payload import MODES as PAYLOAD_MODES
from ckptbench.payload import digest
from ckptbench.plan import Plan
from ckptbench.plan.files import RegionLayout, plan_layout

if TYPE_CHECKING:
    from ckptbench.formats.base import FileJob

__all__ = ["READ_BLOCK", "CommitTimes", "Digested", "FileEntry", "Manifest", "ManifestWriter", "encode_members",
           "manifest_bytes", "manifest_files", "read_manifest_bytes"]


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


class Digested(TypedDict):
    """What a restore verifies a file against: one xxh3 digest per chunk, in file order
    (all a fill-in's entry holds)."""

    digests: list[int]


class FileEntry(Digested):
    """A file's entry in the manifest's "files" (keyed by its path, or ``path#rank`` for
    a rank's region of a shared file)."""

    rank: int
    size: int
    chunks: list[list[str | int]]  # [state key, offset in the file, bytes], one per digest
    path: NotRequired[str]  # a region of a shared file: that file
    offset: NotRequired[int]  # where the region starts in it
    file_size: NotRequired[int]  # the shared file's size


def _an_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int(value: object, minimum: int = 0) -> bool:
    return _an_int(value) and value >= minimum


# The fields `ckptbench restore` uses of a kept checkpoint: (field, check, what is allowed).
_KEPT_FIELDS: list[tuple[str, Callable[[object], bool], str]] = [
    ("files", lambda v: isinstance(v, dict), "an object of file entries"),
    ("ranks", lambda v: isinstance(v, list) and bool(v) and all(_is_int(r) for r in v),
     "a non-empty list of the ranks that wrote (integers >= 0)"),
    ("payload", lambda v: v in PAYLOAD_MODES, ", ".join(PAYLOAD_MODES)),
    ("seed", _is_int, "an integer >= 0"),
    ("iteration", lambda v: _is_int(v, 1), "an integer >= 1"),
]


class Manifest(Mapping[str, Any]):
    """The decoded manifest stored at `key` (its JSON fields, read-only), with the size it
    has on storage when it was read from there."""

    SCHEMA: ClassVar[str] = "ckptbench.manifest/1"

    def __init__(self, key: str, fields: dict[str, Any], stored: int | None = None) -> None:
        self.key = key
        self.fields = fields
        self.stored = stored

    # --- a read-only mapping of its fields ---
    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    @property
    def files(self) -> dict[str, FileEntry]:
        """Its file entries (as decoded: covers() checks them before a restore trusts them)."""
        files: dict[str, FileEntry] = self.fields["files"]
        return files

    @property
    def format(self) -> str:
        """The format it was written in (manifests before formats: raw)."""
        return str(self.fields.get("format", "raw"))

    # --- encoding ---
    @classmethod
    def decode(cls, data: bytes, key: str = "manifest", stored: int | None = None) -> Manifest:
        """The manifest in `data` (its first line; the rest is padding): VerificationError,
        one line, when that is not a JSON object."""
        where = f"manifest {key}"
        try:
            fields = json.loads(data.split(b"\n", 1)[0])
        except UnicodeDecodeError:
            raise VerificationError(f"{where}: not UTF-8 text (a damaged manifest); the "
                                    "checkpoint cannot be verified") from None
        except (ValueError, RecursionError) as exc:
            raise VerificationError(f"{where}: not JSON ({_one_line(str(exc))}); the checkpoint "
                                    "cannot be verified") from None
        if not isinstance(fields, dict):
            raise VerificationError(f"{where}: a JSON {type(fields).__name__}, not an object "
                                    "with 'files'; the checkpoint cannot be verified")
        return cls(key, fields, stored)

    def encode(self, size: int) -> bytes:
        """Its bytes: the JSON line, then padding; at least `size` bytes in all (the JSON's
        ``size`` field says the total)."""
        return encode_manifest(self.fields, size)

    # --- read from storage (a restore reads its bytes itself: manifest_encoding) ---
    @classmethod
    def load(cls, backend: Backend, key: str, block: int = READ_BLOCK) -> Manifest:
        """The manifest at `key` for a caller that must first know it is ckptbench's
        (`ckptbench restore`): FileNotFoundError when absent; CkptbenchError when it is
        not a ckptbench manifest; VerificationError when it is not all there."""
        head, size = read_manifest_bytes(backend, key, block)
        try:
            fields = json.loads(head)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise CkptbenchError(f"{key}: not a ckptbench manifest (its first line is not "
                                 "JSON); the checkpoint is not restored") from None
        if not isinstance(fields, dict):
            raise CkptbenchError(f"{key}: not a ckptbench manifest; the checkpoint is not "
                                 "restored")
        manifest = cls(key, fields, size)
        manifest.check_size()
        return manifest

    # --- checks before a restore trusts it ---
    def check_size(self) -> None:
        """VerificationError when it is not the size it was written at."""
        expected, key = self.fields.get("size"), self.key
        if self.stored is None or (expected is None and "size" not in self.fields):
            return  # no size recorded: nothing to compare
        if not _an_int(expected):
            raise VerificationError(f"{key}: its size field is {expected!r:.40}, not the number "
                                    "of bytes written (an altered manifest); the checkpoint is "
                                    "not restored")
        if expected and expected != self.stored:
            raise VerificationError(f"{key}: manifest is {self.stored} bytes, {expected} were "
                                    "written (truncated or altered); the checkpoint is not "
                                    "restored")

    def covers(self, jobs: Iterable[FileJob],
               chunks_of: Callable[[FileJob], int] | None = None) -> None:
        """VerificationError unless it holds what a restore of `jobs` reads: a 'files'
        object with, for every job, an entry with one integer digest per chunk of its file
        (`chunks_of`; by default the job's regions) listing each chunk the job reads;
        'objects' (metadata digests), when present, maps names to integers."""
        where = f"manifest {self.key}"
        files = self.fields.get("files")
        if not isinstance(files, dict):
            raise VerificationError(f"{where}: no 'files' object; the checkpoint cannot be "
                                    "verified")
        for job in jobs:
            entry = files.get(job.name)
            if entry is None:
                raise VerificationError(f"{job.name}: missing from the manifest {self.key}")
            digests = entry.get("digests") if isinstance(entry, dict) else None
            if not isinstance(digests, list) or not all(_an_int(d) for d in digests):
                raise VerificationError(f"{where}: the entry of {job.name} has no 'digests' "
                                        "list of integers; the checkpoint cannot be verified")
            want = chunks_of(job) if chunks_of is not None else len(job.regions)
            if len(digests) != want:
                raise VerificationError(f"{where}: the entry of {job.name} has {len(digests)} "
                                        f"chunk digests where the plan has {want} chunks")
            uncovered = _uncovered(entry.get("chunks"), job)
            if uncovered:
                raise VerificationError(f"{where}: the entry of {job.name} does not list "
                                        f"{uncovered}, which the restore reads; the checkpoint "
                                        "cannot be verified")
        objects = self.fields.get("objects", {})
        if not isinstance(objects, dict) or not all(
                _an_int(d) for d in objects.values()):
            raise VerificationError(f"{where}: 'objects' is not an object of integer digests")

    def written_as(self, fmt: str) -> None:
        """VerificationError unless it was written in format `fmt`."""
        if self.format != fmt:
            raise VerificationError(f"{self.key}: written as {self.format!r}, not {fmt!r}")

    def check_object(self, name: str, key: str, data: bytes | np.ndarray | None) -> None:
        """Refuse metadata object `name` (stored at `key`) unless it is there and its bytes
        are those whose digest it recorded."""
        want = self.fields.get("objects", {}).get(name)
        if want is None:
            raise VerificationError(f"manifest {self.key}: no digest for the metadata object "
                                    f"{name}; the checkpoint cannot be verified")
        if data is None:
            raise VerificationError(f"metadata object {key} is missing")
        got = digest(data if isinstance(data, np.ndarray) else bytes(data))
        if got != want:
            raise VerificationError(f"metadata object {key} differs from the one written (xxh3 "
                                    f"{got:016x}, manifest {want:016x}): a reader would not "
                                    "load what was saved")

    # --- acceptance of a kept checkpoint (`ckptbench restore`) ---
    def accept(self, formats: Sequence[str]) -> None:
        """CkptbenchError, one line naming the field, unless it is a manifest of this
        schema, written in one of `formats`, with every field a restore of it uses
        holding what it may."""
        key = self.key
        if self.fields.get("schema") != self.SCHEMA:
            raise CkptbenchError(f"{key}: schema {shown(self.fields.get('schema'))} is not "
                                 f"{self.SCHEMA!r}; ckptbench restores only checkpoints it wrote")
        if self.format not in formats:
            raise CkptbenchError(f"{key}: written as --format {shown(self.fields.get('format'))}"
                                 f"; allowed: checkpoints written with --format "
                                 f"{' or '.join(formats)}")
        if not isinstance(self.fields.get("workload_spec"), dict):
            raise CkptbenchError(f"{key}: no workload_spec (written by an older ckptbench); "
                                 "allowed: checkpoints of this version")
        for field, fits, rule in _KEPT_FIELDS:
            if field not in self.fields or not fits(self.fields[field]):
                value = shown(self.fields[field]) if field in self.fields else "missing"
                raise CkptbenchError(f"{key}: {field} is {value}; allowed: {rule} (an altered "
                                     "or older manifest); the checkpoint is not restored")


def _uncovered(chunks: object, job: FileJob) -> str | None:
    """The first chunk the job reads that the manifest entry's 'chunks' ([key, offset,
    bytes] in file order, one per digest) does not list where its digest is; None when
    every read is covered."""
    if not isinstance(chunks, list):
        return "its chunks (no 'chunks' list)"
    wanted = (enumerate(job.regions) if job.reads is None else
              ((rd.digest, rd.region) for rd in job.reads))
    for pos, region in wanted:
        listed = chunks[pos] if pos < len(chunks) else None
        if listed != [region.key, region.start, region.end - region.start]:
            return (f"chunk {region.key} at byte {region.start:,} "
                    f"({region.end - region.start:,} bytes)")
    return None


def manifest_files(plan: Plan, checkpoint: str, digests: Mapping[int, list[int]],
                   layout: RegionLayout | None = None) -> dict[str, FileEntry]:
    """The manifest's "files": one entry per file, or per rank's region of a shared file
    (named key#rank, with the path, the offset and the whole file's size)."""
    layout = layout or plan_layout(plan)
    names = [k.name for k in plan.keys]
    out: dict[str, FileEntry] = {}
    for f, d in sorted(digests.items()):
        path, rank = plan.file_paths[f], int(plan.file_rank[f])
        key = f"{checkpoint}/{path}"
        span = plan.chunks_of_file(f)
        nbytes = plan.chunk_nbytes[span.start:span.stop]
        kept = nbytes > 0  # the file's non-empty chunks, from the plan's columns at once
        entry: FileEntry = {
            "rank": rank,
            "size": int(plan.file_bytes[f]),
            "chunks": [[names[k], o, n] for k, o, n in zip(
                plan.chunk_key[span.start:span.stop][kept].tolist(),
                plan.chunk_file_offset[span.start:span.stop][kept].tolist(),
                nbytes[kept].tolist(), strict=True)],
            "digests": d,
        }
        if layout.is_shared(path):
            entry["path"], entry["offset"] = key, int(layout.base[f])
            entry["file_size"] = layout.shared_size[path]
            key = f"{key}#{rank}"
        out[key] = entry
    return out
