"""The bytes of a ``torch.save`` zip container, made without torch.

DLIO (MLPerf Storage v2.0) writes each checkpoint file with ``torch.save(state, f)``: a
zip (PyTorch's miniz writer, stored, no compression) of

* ``archive/data.pkl``: the state pickled with protocol 2, each tensor reduced to
  ``torch._utils._rebuild_tensor_v2`` and its storage replaced by a persistent id
  ``('storage', torch.<X>Storage, key, 'cpu', numel)``;
* ``archive/.format_version`` ("1"), ``archive/.storage_alignment`` ("64"),
  ``archive/byteorder`` ("little");
* ``archive/data/<key>``: each tensor's raw bytes, keys 0, 1, ... in pickling order;
* ``archive/version`` ("3\\n") and ``archive/.data/serialization_id`` (40 digits).

Every record's data starts 64-byte aligned (an ``FB`` extra field of 4 bytes plus fill
pads the local header); local headers carry no CRC or sizes (flag bit 3), a data
descriptor follows each non-empty record (16 bytes, 24 with zip64); the end is the
central directory (46 bytes + name per entry, + zip64 extra), a zip64 end record (56),
its locator (20) and the end record (22). Records of >= 4 GiB, or that start at >= 4 GiB,
take a zip64 extra field (4 + 8 per 64-bit field). Checked byte for byte against torch
2.15's torch.save, zip64 records included (a 4 GiB + 64 B tensor followed by two small ones).

So a container's size is the tensor bytes plus an overhead that follows from the names
and the pickle alone (:func:`container_overhead`), and its payload can be streamed: no
byte before a tensor's data depends on that data (CRCs come after it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

ALIGN = 64
U32 = 0xFFFFFFFF
STORAGE_NAMES = {"float32": "FloatStorage", "bfloat16": "BFloat16Storage",
                 "float16": "HalfStorage", "int8": "CharStorage", "uint8": "ByteStorage"}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "uint8": 1}
FIXED_RECORDS_HEAD = ((".format_version", b"1"), (".storage_alignment", b"64"),
                      ("byteorder", b"little"))
VERSION = b"3\n"
SERIALIZATION_ID_LEN = 40


@dataclass(frozen=True)
class Tensor:
    """A 1-D contiguous CPU tensor as DLIO makes them (``torch.rand(n, dtype=...)``)."""

    numel: int
    dtype: str

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]


# A state: a dict of str -> Tensor | state, in insertion order (DLIO's nested dicts).
State = dict[str, "Tensor | State"]


class _Pickler:
    """Protocol-2 opcodes exactly as CPython's C pickler emits them for torch.save:
    every str, tuple, dict, global and reduced object is memoized (BINPUT, LONG_BINPUT
    from 256 on); objects seen again (torch's constant strings 'storage' and 'cpu', the
    globals) are fetched from the memo (BINGET). Dict keys are fresh strings (DLIO makes
    them with str(i)), so they are never shared."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")
        self.memo = 0
        self.shared: dict[str, int] = {}
        self.storages = 0

    def put(self, name: str | None = None) -> None:
        if name is not None:
            self.shared[name] = self.memo
        self.out += (b"q" + bytes([self.memo]) if self.memo < 256
                     else b"r" + struct.pack("<I", self.memo))
        self.memo += 1

    def seen(self, name: str) -> bool:
        idx = self.shared.get(name)
        if idx is None:
            return False
        self.out += b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx)
        return True

    def global_(self, module: str, name: str) -> None:
        if not self.seen(f"global:{module}.{name}"):
            self.out += b"c" + f"{module}\n{name}\n".encode()
            self.put(f"global:{module}.{name}")

    def str_(self, s: str, shared: bool = False) -> None:
        if shared and self.seen(f"str:{s}"):
            return
        raw = s.encode()
        self.out += b"X" + struct.pack("<I", len(raw)) + raw
        self.put(f"str:{s}" if shared else None)

    def int_(self, v: int) -> None:
        if 0 <= v < 256:
            self.out += b"K" + bytes([v])
        elif 0 <= v < 65536:
            self.out += b"M" + struct.pack("<H", v)
        elif -(2**31) <= v < 2**31:
            self.out += b"J" + struct.pack("<i", v)
        else:
            n = (v.bit_length() >> 3) + 1
            self.out += b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)

    def int_tuple(self, values: tuple[int, ...]) -> None:
        if not values:
            self.out += b")"
            return
        if len(values) > 3:
            self.out += b"("
        for v in values:
            self.int_(v)
        self.out += b"t" if len(values) > 3 else bytes([0x84 + len(values)])
        self.put()

    def tensor(self, t: Tensor) -> None:
        self.global_("torch._utils", "_rebuild_tensor_v2")
        self.out += b"("  # the six arguments
        self.out += b"("  # the persistent id
        self.str_("storage", shared=True)
        self.global_("torch", STORAGE_NAMES[t.dtype])
        self.str_(str(self.storages))
        self.storages += 1
        self.str_("cpu", shared=True)
        self.int_(t.numel)
        self.out += b"t"
        self.put()
        self.out += b"Q"  # BINPERSID
        self.int_(0)  # storage offset
        self.int_tuple((t.numel,))
        self.int_tuple((1,))
        self.out += b"\x89"  # requires_grad False
        self.global_("collections", "OrderedDict")
        self.out += b")R"
        self.put()
        self.out += b"t"
        self.put()
        self.out += b"R"
        self.put()

    def dict_(self, d: State) -> None:
        self.out += b"}"
        self.put()
        items = list(d.items())
        for start in range(0, len(items), 1000):
            batch = items[start:start + 1000]
            single = len(items) == 1
            if not single:
                self.out += b"("
            for k, v in batch:
                self.str_(k)
                if isinstance(v, Tensor):
                    self.tensor(v)
                else:
                    self.dict_(v)
            self.out += b"s" if single else b"u"


