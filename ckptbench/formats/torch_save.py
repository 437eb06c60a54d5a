"""The ``torch-save`` format: each plan file written as DLIO writes it, a torch.save zip.

For the megatron-deepspeed layout (the MLPerf Storage workloads) every file becomes the
container ``torch.save(state)`` would write for DLIO's state of that file: the model
files a dict of layers (``{"0": {"0": tensor, ...}, ...}``; one layer's dict in the
per-layer files of pipeline-parallel ZeRO 1/2), the optimizer file a dict of its groups;
zero-sized tensors are left out, as DLIO does. The bytes come from
:mod:`ckptbench.formats.torch_save_container` (no torch needed to write, ``torch.load``
reads them), the tensors' bytes from the same payload generator as the raw format, so a
restore checks every chunk's digest, and the container's headers and pickle are compared too.

The raw format's pipeline does the I/O (a producer fills a ring of buffers off the
writer's clock; fsync per file); only what goes into the buffers differs: the container
stream, with each tensor's CRC-32 (the zip needs it) computed as its bytes are made.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import replace
from typing import ClassVar

import numpy as np

from ckptbench.errors import SpecError
from ckptbench.formats.base import FileJob, PlannedRestore, Restored, ThreadResult, round_up
from ckptbench.formats.codecs import CodecSpec
from ckptbench.formats.raw import PlanBytes, RawFormat
from ckptbench.formats.torch_save_container import Container, State, Tensor, build_container
from ckptbench.payload import PayloadGenerator, Region
from ckptbench.plan import Plan
from ckptbench.spec import DTYPE_BYTES

_LAYER_KEY = re.compile(r"layer_(\d+)\.(\d+)$")
_OPT_KEY = re.compile(r"optimizer\.group_(\d+)$")


def dlio_state(plan: Plan, file: int) -> State:
    """DLIO's state dict for plan file `file` (megatron layout), tensors in file order."""
    name = plan.file_paths[file].rsplit("/", 1)[-1]
    per_layer_file = name.startswith("layer_")
    state: State = {}
    for c in plan.iter_chunks(file):
        numel = c.nbytes // DTYPE_BYTES[c.dtype]
        m = _LAYER_KEY.match(c.key)
        if m and not per_layer_file:
            layer = state.setdefault(m.group(1), {})
            assert isinstance(layer, dict)
            if c.nbytes:
                layer[m.group(2)] = Tensor(numel, c.dtype)
            continue
        m = m or _OPT_KEY.match(c.key)
        if m is None:
            raise SpecError(f"--format torch-save: chunk {c.key!r} is not one DLIO writes; "
                            "allowed: workloads with layout = 'megatron-deepspeed'")
        if c.nbytes:
            state[m.group(m.lastindex or 1)] = Tensor(numel, c.dtype)
    return state


def plan_container(plan: Plan, file: int, serialization_id: int = 0) -> Container:
    return build_container(dlio_state(plan, file), serialization_id)


def dlio_file_bytes(plan: Plan, file: int) -> int:
    """What DLIO's torch.save writes for plan file `file`: tensor bytes + container overhead."""
    return plan_container(plan, file).size


