"""The memory tier's copies: files in node-local shared memory that outlive the process.

A training process that crashes loses its own memory, not the node's tmpfs: a copy in
``/dev/shm`` (or ``--memory-dir``) is still there for the restarted process, as the node
copies of Gemini and NVIDIA's local checkpointing are. Layout, all created by the run and
removed by name:

  <memory_dir>/ckptbench-<run id>/node<N>/p<P>-ckpt<I>.bin          process P's own copy
  <memory_dir>/ckptbench-<run id>/node<N>/replica-p<P>-ckpt<I>.bin  a peer's replica of P

A copy is written under ``<name>.part`` and renamed once complete: a checkpoint in flight
(a node killed mid-write) is never taken for a held one. Writing into the file's mapping
(replicas arrive by ``recv_into`` it) keeps the bytes to one copy.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import stat
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from ckptbench.backends.filesystems import filesystem_info
from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.plan import Plan
from ckptbench.plan.tiers import TierPlan, plan_tiers
from ckptbench.runner.options import RunOptions
from ckptbench.runner.scheduler import slurm_node
from ckptbench.units import format_size

RUN_DIR_PREFIX = "ckptbench-"


def run_dir(memory_dir: str, run_id: str) -> Path:
    return Path(memory_dir) / f"{RUN_DIR_PREFIX}{run_id}"


def node_dir(memory_dir: str, run_id: str, node: int) -> Path:
    return run_dir(memory_dir, run_id) / f"node{node}"


def copy_name(proc: int, it: int, replica: bool = False) -> str:
    return f"{'replica-' if replica else ''}p{proc}-ckpt{it}.bin"


def make_dirs(memory_dir: str, run_id: str, node: int) -> None:
    """The run's directory (shared by the nodes of one host) and this node's."""
    run = run_dir(memory_dir, run_id)
    run.mkdir(mode=0o700, exist_ok=True)
    node_dir(memory_dir, run_id, node).mkdir(mode=0o700, exist_ok=True)


def open_copy(path: Path, nbytes: int) -> tuple[int, mmap.mmap | None]:
    """A new `<path>.part` of `nbytes`, mapped for writing (None for 0 bytes)."""
    part = path.with_name(path.name + ".part")
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        if nbytes:
            # Its pages taken now: a full tmpfs is an error here, not a SIGBUS at the
            # first write into the mapping (which kills the process).
            os.posix_fallocate(fd, 0, nbytes)
        return fd, mmap.mmap(fd, nbytes) if nbytes else None
    except BaseException as exc:
        os.close(fd)
        part.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise CkptbenchError(
                f"--memory-dir {part.parent.parent.parent}: no room for a copy of "
                f"{format_size(nbytes)} ({part.name}; something else filled it after the "
                "run's memory check); allowed: a directory with room, a larger --scale, "
                "fewer --peer-replicas") from None
        raise


def abandon_copy(path: Path, fd: int, mapped: mmap.mmap | None) -> None:
    """A copy that did not complete: its part removed (never held). A view into the map
    that a failed receive's traceback still holds keeps it open until that goes."""
    if mapped is not None:
        with contextlib.suppress(BufferError):
            mapped.close()
    os.close(fd)
    path.with_name(path.name + ".part").unlink(missing_ok=True)


class PreparedCopy:
    """A copy's file made and its pages allocated ahead (off the clock, as the pinned host
    buffers of local checkpointing are allocated once), so the timed part is the copy."""

    def __init__(self, path: Path, nbytes: int) -> None:
        self.path = path
        self.fd, self.mapped = open_copy(path, nbytes)
        self.view = (np.frombuffer(self.mapped, dtype=np.uint8) if self.mapped is not None
                     else np.empty(0, dtype=np.uint8))
        self.view.fill(0)

    def fill(self, data: np.ndarray) -> None:
        """`data` copied in and held (the part removed when that fails); the mapping
        stays until :meth:`release` (unmapping is bookkeeping, not the copy)."""
        try:
            np.copyto(self.view, data)
            self.commit()
        except BaseException:
            self.abandon()
            raise

    def commit(self) -> None:
        """Held: renamed to its name (tmpfs pages need no flush: the bytes are there)."""
        os.rename(self.path.with_name(self.path.name + ".part"), self.path)

    def release(self) -> None:
        """The view released, the file unmapped and closed (after the timed part)."""
        self.view = np.empty(0, dtype=np.uint8)
        if self.mapped is not None:
            self.mapped.close()
        os.close(self.fd)

    def abandon(self) -> None:
        self.view = np.empty(0, dtype=np.uint8)
        abandon_copy(self.path, self.fd, self.mapped)