def pickle_state(state: State) -> tuple[bytes, list[Tensor]]:
    """``archive/data.pkl`` for `state`, and its tensors in storage-key order."""
    p = _Pickler()
    p.dict_(state)
    p.out += b"."

    def tensors(d: State) -> list[Tensor]:
        out: list[Tensor] = []
        for v in d.values():
            out += [v] if isinstance(v, Tensor) else tensors(v)
        return out
    return bytes(p.out), tensors(state)


@dataclass(frozen=True)
class Record:
    """One zip entry: where its local header and its data start, and its size."""

    name: str
    header_offset: int
    data_offset: int
    size: int
    local_extra: bytes  # zip64 extra (if any) + the FB padding field

    @property
    def zip64(self) -> bool:
        return self.size >= U32 or self.header_offset >= U32

    @property
    def end(self) -> int:
        """Where the next record starts (after the data descriptor, if any)."""
        return self.data_offset + self.size + ((24 if self.zip64 else 16) if self.size else 0)

    def local_header(self) -> bytes:
        name = self.name.encode()
        return (struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, 0x0808, 0, 0, 0, 0, 0, 0,
                            len(name), len(self.local_extra)) + name + self.local_extra)

    def descriptor(self, crc: int) -> bytes:
        if not self.size:
            return b""
        if self.zip64:
            return struct.pack("<IIQQ", 0x08074B50, crc, self.size, self.size)
        return struct.pack("<IIII", 0x08074B50, crc, self.size, self.size)

    def central(self, crc: int) -> bytes:
        fields = []
        if self.size >= U32:
            fields += [self.size, self.size]
        if self.header_offset >= U32:
            fields.append(self.header_offset)
        extra = (struct.pack("<HH", 1, 8 * len(fields)) + struct.pack(f"<{len(fields)}Q", *fields)
                 if fields else b"")
        name = self.name.encode()
        return (struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, 0x0808, 0, 0, 0, crc,
                            min(self.size, U32), min(self.size, U32), len(name), len(extra), 0,
                            0, 0, 0, min(self.header_offset, U32)) + name + extra)


def _zip64_fields(size: int, pos: int) -> list[int]:
    return ([size, size] if size >= U32 else []) + ([pos] if pos >= U32 else [])


def lay_out(sizes: list[tuple[str, int]]) -> tuple[list[Record], int]:
    """Place records of (entry name, data size) back to back as torch's writer does;
    return them and where the central directory starts."""
    records, pos = [], 0
    for entry, size in sizes:
        name = "archive/" + entry
        # the local header's zip64 field holds the size and a compressed size of 0 (known
        # only after the data), as torch's writer leaves it; the central directory has both
        fields = [size, 0][:2 * (size >= U32)] + ([pos] if pos >= U32 else [])
        z64 = struct.pack("<HH", 1, 8 * len(fields)) + struct.pack(f"<{len(fields)}Q", *fields) \
            if fields else b""
        header = pos + 30 + len(name) + len(z64)
        fill = (-(header + 4)) % ALIGN
        extra = z64 + b"FB" + struct.pack("<H", fill) + b"Z" * fill
        rec = Record(name, pos, header + 4 + fill, size, extra)
        records.append(rec)
        pos = rec.end
    return records, pos


def trailer_length(records: list[Record]) -> int:
    """The central directory and the three end records."""
    central = sum(46 + len(r.name) + (4 + 8 * len(_zip64_fields(r.size, r.header_offset))
                                      if r.zip64 else 0) for r in records)
    return central + 56 + 20 + 22