class _Stream(PlanBytes):
    """Makes (save) or checks (restore) one container's bytes, block by block in order."""

    def __init__(self, job: FileJob, container: Container, gen: PayloadGenerator) -> None:
        super().__init__(job, gen)
        self.c = container
        self.crcs = [0] * len(job.regions)
        self.cache: dict[int, bytes] = {}
        self.scratch = np.empty(0, dtype=np.uint8)

    def _tensor_bytes(self, k: int, a: int, b: int) -> np.ndarray:
        """Bytes [a, b) of tensor k (offsets within the tensor), from the raw file's stream."""
        r: Region = self.job.regions[k]
        lo, hi = r.start + a, r.start + b
        lo8 = lo // 8 * 8
        n = round_up(hi - lo8, 8)
        if len(self.scratch) < n:
            self.scratch = np.empty(n, dtype=np.uint8)
        self.gen.fill(self.job.base, [r], lo8, self.scratch[:n])
        return self.scratch[lo - lo8:hi - lo8]

    def _dynamic(self, i: int) -> bytes:
        if i not in self.cache:
            p = self.c.pieces[i]
            self.cache[i] = (self.c.tensor_record(p.tensor).descriptor(self.crcs[p.tensor])
                             if p.kind == "descriptor" else self.c.trailer(self.crcs))
        return self.cache[i]

    def _overlaps(self, off: int, n: int) -> list[tuple[int, int, int]]:
        out = []
        for i, p in enumerate(self.c.pieces):
            if p.end <= off:
                continue
            if p.start >= off + n:
                break
            out.append((i, max(p.start, off), min(p.end, off + n)))
        return out

    def fill(self, off: int, buf: np.ndarray, n: int) -> None:
        """Container bytes [off, off + n) into buf; CRCs and digests follow."""
        out = buf[:n]
        for i, a, b in self._overlaps(off, n):
            p = self.c.pieces[i]
            dst = out[a - off:b - off]
            if p.kind == "tensor":
                data = self._tensor_bytes(p.tensor, a - p.start, b - p.start)
                dst[:] = data
                self.crcs[p.tensor] = zlib.crc32(data.data, self.crcs[p.tensor])
                self.hasher.update(self.job.regions[p.tensor].start + a - p.start, data)
            else:
                src = p.data if p.kind == "fixed" else self._dynamic(i)
                dst[:] = np.frombuffer(src, dtype=np.uint8)[a - p.start:b - p.start]

    def update(self, off: int, data: np.ndarray, crc: bool = False) -> str | None:
        """Feed the tensor bytes in [off, off + len(data)) to the digests; return where the
        container's own bytes differ from torch.save's, if they do. Without `crc` the
        CRC-bearing pieces (descriptors, central directory) are not compared: the digests
        already cover every tensor byte, and zlib's CRC-32 (~1 GiB/s per core) would make
        the restore measure the verifier rather than the storage."""
        for i, a, b in self._overlaps(off, len(data)):
            p = self.c.pieces[i]
            got = data[a - off:b - off]
            if p.kind == "tensor":
                if crc:
                    self.crcs[p.tensor] = zlib.crc32(got.data, self.crcs[p.tensor])
                self.hasher.update(self.job.regions[p.tensor].start + a - p.start, got)
                continue
            if p.kind != "fixed" and not crc:
                continue
            src = p.data if p.kind == "fixed" else self._dynamic(i)
            want = np.frombuffer(src, dtype=np.uint8)[a - p.start:b - p.start]
            if not np.array_equal(got, want):
                first = a + int(np.flatnonzero(got != want)[0])
                return (f"{self.job.key}: torch.save container bytes differ at offset {first} "
                        f"({p.kind})")
        return None


class TorchSaveFormat(RawFormat):
    """DLIO's torch.save files for the megatron-deepspeed layout, verified like raw."""

    name: ClassVar[str] = "torch-save"

    @classmethod
    def check(cls, plan: Plan, ranks: list[int], codec: CodecSpec) -> None:
        super().check(plan, ranks, codec)
        if plan.workload.parallel.layout != "megatron-deepspeed":
            raise SpecError(f"--format torch-save writes DLIO's files; allowed: workloads with "
                            f"layout = 'megatron-deepspeed' (this one: "
                            f"{plan.workload.parallel.layout!r})")

    def _containers(self, jobs: list[FileJob]) -> list[FileJob]:
        """The jobs with the containers' sizes; their layouts kept by plan file."""
        self._layout = {j.index: plan_container(self.plan, j.index, j.base) for j in jobs}
        return [replace(j, size=self._layout[j.index].size) for j in jobs]

    def job_bytes(self, job: FileJob) -> PlanBytes:
        return _Stream(job, self._layout[job.index], self.gen)

    def _locate(self, job: FileJob, region: Region) -> str:
        return (f"chunk {region.key} in {job.key}: tensor bytes differ (torch.save container, "
                f"tensor of {region.end - region.start} bytes)")

    def save(self, jobs: list[FileJob]) -> list[ThreadResult]:
        return super().save(self._containers(jobs))

    def restore(self, jobs: list[FileJob], manifest_key: str,
                planned: PlannedRestore | None = None) -> Restored:
        """Whole files only (a restore plan's chunks sit elsewhere in a container)."""
        if planned is not None:
            raise SpecError("--format torch-save cannot restore by a restore plan; allowed: "
                            "--restore-plan files")
        return super().restore(self._containers(jobs), manifest_key)