def write_copy(path: Path, data: np.ndarray) -> None:
    """`data` (uint8) as the held copy at `path`: one copy into the file's mapping."""
    copy = PreparedCopy(path, data.nbytes)
    copy.fill(data)
    copy.release()


def touched(nbytes: int) -> np.ndarray:
    """`nbytes` of memory with every page faulted in (off the clock)."""
    out = np.empty(nbytes, dtype=np.uint8)
    out.fill(1)
    return out


def read_copy(path: Path, out: np.ndarray) -> None:
    """A held copy read into `out` (a restarted process's state, allocated before).

    The file is mapped with ``MAP_POPULATE`` (its page table filled in one call) and copied
    once in user space. On a tmpfs mounted with ``huge=always`` the mapping is 2 MiB pages
    and this ran at 0.82-0.86x a plain memcpy, 8 processes at once, where one ``read`` ran
    at 0.36-0.46x (the kernel copies 4 KiB at a time); on a 4 KiB-page tmpfs (``/dev/shm``
    here) both ran at 0.3-0.4x (benchmarks/results/2026-12-03-tier-speed.md)."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size != out.nbytes:
            raise OSError(f"{path}: {size} bytes, the shard has {out.nbytes}")
        if size == 0:
            return
        with mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                       prot=mmap.PROT_READ) as mapped:
            held = np.frombuffer(mapped, np.uint8)
            np.copyto(out.reshape(-1).view(np.uint8), held)
            del held  # the mapping closes only once no view of it is left


def mapped_copy(path: Path, need: int) -> tuple[mmap.mmap | None, np.ndarray]:
    """A held copy mapped for reading (``MAP_POPULATE``) and a view of it; OSError when
    it is shorter than `need` bytes. Close the map once the view is gone."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size < need:
            raise OSError(f"{path}: {size} bytes, the reads need {need}")
        if size == 0:
            return None, np.empty(0, dtype=np.uint8)
        mapped = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                           prot=mmap.PROT_READ)
    return mapped, np.frombuffer(mapped, np.uint8)


def read_ranges(path: Path, ranges: list[tuple[int, int, int]], out: np.ndarray) -> None:
    """Ranges (offset in the copy, bytes, offset in `out`) of a held copy into `out`: a
    restart onto another layout reads the chunks its load plan gives it. Only the span
    the ranges cover is mapped (``MAP_POPULATE``, as :func:`read_copy`): a process reads
    parts of other processes' copies."""
    ranges = [g for g in ranges if g[1]]
    if not ranges:
        return
    lo = min(at for at, _, _ in ranges) // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    hi = max(at + n for at, n, _ in ranges)
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size < hi:
            raise OSError(f"{path}: {size} bytes, the reads need {hi}")
        with mmap.mmap(f.fileno(), hi - lo, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                       prot=mmap.PROT_READ, offset=lo) as mapped:
            held = np.frombuffer(mapped, np.uint8)
            for at, n, dest in ranges:
                np.copyto(out[dest:dest + n], held[at - lo:at - lo + n])
            del held  # the mapping closes only once no view of it is left


def remove_names(paths: list[Path]) -> None:
    """Remove exactly these copies (and parts left by a failed write)."""
    for p in paths:
        p.unlink(missing_ok=True)
        p.with_name(p.name + ".part").unlink(missing_ok=True)


def remove_dirs(memory_dir: str, run_id: str, nodes: list[int]) -> None:
    """The run's directories, once empty (a directory with anything else stays)."""
    for n in nodes:
        with contextlib.suppress(OSError):
            node_dir(memory_dir, run_id, n).rmdir()
    with contextlib.suppress(OSError):
        run_dir(memory_dir, run_id).rmdir()


COPY_NAME = re.compile(r"(?:replica-)?p\d+-ckpt(\d+)\.bin(?:\.part)?")  # 1: the checkpoint
NODE_DIR = re.compile(r"node\d+")


def remove_run_copies(memory_dir: str, run_id: str) -> None:
    """Every copy of run `run_id` on this machine, by the names the run gives them, then its
    directories once empty: what a process killed outright (SIGKILL, a signal to the whole
    group) could not remove. The launcher calls it once its processes are gone, so a copy
    in tmpfs, which is host memory, never outlives the run. Links are removed, never
    followed; anything else in those directories stays."""
    run = run_dir(memory_dir, run_id)
    if not real_dir(run):
        return
    for node in os.listdir(run):
        path = run / node
        if not (NODE_DIR.fullmatch(node) and real_dir(path)):
            continue
        for name in os.listdir(path):
            if COPY_NAME.fullmatch(name):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    (path / name).unlink()
        with contextlib.suppress(OSError):
            path.rmdir()
    with contextlib.suppress(OSError):
        run.rmdir()


