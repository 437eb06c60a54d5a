"""Where restored bytes differ from the bytes written, and the digest a manifest records
for a metadata object (the manifest's own checks are ``Manifest``'s).

A metadata object that changed (an array's dtype, shape, chunk grid or codecs) must fail
a restore as surely as a changed chunk: a reader following the damaged metadata would
load something else (``Manifest.check_object``).
"""

from __future__ import annotations

import numpy as np

from ckptbench.payload import digest

INTACT = ("its bytes are intact (identical to those written); the digest recorded in the "
          "manifest differs (the manifest is damaged)")


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
