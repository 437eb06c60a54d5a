"""A rank's training state and its snapshot into staging memory: the blocking part of an
asynchronous checkpoint (``--mode async``).

* :class:`DeviceState`: the bytes of the process's files as the training loop holds them,
  job after job, filled with the checkpoint's payload off the clock. On the host
  (:class:`HostState`) or, where torch has CUDA, in GPU memory (:class:`CudaState`).
* Staging: host memory the snapshot is copied into (pinned with CUDA), at most
  ``--staging-memory``, allocated and touched once per run (as DCP keeps its pinned pool).
* :class:`FullSnapshot`: the state fits: one copy (memcpy or device-to-host), and only then
  does the persist read it, so the copy has the memory bandwidth to itself.
* :class:`PiecewiseSnapshot`: it does not fit: pieces, in the order the format's threads
  will ask for them, each handed over as soon as it is copied, into a ring of staging
  memory the persist frees as it goes; the loop waits for the pieces that do not fit.

Both snapshots are the format's :class:`~ckptbench.formats.base.PayloadSource`: the
persist takes its bytes from staging instead of generating them.
"""

from __future__ import annotations

import mmap
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import Any

import numpy as np

from ckptbench.errors import SpecError
from ckptbench.formats.base import FileJob
from ckptbench.formats.pipeline import aligned_buffer
from ckptbench.payload import ChunkHasher, PayloadGenerator

ALIGN = 4096  # each job starts on a page in the state (and the generator writes 8-byte words)


def _round(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def state_bytes(jobs: list[FileJob]) -> int:
    """The state's size: its jobs' bytes, each padded to a page (as DeviceState lays them)."""
    return sum(_round(max(job.size, 1)) for job in jobs)


def staging_bytes(state: int, asked: int) -> int:
    """Staging memory for a state of `state` bytes: `asked` (0: as much as the state),
    never more than the state (a larger pool would hold nothing more)."""
    return state if asked == 0 else min(asked, state)


class DeviceState(ABC):
    """One process's state: the bytes of its jobs (its plan ranks' files), laid out in a
    fixed order, and the staging memory its snapshots go to."""

    kind = "?"
    device: Any = None  # the torch device the state lives on (CudaState); None: the host

    def __init__(self, jobs: list[FileJob]) -> None:
        self.offsets: dict[int, int] = {}
        pos = 0
        for job in jobs:
            self.offsets[job.index] = pos
            pos += _round(max(job.size, 1))
        self.nbytes = pos  # with each job's padding to a page (state_bytes)
        self.payload_bytes = sum(j.size for j in jobs)
        self.staging = np.empty(0, dtype=np.uint8)

    def load(self, jobs: list[FileJob], gen: PayloadGenerator) -> dict[int, list[int]]:
        """Fill the state with the checkpoint's payload (off the clock: training would
        have changed every byte since the last one); return each file's chunk digests,
        against which the persisted snapshot is checked."""
        digests: dict[int, list[int]] = {}
        for job in jobs:
            host = self._host_view(job)
            gen.fill(job.base, job.regions, 0, host[:_round(job.size, 8)])
            hasher = ChunkHasher(job.regions)
            hasher.update(0, host[:job.size])
            digests[job.index] = hasher.digests()
            self._upload(job, host)
        return digests

    @abstractmethod
    def _host_view(self, job: FileJob) -> np.ndarray:
        """Host memory to generate a job's bytes into (the state itself on the host)."""

    def _upload(self, job: FileJob, host: np.ndarray) -> None:
        return None

    @abstractmethod
    def allocate_staging(self, nbytes: int) -> None:
        """Staging memory of `nbytes`, its pages faulted in now."""

    @abstractmethod
    def copy_out(self, start: int, nbytes: int, to: int) -> None:
        """State bytes [start, start + nbytes) to staging[to:], issued (see sync)."""

    def sync(self) -> None:
        """Wait for the copies issued (device-to-host copies are asynchronous)."""
        return None

    def copy_bandwidth(self, nbytes: int, repeats: int = 3) -> float:
        """Bytes/s of one copy of `nbytes` of the state into staging, the best of a few:
        the physical limit a snapshot is measured against."""
        nbytes = min(nbytes, self.nbytes, len(self.staging))
        if nbytes <= 0:
            return 0.0  # nothing to copy (a process without files)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.copy_out(0, nbytes, 0)
            self.sync()
            best = min(best, time.perf_counter() - t0)
        return nbytes / max(best, 1e-9)


class HostState(DeviceState):
    """The state in host memory (no GPU): the snapshot is a memcpy."""

    kind = "host"

    def __init__(self, jobs: list[FileJob]) -> None:
        super().__init__(jobs)
        self.buf = aligned_buffer(self.nbytes)

    def _host_view(self, job: FileJob) -> np.ndarray:
        o = self.offsets[job.index]
        return self.buf[o:o + _round(max(job.size, 1))]

    def allocate_staging(self, nbytes: int) -> None:
        self.staging = aligned_buffer(nbytes)
        self.staging[::mmap.PAGESIZE] = 0

    def copy_out(self, start: int, nbytes: int, to: int) -> None:
        np.copyto(self.staging[to:to + nbytes], self.buf[start:start + nbytes])


class CudaState(DeviceState):
    """The state as a CUDA tensor; staging is pinned host memory and the snapshot a
    device-to-host copy (torch is imported here only)."""

    kind = "cuda"

    def __init__(self, jobs: list[FileJob], device: int) -> None:
        import torch

        super().__init__(jobs)
        self.torch = torch
        self.device = torch.device("cuda", device)
        torch.cuda.set_device(self.device)
        self.dev = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        self._bounce = np.empty(0, dtype=np.uint8)
        self._staging_t: Any = None

    def _host_view(self, job: FileJob) -> np.ndarray:
        size = _round(max(job.size, 1))
        if len(self._bounce) < size:
            self._bounce = aligned_buffer(size)
        return self._bounce[:size]

    def _upload(self, job: FileJob, host: np.ndarray) -> None:
        o = self.offsets[job.index]
        self.dev[o:o + len(host)].copy_(self.torch.from_numpy(host))
        self.torch.cuda.synchronize(self.device)

    def allocate_staging(self, nbytes: int) -> None:
        self._staging_t = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)
        self.staging = self._staging_t.numpy()
        self.staging[::mmap.PAGESIZE] = 0

    def copy_out(self, start: int, nbytes: int, to: int) -> None:
        self._staging_t[to:to + nbytes].copy_(self.dev[start:start + nbytes], non_blocking=True)

    def sync(self) -> None:
        self.torch.cuda.current_stream(self.device).synchronize()


