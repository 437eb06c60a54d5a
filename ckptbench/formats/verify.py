"""What a restore trusts, checked before it is used: the manifest's shape, the digests of
the metadata objects a reader needs (zarr's ``zarr.json``, DCP's ``.metadata``), and where
restored bytes differ from the bytes written.

A damaged manifest must fail the restore with one line naming the manifest and what is
wrong (never a KeyError from deep inside a format), and a metadata object that changed
(an array's dtype, shape, chunk grid or codecs) must fail it as surely as a changed chunk:
a reader following the damaged metadata would load something else.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np

from ckptbench.errors import VerificationError
from ckptbench.payload import digest

INTACT = ("its bytes are intact (identical to those written); the digest recorded in the "
          "manifest differs (the manifest is damaged)")


class Job(Protocol):
    """What the manifest check needs of a FileJob."""

    @property
    def name(self) -> str: ...

    regions: list[Any]


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def parse_manifest(key: str, data: bytes, jobs: Iterable[Job],
                   chunks_of: Callable[[Any], int] | None = None) -> dict[str, Any]:
    """The manifest stored at `key`, checked to hold what a restore of `jobs` reads: an
    object with a 'files' object holding, for every job, an entry with one integer digest
    per chunk; 'objects' (metadata digests), when present, maps names to integers."""
    where = f"manifest {key}"
    try:
        manifest = json.loads(data.split(b"\n", 1)[0])  # the rest is padding
    except UnicodeDecodeError:
        raise VerificationError(f"{where}: not UTF-8 text (a damaged manifest); the checkpoint "
                                "cannot be verified") from None
    except (ValueError, RecursionError) as exc:
        raise VerificationError(f"{where}: not JSON ({_one_line(str(exc))}); the checkpoint "
                                "cannot be verified") from None
    return check_manifest(key, manifest, jobs, chunks_of)


def check_manifest(key: str, manifest: Any, jobs: Iterable[Job],
                   chunks_of: Callable[[Any], int] | None = None) -> dict[str, Any]:
    """A decoded manifest, checked as :func:`parse_manifest` says."""
    where = f"manifest {key}"
    if not isinstance(manifest, dict):
        raise VerificationError(f"{where}: a JSON {type(manifest).__name__}, not an object "
                                "with 'files'; the checkpoint cannot be verified")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise VerificationError(f"{where}: no 'files' object; the checkpoint cannot be verified")
    for job in jobs:
        entry = files.get(job.name)
        if entry is None:
            raise VerificationError(f"{job.name}: missing from the manifest {key}")
        digests = entry.get("digests") if isinstance(entry, dict) else None
        if not isinstance(digests, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in digests):
            raise VerificationError(f"{where}: the entry of {job.name} has no 'digests' list "
                                    "of integers; the checkpoint cannot be verified")
        # A restore plan's job reads some of the file's chunks: the file has chunks_of(job).
        want = chunks_of(job) if chunks_of is not None else len(job.regions)
        if len(digests) != want:
            raise VerificationError(f"{where}: the entry of {job.name} has {len(digests)} chunk "
                                    f"digests where the plan has {want} chunks")
        uncovered = _uncovered(entry.get("chunks"), job)
        if uncovered:
            raise VerificationError(f"{where}: the entry of {job.name} does not list {uncovered}"
                                    ", which the restore reads; the checkpoint cannot be verified")
    objects = manifest.get("objects", {})
    if not isinstance(objects, dict) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in objects.values()):
        raise VerificationError(f"{where}: 'objects' is not an object of integer digests")
    return manifest


def _uncovered(chunks: Any, job: Job) -> str | None:
    """The first chunk the job reads that the manifest entry's 'chunks' ([key, offset,
    bytes] in file order, one per digest) does not list where its digest is; None when
    every read is covered."""
    if not isinstance(chunks, list):
        return "its chunks (no 'chunks' list)"
    reads = getattr(job, "reads", None)
    wanted = (enumerate(job.regions) if reads is None else
              ((rd.digest, rd.region) for rd in reads))
    for pos, region in wanted:
        listed = chunks[pos] if pos < len(chunks) else None
        if listed != [region.key, region.start, region.end - region.start]:
            return (f"chunk {region.key} at byte {region.start:,} "
                    f"({region.end - region.start:,} bytes)")
    return None


def check_object(manifest_key: str, manifest: dict[str, Any], name: str, key: str,
                 data: bytes | np.ndarray | None) -> None:
    """Refuse metadata object `name` (stored at `key`) unless it is there and its bytes are
    those whose digest the manifest recorded."""
    want = manifest.get("objects", {}).get(name)
    if want is None:
        raise VerificationError(f"manifest {manifest_key}: no digest for the metadata object "
                                f"{name}; the checkpoint cannot be verified")
    if data is None:
        raise VerificationError(f"metadata object {key} is missing")
    got = digest(data if isinstance(data, np.ndarray) else bytes(data))
    if got != want:
        raise VerificationError(f"metadata object {key} differs from the one written (xxh3 "
                                f"{got:016x}, manifest {want:016x}): a reader would not load "
                                "what was saved")


def object_digest(data: bytes | memoryview) -> int:
    """The digest a manifest records for a metadata object."""
    return digest(bytes(data))


def first_difference(got: np.ndarray, want: np.ndarray) -> int | None:
    """Index of the first byte where `got` differs from `want`, `len(got)` when `got` is a
    short prefix of `want`, None when they are identical."""
    n = min(len(got), len(want))
    differ = np.flatnonzero(got[:n] != want[:n])
    if len(differ):
        return int(differ[0])
    return None if len(got) == len(want) else n


def describe_difference(got: np.ndarray, want: np.ndarray) -> str:
    """Where a chunk read back (`got`, bytes) differs from the chunk written (`want`): the
    first differing byte inside the chunk, a short chunk, or intact bytes (then it is the
    recorded digest that differs)."""
    first = first_difference(got, want)
    n = len(want)
    if first is None:
        return INTACT
    if len(got) > n and first == n:
        return f"{len(got)} bytes were read back where {n} were written"
    if first == len(got):
        return f"only {len(got)} of its {n} bytes were read back"
    return f"bytes differ from chunk byte {first} of {n}"
