"""The commit manifest's bytes on storage (:class:`ckptbench.formats.manifest.Manifest`
is the manifest itself): one JSON line, then padding up to the size DCP's ``.metadata``
would have for the whole plan.

A restoring DCP rank reads the checkpoint's ``.metadata`` (a pickle indexing every chunk
of the full job) before any chunk; a subset or scaled run's manifest would be tens of KB.
So the manifest carries its JSON (what ckptbench needs: digests, the workload) on the
first line and pseudo-random padding after it, and records its total size so a truncated
one is caught. Readers stream it in blocks (a 405B job's metadata is hundreds of MB).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ckptbench.backends import Backend
from ckptbench.errors import VerificationError
from ckptbench.formats.pipeline import aligned_buffer
from ckptbench.payload import PayloadGenerator, Region
from ckptbench.plan import Plan
from ckptbench.plan.metadata import dcp_metadata_bytes

READ_BLOCK = 8 << 20
# What a reader reads of a manifest at most: its JSON line is held in memory and parsed,
# the padding only streamed (DCP's .metadata of the largest plans is hundreds of MB). A
# device, a runaway file or an altered manifest ends here, in one line.
MAX_MANIFEST_BYTES = 16 << 30
MAX_MANIFEST_JSON_BYTES = 2 << 30


def _pieces(manifest: Mapping[str, object], size: int, files: list[bytes] | None = None
            ) -> list[bytes]:
    """The manifest's JSON line (newline included) in pieces, with ``size`` last: the
    total, at least `size` bytes; one ``json.dumps`` whatever the size's digits. `files`:
    "files" already encoded, as JSON members (``"key": {...}``) in pieces (each
    process's), kept apart so that they are copied once, into the writer's buffer."""
    head = json.dumps({k: v for k, v in manifest.items() if k != "size"}).encode()
    out = [b"{", head[1:-1]] if len(head) > 2 else [b"{"]
    if files is not None:
        members = [f for f in files if f]
        out += [b", " if len(out) > 1 else b"", b'"files": {']
        for i, f in enumerate(members):
            out += [b", ", f] if i else [f]
        out.append(b"}")
    out.append(b', "size": ' if len(out) > 1 else b'"size": ')
    lead = sum(len(x) for x in out)
    total = 0
    for _ in range(3):  # the total's digits change the line's length at most twice
        want = max(size, lead + len(str(total)) + 2)
        if want == total:
            break
        total = want
    return [*out, str(total).encode(), b"}\n"]


def _body(manifest: Mapping[str, object], size: int, files: list[bytes] | None = None) -> bytes:
    """The manifest's JSON (:func:`_pieces`, joined, without the newline)."""
    return b"".join(_pieces(manifest, size, files))[:-1]


def encode_members(members: Mapping[str, object]) -> bytes:
    """An object's members as JSON without the braces (a piece of :func:`_body`'s files)."""
    return json.dumps(members).encode()[1:-1]


def encode_manifest(manifest: Mapping[str, object], size: int) -> bytes:
    """The manifest's bytes: JSON, a newline, padding; at least `size` bytes in all. The
    JSON's ``size`` field is the total."""
    body = _body(manifest, size)
    return body + b"\n" + _padding(len(body) + 1, max(size, len(body) + 1))


def _padding(start: int, end: int) -> bytes:
    pad = np.zeros(end - start, dtype=np.uint8)
    _fill(pad, start)
    return pad.tobytes()


def manifest_bytes(plan: Plan, fmt: str) -> int:
    """The size a run's manifests are padded to: DCP's ``.metadata`` for the whole plan,
    whatever part of it ran (the raw format; other formats write their own metadata)."""
    return dcp_metadata_bytes(plan) if fmt == "raw" else 0


PAD_SEED = 0x6D616E6966657374  # the padding's payload stream ("manifest")


def _fill(out: np.ndarray, start: int) -> None:
    """Padding bytes [start, start + len(out)) of a manifest: the payload generator's
    stream (incompressible, at memory speed), aligned to 8 bytes."""
    lo = start // 8 * 8
    if lo == start and len(out) % 8 == 0:
        PayloadGenerator().fill(PAD_SEED, [Region(0, start + len(out), "", "")], start, out)
        return
    tmp = np.zeros((start + len(out) - lo + 7) // 8 * 8, dtype=np.uint8)
    PayloadGenerator().fill(PAD_SEED, [Region(0, lo + len(tmp), "", "")], lo, tmp)
    out[:] = tmp[start - lo:start - lo + len(out)]


class ManifestWriter:
    """One run's manifests, committed one at a time (a lock: async commits overlap): the
    padding (the size DCP's ``.metadata`` has; its bytes stand for nothing) is generated
    once, before the first save's clock starts (:meth:`prepare`), into a buffer every
    commit reuses; a commit writes its JSON over the buffer's head and puts the buffer.
    So the coordinator's own time per save is the JSON, not hundreds of MB of padding."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._buf = np.zeros(0, dtype=np.uint8)
        self._head = 0  # bytes at the buffer's start the last manifest wrote over
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Generate the padding (off the clock: called when the run sets up)."""
        with self._lock:
            if len(self._buf) < self.size:
                self._buf = np.zeros(self.size, dtype=np.uint8)
                _fill(self._buf, 0)
                self._head = 0

    def commit(self, backend: Backend, key: str, manifest: Mapping[str, object],
               files: list[bytes] | None = None) -> CommitTimes:
        """Encode `manifest` (with `files`, its "files" encoded in pieces, when given) and
        put it atomically at `key`; the clock readings of each part (the backend's error
        propagates)."""
        with self._lock:
            t0 = time.perf_counter_ns()
            data = self._encode(manifest, files)
            t1 = time.perf_counter_ns()
            renamed = backend.put_atomic(key, data)
            t2 = time.perf_counter_ns()
        return CommitTimes(t0, t1, renamed if renamed is not None else t2, t2)

    def _encode(self, manifest: Mapping[str, object], files: list[bytes] | None
                ) -> bytes | memoryview:
        pieces = _pieces(manifest, self.size, files)
        line = sum(len(x) for x in pieces)
        total = max(self.size, line)
        if total > len(self._buf):  # JSON past the padding's size (or no padding)
            return b"".join(pieces) + _padding(line, total)
        if self._head > line:  # a longer JSON before: its tail back to padding
            _fill(self._buf[line:self._head], line)
        view, at = memoryview(self._buf.data), 0
        for x in pieces:  # one copy of each piece, into the buffer
            view[at:at + len(x)] = x
            at += len(x)
        self._head = line
        return view[:total]


@dataclass(frozen=True)
class CommitTimes:
    """A commit's clock readings (perf_counter_ns): the JSON encoded from `start` to
    `encoded`; the manifest's bytes written until `renamed` (where a rename commits them;
    else `renamed` == `end`), the commit's rename until `end`."""

    start: int
    encoded: int
    renamed: int
    end: int


def read_manifest_bytes(backend: Backend, key: str, block: int = READ_BLOCK,
                        limits: tuple[int, int] = (MAX_MANIFEST_BYTES, MAX_MANIFEST_JSON_BYTES)
                        ) -> tuple[bytes, int]:
    """Read the whole manifest (padding included, as DCP reads all of .metadata); return
    its first line (the JSON) and its size. FileNotFoundError when absent;
    VerificationError past `limits` (all of it, its JSON line)."""
    if not backend.exists(key):
        raise FileNotFoundError(key)
    align = max(backend.alignment, 1)
    block = max(block // align, 1) * align
    buf = aligned_buffer(block)
    head = bytearray()
    found = False
    size = 0
    handle = backend.open_read(key)
    try:
        while True:
            got = handle.readinto(size, buf.data[:block])
            if not found:
                piece = bytes(buf[:got])
                cut = piece.find(b"\n")
                head += piece if cut < 0 else piece[:cut]
                found = cut >= 0
                if not found and len(head) > limits[1]:
                    raise VerificationError(f"{key}: its JSON line does not end within "
                                            f"{limits[1]:,} bytes; allowed: a manifest "
                                            "ckptbench wrote; the checkpoint is not restored")
            size += got
            if size > limits[0]:
                raise VerificationError(f"{key}: larger than {limits[0]:,} bytes; allowed: a "
                                        "manifest ckptbench wrote; the checkpoint is not restored")
            if got < block:
                break
    finally:
        handle.close()
    return bytes(head), size