def cuda_available() -> bool:
    """torch is installed and sees a GPU (asked in the rank process: CUDA and fork do
    not mix, so the parent never initializes it)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def open_state(device: str, jobs: list[FileJob], local_index: int) -> DeviceState:
    """The state on `device` (auto: CUDA where torch has it, else the host)."""
    if device == "cuda" or (device == "auto" and cuda_available()):
        if not cuda_available():
            raise SpecError("--state-device cuda: torch with CUDA is not available here; "
                            "allowed: auto, host")
        import torch

        return CudaState(jobs, local_index % torch.cuda.device_count())
    return HostState(jobs)


class FullSnapshot:
    """The whole state copied into staging at once; the persist (started before, so its
    set-up overlaps the copy) reads nothing until the copy is complete."""

    prefill = False

    def __init__(self, state: DeviceState) -> None:
        self.state = state
        self.ready = threading.Event()
        self.stopped = False

    def take(self) -> None:
        """The blocking copy (main thread)."""
        self.state.copy_out(0, self.state.nbytes, 0)
        self.state.sync()
        self.ready.set()

    def expect(self, threads: list[list[FileJob]], block: int) -> None:
        return None

    def fill(self, job: FileJob, offset: int, out: np.ndarray) -> None:
        self.ready.wait()
        if self.stopped:
            raise RuntimeError("the snapshot was stopped")
        start = self.state.offsets[job.index] + offset
        n = max(0, min(len(out), job.size - offset))
        out[:n] = self.state.staging[start:start + n]
        out[n:] = 0

    def finish(self, jobs: list[FileJob]) -> None:
        return None

    def stop(self) -> None:
        if not self.ready.is_set():
            self.stopped = True
            self.ready.set()


class _Ring:
    """Contiguous pieces in a circular buffer of `capacity` bytes, allocated in order and
    released in any order (space comes back once the oldest piece is released)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.head = 0  # absolute position of the next piece
        self.live: deque[list[int]] = deque()  # [start, end, released]

    def alloc(self, n: int) -> int | None:
        start = self.head
        if start % self.capacity + n > self.capacity:  # no room before the end: wrap
            start += self.capacity - start % self.capacity
        tail = self.live[0][0] if self.live else start  # the oldest byte still held
        if start + n - tail > self.capacity:
            return None
        self.live.append([start, start + n, 0])
        self.head = start + n
        return start

    def release(self, start: int) -> None:
        for entry in self.live:
            if entry[0] == start and not entry[2]:
                entry[2] = 1
                break
        while self.live and self.live[0][2]:
            self.live.popleft()