def trailer(records: list[Record], crcs: list[int], central_offset: int) -> bytes:
    central = b"".join(r.central(c) for r, c in zip(records, crcs, strict=True))
    n, size = len(records), len(central)
    eocd64_offset = central_offset + size
    return (central
            + struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 0x2D, 0, 0, n, n, size,
                          central_offset)
            + struct.pack("<IIQI", 0x07064B50, 0, eocd64_offset, 1)
            + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF),
                          min(size, U32), min(central_offset, U32), 0))


def entries(pickle_len: int, tensors: list[Tensor]) -> list[tuple[str, int]]:
    """The zip entries torch.save writes, with their data sizes."""
    return ([("data.pkl", pickle_len)] + [(n, len(v)) for n, v in FIXED_RECORDS_HEAD]
            + [(f"data/{k}", t.nbytes) for k, t in enumerate(tensors)]
            + [("version", len(VERSION)), (".data/serialization_id", SERIALIZATION_ID_LEN)])


def container_size(state: State) -> int:
    """Bytes torch.save(state) writes: the tensor bytes plus :func:`container_overhead`."""
    pkl, tensors = pickle_state(state)
    records, central = lay_out(entries(len(pkl), tensors))
    return central + trailer_length(records)


def container_overhead(state: State) -> int:
    """What torch.save adds to the tensor bytes: the pickle, the zip headers and their
    64-byte alignment fill, the data descriptors and the central directory."""
    _, tensors = pickle_state(state)
    return container_size(state) - sum(t.nbytes for t in tensors)


@dataclass(frozen=True)
class Piece:
    """A run of container bytes: ``fixed`` (known up front), ``tensor`` k's data, the
    ``descriptor`` after tensor k (needs its CRC), or the ``trailer`` (needs every CRC)."""

    start: int
    length: int
    kind: str
    tensor: int = -1
    data: bytes = b""

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class Container:
    """One torch.save container: its records, its size and its byte pieces in order."""

    records: list[Record]
    central_offset: int
    size: int
    pieces: list[Piece]
    fixed_crcs: dict[int, int]  # record index -> CRC of a record that holds no tensor
    first_tensor: int  # record index of data/0

    def tensor_record(self, k: int) -> Record:
        return self.records[self.first_tensor + k]

    def crcs(self, tensor_crcs: list[int]) -> list[int]:
        return [self.fixed_crcs[i] if i in self.fixed_crcs else tensor_crcs[i - self.first_tensor]
                for i in range(len(self.records))]

    def trailer(self, tensor_crcs: list[int]) -> bytes:
        return trailer(self.records, self.crcs(tensor_crcs), self.central_offset)


def build_container(state: State, serialization_id: int = 0) -> Container:
    """The layout of torch.save(state); `serialization_id` picks the 40 digits torch
    derives from a random number (any value reads back the same)."""
    import zlib

    pkl, tensors = pickle_state(state)
    records, central = lay_out(entries(len(pkl), tensors))
    sid = f"{serialization_id % 10**40:040d}".encode()
    datas: list[bytes | None] = ([pkl] + [v for _, v in FIXED_RECORDS_HEAD]
                                 + [None] * len(tensors) + [VERSION, sid])
    pieces: list[Piece] = []
    fixed_crcs: dict[int, int] = {}
    pending = b""  # fixed bytes not yet emitted (merged into one piece)
    start = 0
    for i, (rec, data) in enumerate(zip(records, datas, strict=True)):
        pending += rec.local_header()
        if data is not None:
            fixed_crcs[i] = zlib.crc32(data)
            pending += data + rec.descriptor(fixed_crcs[i])
            continue
        k = i - (1 + len(FIXED_RECORDS_HEAD))
        pieces.append(Piece(start, len(pending), "fixed", data=pending))
        pieces.append(Piece(rec.data_offset, rec.size, "tensor", k))
        dlen = len(rec.descriptor(0))
        pieces.append(Piece(rec.data_offset + rec.size, dlen, "descriptor", k))
        start, pending = rec.end, b""
    pieces.append(Piece(start, len(pending), "fixed", data=pending))
    size = central + trailer_length(records)
    pieces.append(Piece(central, size - central, "trailer"))
    return Container(records, central, size, [p for p in pieces if p.length],
                     fixed_crcs, 1 + len(FIXED_RECORDS_HEAD))


def write_container(state: State, tensor_bytes: list[bytes], serialization_id: int = 0) -> bytes:
    """The whole container in memory (small states: tests and examples)."""
    import zlib

    c = build_container(state, serialization_id)
    crcs = [zlib.crc32(b) for b in tensor_bytes]
    out = bytearray()
    for p in c.pieces:
        if p.kind == "fixed":
            out += p.data
        elif p.kind == "tensor":
            out += tensor_bytes[p.tensor]
        elif p.kind == "descriptor":
            out += c.tensor_record(p.tensor).descriptor(crcs[p.tensor])
        else:
            out += c.trailer(crcs)
    assert len(out) == c.size
    return bytes(out)