def real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


SHMEM_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")


def memory_pages(memory_dir: str) -> str:
    """The pages a copy in `memory_dir` is held in, as the report shows it: a restart maps
    the copy anew, and with 4 KiB pages building that mapping costs more than the copy
    (docs/tiers.md, "Limits"). tmpfs has 2 MiB pages when mounted with ``huge=always`` or
    ``within_size`` (a file of 2 MiB or more), or when the host forces them."""
    info = filesystem_info(memory_dir)
    fs = info.get("fs_type", "?")
    if fs == "hugetlbfs":
        return "hugetlbfs"
    if fs != "tmpfs":
        return f"{fs}, page cache"
    options = dict(o.partition("=")[::2] for o in info.get("super_options", "").split(","))
    huge = options.get("huge", "")
    if not huge:
        with contextlib.suppress(OSError):
            forced = re.search(r"\[(\w+)\]", SHMEM_ENABLED.read_text())
            huge = "force" if forced and forced.group(1) == "force" else ""
    if huge in ("always", "within_size", "force"):
        return f"tmpfs huge={huge}, 2 MiB pages"
    return "tmpfs, 4 KiB pages"


def free_bytes(memory_dir: str) -> int:
    st = os.statvfs(memory_dir)
    return st.f_bavail * st.f_frsize


def check_memory(tplan: TierPlan, proc_bytes: list[int], hosts: list[str],
                 free: int | None = None) -> None:
    """Before anything starts: the copies each node holds fit --memory-budget, and the
    nodes of each host fit what --memory-dir has free; one line naming the option."""
    spec = tplan.spec
    if not (spec.has("memory") or spec.has("peer")):
        return
    where = Path(spec.memory_dir)
    if not where.is_dir():
        raise SpecError(f"--memory-dir {spec.memory_dir}: not a directory; allowed: an existing "
                        "directory on node-local shared memory or tmpfs (default /dev/shm)")
    held = tplan.held_bytes(proc_bytes)
    free = free_bytes(spec.memory_dir) if free is None else free
    budget = spec.memory_budget or free
    busiest = max(range(len(held)), key=held.__getitem__)
    if held[busiest] > budget:
        given = (f"--memory-budget {format_size(spec.memory_budget)}" if spec.memory_budget else
                 f"--memory-budget (default: the {format_size(free)} --memory-dir "
                 f"{spec.memory_dir} has free)")
        raise SpecError(f"{given}: node {busiest} would hold {format_size(held[busiest])} "
                        f"(its copies and the replicas it keeps, 2 checkpoints each); allowed: "
                        "a larger --memory-budget, fewer --peer-replicas, a larger --scale")
    per_host: dict[str, int] = defaultdict(int)
    node_host = {tplan.node_of[p]: h for p, h in enumerate(hosts)}
    for n, h in node_host.items():
        per_host[h] += held[n]
    host = max(per_host, key=lambda h: per_host[h])
    if per_host[host] > free:
        raise SpecError(f"--memory-dir {spec.memory_dir}: the nodes on host {host} would hold "
                        f"{format_size(per_host[host])}, it has {format_size(free)} free; "
                        "allowed: a larger --scale, fewer --peer-replicas or nodes per host")


def place_tiers(options: RunOptions, plan: Plan, groups: list[list[int]], hosts: list[str]
                ) -> tuple[RunOptions, SpecError | None]:
    """The options with the tiers placed on the run's processes (plan.tiers) and their
    copies checked against the memory budget; or the one-line refusal."""
    try:
        tplan = plan_tiers(options.tiers, hosts, "slurm nodes" if slurm_node() else
                           "launcher hosts")
        if tplan is None:
            return options, None
        check_memory(tplan, [plan.bytes_of_ranks(g) for g in groups], hosts)
        w = plan.workload
        ran = sum(len(g) for g in groups)
        if options.uses_restore_plan and w.restore_parallel != w.parallel and ran < plan.world_size:
            raise SpecError(f"--tiers with --restore-layout {w.restore_parallel.label}: the "
                            f"restarts read chunks of every saved rank from the tiers, and "
                            f"this run saves {ran} of {plan.world_size}; allowed: every rank, "
                            "or the save's layout")
    except SpecError as exc:
        return options, exc
    return replace(options, tier_plan=tplan), None