class PiecewiseSnapshot:
    """The state copied piece by piece through a ring of staging memory smaller than
    it: pieces are staged in the order the format's threads read them (round robin over
    the threads, each thread's in its own order, so every staged piece is the next one
    some thread takes: no deadlock) and freed once read."""

    prefill = False

    def __init__(self, state: DeviceState) -> None:
        self.state = state
        self.capacity = len(state.staging)
        self.cv = threading.Condition()
        self.order: list[tuple[int, int, int]] | None = None  # (file, offset, bytes)
        self.staged: dict[tuple[int, int], int] = {}  # piece -> absolute ring position
        self.abandoned: set[int] = set()  # files whose thread stopped early
        self.stopped = False
        self.ring = _Ring(self.capacity)

    def expect(self, threads: list[list[FileJob]], block: int) -> None:
        if block > self.capacity:
            raise SpecError(f"--staging-memory {self.capacity} B holds no {block} B block; "
                            "allowed: at least one --block-size")
        lanes = [[(j.index, off, min(block, j.size - off)) for j in jobs
                  for off in range(0, j.size, block)] for jobs in threads]
        order = [lane[i] for i in range(max(map(len, lanes), default=0))
                 for lane in lanes if i < len(lane)]
        with self.cv:
            self.order = order
            self.cv.notify_all()

    def take(self) -> None:
        """The blocking copy (main thread): returns once every piece is in staging (or
        the persist stopped)."""
        with self.cv:
            while self.order is None and not self.stopped:
                self.cv.wait()
            order = self.order or []
        for f, off, n in order:
            with self.cv:
                if f in self.abandoned:
                    continue
                pos = self.ring.alloc(n)
                while pos is None and not self.stopped:
                    self.cv.wait()
                    pos = self.ring.alloc(n)
                if pos is None:  # stopped
                    return
            self.state.copy_out(self.state.offsets[f] + off, n, pos % self.capacity)
            self.state.sync()
            with self.cv:
                if f in self.abandoned:
                    self.ring.release(pos)
                else:
                    self.staged[(f, off)] = pos
                self.cv.notify_all()

    def fill(self, job: FileJob, offset: int, out: np.ndarray) -> None:
        key = (job.index, offset)
        with self.cv:
            while key not in self.staged and not self.stopped:
                self.cv.wait()
            if self.stopped:
                raise RuntimeError("the snapshot was stopped")
            pos = self.staged.pop(key)
        n = max(0, min(len(out), job.size - offset))
        at = pos % self.capacity
        out[:n] = self.state.staging[at:at + n]
        out[n:] = 0
        with self.cv:
            self.ring.release(pos)
            self.cv.notify_all()

    def finish(self, jobs: list[FileJob]) -> None:
        """A thread is done: pieces of its files still staged are dropped, the ones not
        yet staged skipped (it stopped early; the checkpoint fails anyway)."""
        with self.cv:
            for job in jobs:
                self.abandoned.add(job.index)
            for key in [k for k in self.staged if k[0] in self.abandoned]:
                self.ring.release(self.staged.pop(key))
            self.cv.notify_all()

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()
