"""The commit manifest on storage: one JSON line, then padding up to the size DCP's
``.metadata`` would have for the whole plan.

A restoring DCP rank reads the checkpoint's ``.metadata`` (a pickle indexing every chunk
of the full job) before any chunk; a subset or scaled run's manifest would be tens of KB.
So the manifest carries its JSON (what ckptbench needs: digests, the workload) on the
first line and pseudo-random padding after it, and records its total size so a truncated
one is caught. Readers stream it in blocks (a 405B job's metadata is hundreds of MB).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ckptbench.backends import Backend
from ckptbench.errors import CkptbenchError, VerificationError
from ckptbench.formats.pipeline import aligned_buffer

READ_BLOCK = 8 << 20
# What a reader reads of a manifest at most: its JSON line is held in memory and parsed,
# the padding only streamed (DCP's .metadata of the largest plans is hundreds of MB). A
# device, a runaway file or an altered manifest ends here, in one line.
MAX_MANIFEST_BYTES = 16 << 30
MAX_MANIFEST_JSON_BYTES = 2 << 30


def encode_manifest(manifest: dict[str, Any], size: int) -> bytes:
    """The manifest's bytes: JSON, a newline, padding; at least `size` bytes in all. The
    JSON's ``size`` field is the total."""
    total = 0
    for _ in range(3):  # the size's digits change the JSON's length at most twice
        body = json.dumps({**manifest, "size": total}).encode()
        want = max(size, len(body) + 1)
        if want == total:
            break
        total = want
    body = json.dumps({**manifest, "size": total}).encode()
    pad = total - len(body) - 1
    filler = np.random.default_rng(len(body)).bytes(pad) if pad else b""
    return body + b"\n" + filler


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
            got = handle.readinto(size, memoryview(buf)[:block])  # type: ignore[arg-type]
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


def check_size(key: str, manifest: dict[str, Any], size: int) -> None:
    """VerificationError when the manifest is not the size it was written at."""
    expected = manifest.get("size")
    if expected is None and "size" not in manifest:
        return  # no size recorded: nothing to compare
    if not isinstance(expected, int) or isinstance(expected, bool):
        raise VerificationError(f"{key}: its size field is {expected!r:.40}, not the number of "
                                "bytes written (an altered manifest); the checkpoint is not "
                                "restored")
    if expected and expected != size:
        raise VerificationError(f"{key}: manifest is {size} bytes, {expected} were written "
                                "(truncated or altered); the checkpoint is not restored")


def load_manifest(backend: Backend, key: str, block: int = READ_BLOCK) -> tuple[dict[str, Any], int]:
    """The manifest's JSON and size, for a caller that must first know it is ckptbench's
    (`ckptbench restore`): FileNotFoundError when absent; CkptbenchError when it is not a
    ckptbench manifest; VerificationError when it is not all there."""
    head, size = read_manifest_bytes(backend, key, block)
    try:
        manifest = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise CkptbenchError(f"{key}: not a ckptbench manifest (its first line is not JSON);"
                             " the checkpoint is not restored") from None
    if not isinstance(manifest, dict):
        raise CkptbenchError(f"{key}: not a ckptbench manifest; the checkpoint is not restored")
    check_size(key, manifest, size)
    return manifest, size


def parse_manifest(data: bytes) -> dict[str, Any]:
    """The JSON of a manifest's bytes (its first line; the rest is padding)."""
    result: dict[str, Any] = json.loads(data.split(b"\n", 1)[0])
    return result
