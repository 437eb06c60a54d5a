"""The memory tier's copies: files in node-local shared memory that outlive the process.

A training process that crashes loses its own memory, not the node's tmpfs: a copy in
``/dev/shm`` (or ``--memory-dir``) is still there for the restarted process, as the node
copies of Gemini and NVIDIA's local checkpointing are. Layout, all created by the run:

  <memory_dir>/ckptbench-<run id>-<random>/node<N>/p<P>-ckpt<I>.bin          P's own copy
  <memory_dir>/ckptbench-<run id>-<random>/node<N>/replica-p<P>-ckpt<I>.bin  a peer's of P

The run's directory is kept as the target's run directory is (backends.owned_dirs): the
memory directory is usually ``/dev/shm``, where every user may write, and a run id is
predictable (its second and process id). So the name has 16 random hex digits as well, and
the directory is made exclusively, mode 0700: a name already taken (a directory, a link) is
refused in one line, never used. Its node directories are made exclusively inside it (0700).
Each is identified (device and inode) when made, and every file below it is then made,
opened, renamed or removed relative to a descriptor of its node's directory, opened without
following a link and checked to be that directory (:class:`NodeDir`): a directory swapped
for a link or for another directory is refused in one line naming it, never followed.
Nothing is removed through a link or in a directory the run did not make, nor a file
another user owns. The directory is recorded where the run's copies are found again: the
results' ``tier_held`` records and a ``--keep-tiers`` run's ``tier_dirs`` record
(runner.tier_relaunch) and, for the launcher's sweep after its processes ended, a page it
shares with them (:func:`remove_run_copies`).

A copy is written under ``<name>.part`` and renamed once complete: a checkpoint in flight
(a node killed mid-write) is never taken for a held one. Writing into the file's mapping
(replicas arrive by ``recv_into`` it) keeps the bytes to one copy.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import re
import secrets
import socket
import stat
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptbench.backends.base import Identity
from ckptbench.backends.filesystems import filesystem_info
from ckptbench.backends.owned_dirs import (
    NotMade,
    identity_of,
    make_dir_in,
    open_dir_in,
    open_recorded,
    same,
    unlink_own,
)
from ckptbench.errors import BackendError, CkptbenchError, SpecError, describe_error
from ckptbench.formats.base import everyone
from ckptbench.plan import Plan
from ckptbench.plan.tiers import TierPlan, plan_tiers
from ckptbench.runner.options import RunOptions
from ckptbench.runner.scheduler import slurm_node
from ckptbench.units import format_size

if TYPE_CHECKING:
    from ckptbench.runner.comm import Comm

RUN_DIR_PREFIX = "ckptbench-"
TOKEN_BYTES = 8  # the random part of the run directory's name: 16 hex digits
COPY_NAME = re.compile(r"(?:replica-)?p\d+-ckpt(\d+)\.bin(?:\.part)?")  # 1: the checkpoint
NODE_DIR = re.compile(r"node(\d+)")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE = os.O_NOFOLLOW | os.O_CLOEXEC


def run_dir_name(run_id: str, token: str) -> str:
    return f"{RUN_DIR_PREFIX}{run_id}-{token}"


def is_run_dir_name(name: str, run_id: str) -> bool:
    """`name` is one a run with `run_id` gives its directory under --memory-dir."""
    return re.fullmatch(re.escape(f"{RUN_DIR_PREFIX}{run_id}-") + f"[0-9a-f]{{{2 * TOKEN_BYTES}}}",
                        name) is not None


def node_dir(memory_dir: str, run_dir: str, node: int) -> Path:
    """Where node `node`'s directory is in the run directory named `run_dir`."""
    return Path(memory_dir) / run_dir / f"node{node}"


def copy_name(proc: int, it: int, replica: bool = False) -> str:
    return f"{'replica-' if replica else ''}p{proc}-ckpt{it}.bin"


# --- the directories ---
class PlainDir:
    """A directory given by its path and opened as given: a tool's or a test's own. A run's
    copies are always in a :class:`NodeDir`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, PlainDir) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    @property
    def memory_dir(self) -> Path:
        """The --memory-dir a copy here is in (<memory dir>/<run>/<node>/<copy>)."""
        return self.path.parent.parent

    def open(self) -> int:
        """A descriptor of the directory (the caller closes it)."""
        return os.open(self.path, _DIR)

    @contextlib.contextmanager
    def fd(self) -> Iterator[int]:
        fd = self.open()
        try:
            yield fd
        finally:
            os.close(fd)

    def __truediv__(self, name: str) -> Copy:
        return Copy(self, name)


HostDirs = tuple[Identity, dict[int, Identity]]  # one host's run directory, its node dirs


@dataclass(frozen=True)
class RunDir:
    """The run's directory under --memory-dir on this host as it was made: its name, its
    identity and its node directories' (`hosts`: every host's, as the results record)."""

    memory_dir: str
    name: str
    ident: Identity
    nodes: Mapping[int, Identity]
    hosts: tuple[HostDirs, ...] = ()

    @property
    def path(self) -> Path:
        return Path(self.memory_dir) / self.name

    def open(self) -> int:
        """The run's directory, opened in --memory-dir (itself as given) without following a
        link, and only if it is the one made: NotMade naming it otherwise. Close it."""
        parent = os.open(self.memory_dir, _DIR)
        try:
            return open_recorded(parent, self.name, self.ident, self.path)
        finally:
            os.close(parent)

    def node(self, node: int) -> NodeDir:
        ident = self.nodes.get(node)
        if ident is None:
            raise NotMade(node_dir(self.memory_dir, self.name, node), "not made on this host")
        return NodeDir(self, node, ident)

    def remove_node(self, node: int) -> None:
        """Node `node`'s directory once empty, then the run's once every node's is gone:
        each only while it is the one made."""
        ident = self.nodes.get(node)
        with contextlib.suppress(OSError):
            top = self.open()
            try:
                if ident is not None:
                    os.close(open_recorded(top, f"node{node}", ident,
                                           node_dir(self.memory_dir, self.name, node)))
                    os.rmdir(f"node{node}", dir_fd=top)
            finally:
                os.close(top)
        self.remove_if_empty()

    def remove_if_empty(self) -> None:
        with contextlib.suppress(OSError):
            parent = os.open(self.memory_dir, _DIR)
            try:
                os.close(open_recorded(parent, self.name, self.ident, self.path))
                os.rmdir(self.name, dir_fd=parent)
            finally:
                os.close(parent)

    def record(self) -> dict[str, Any]:
        """Its name and every host's identities, as the results keep them (``tier_held``)."""
        return {"memory_run_dir": self.name,
                "memory_dirs": [[*ident, {str(n): list(i) for n, i in nodes.items()}]
                                for ident, nodes in self.hosts]}

    @classmethod
    def found(cls, memory_dir: str, name: str, hosts: Sequence[HostDirs]) -> RunDir | None:
        """The run directory `name` in `memory_dir` as one host of `hosts` made it; None
        when there is none at that name; NotMade when something else is there."""
        path = Path(memory_dir) / name
        try:
            parent = os.open(memory_dir, _DIR)
        except FileNotFoundError:  # the memory directory is gone, and the run's with it
            return None
        try:
            try:
                fd = open_dir_in(parent, name, path)
            except NotMade as exc:
                if exc.why == "gone":
                    return None
                raise
            try:
                here = identity_of(fd)
            finally:
                os.close(fd)
        finally:
            os.close(parent)
        for ident, nodes in hosts:
            if same(here, ident):
                return cls(memory_dir, name, ident, nodes, tuple(hosts))
        raise NotMade(path, "another directory in its place")


def recorded_dirs(rec: Mapping[str, Any], run_id: str) -> tuple[str, tuple[HostDirs, ...]] | None:
    """The run directory's name and every host's identities as :meth:`RunDir.record` wrote
    them in `rec`; None where `rec` has none of a run `run_id`'s, or not in that shape."""
    name, dirs = rec.get("memory_run_dir"), rec.get("memory_dirs")
    if not isinstance(name, str) or not is_run_dir_name(name, run_id) or not isinstance(dirs, list):
        return None

    def ident(v: Any) -> Identity | None:
        return (v[0], v[1]) if isinstance(v, list) and len(v) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in v) else None

    hosts: list[HostDirs] = []
    for entry in dirs:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], dict)):
            return None
        top = ident(entry[:2])
        nodes = {int(n): ident(v) for n, v in entry[2].items() if n.isdigit() and len(n) < 10}
        if top is None or len(nodes) != len(entry[2]) or None in nodes.values():
            return None
        hosts.append((top, {n: i for n, i in nodes.items() if i is not None}))
    return name, tuple(hosts)


class NodeDir(PlainDir):
    """Node `node`'s directory in the run's, as made: every file in it is made, opened,
    renamed or removed relative to a descriptor of it opened by :meth:`open` (the run's
    directory, then its own, neither through a link, each checked to be the one made)."""

    def __init__(self, run: RunDir, node: int, ident: Identity) -> None:
        super().__init__(node_dir(run.memory_dir, run.name, node))
        self.run, self.node, self.ident = run, node, ident

    @property
    def memory_dir(self) -> Path:
        return Path(self.run.memory_dir)

    def open(self) -> int:
        top = self.run.open()
        try:
            return open_recorded(top, f"node{self.node}", self.ident, self.path)
        finally:
            os.close(top)


def make_run_dir(comm: Comm, tp: TierPlan, run_id: str) -> RunDir:
    """Collective: the run's directory under --memory-dir, its name's random part drawn by
    process 0, and in it the directories of the nodes of each host, made by the host's
    first process (the others wait for it); or, on every process, the one-line error of
    the first that could not be made (a name taken is never used)."""
    memory_dir = tp.spec.memory_dir
    token = comm.bcast(secrets.token_hex(TOKEN_BYTES) if comm.rank == 0 else "")
    name = run_dir_name(run_id, token)
    machine = socket.gethostname()  # the hosts' memory: emulated nodes share one machine's
    machines = everyone(comm, machine)
    made: HostDirs | None = None
    error: str | None = None
    if machines.index(machine) == comm.rank:
        here = sorted({tp.node_of[p] for p, m in enumerate(machines) if m == machine})
        try:
            made = _make(memory_dir, name, here)
        except (OSError, CkptbenchError) as exc:
            error = str(exc) if isinstance(exc, CkptbenchError) else \
                f"--memory-dir {memory_dir}: {describe_error(exc)[1]}"
    results = everyone(comm, (machine, made, error))
    first = next((e for _, _, e in results if e), None)
    hosts = tuple(m for _, m, _ in results if m is not None)
    if first is not None:
        if made is not None:  # made here, empty: removed
            with contextlib.suppress(OSError):
                remove_copies(RunDir(memory_dir, name, made[0], made[1], hosts))
        raise BackendError(first)
    ident, nodes = next(m for h, m, _ in results if h == machine and m is not None)
    run = RunDir(memory_dir, name, ident, nodes, hosts)
    if made is not None:
        _note(run_id, run)
    return run


def _make(memory_dir: str, name: str, nodes: list[int]) -> HostDirs:
    """The run's directory and its `nodes`' in it, made exclusively (mode 0700)."""
    path = Path(memory_dir) / name
    parent = os.open(memory_dir, _DIR)
    try:
        ident = make_dir_in(parent, name, path, 0o700)
        top = open_recorded(parent, name, ident, path)
        made: dict[int, Identity] = {}
        try:
            for n in nodes:
                made[n] = make_dir_in(top, f"node{n}", path / f"node{n}", 0o700)
        except BaseException:
            for n in made:
                with contextlib.suppress(OSError):
                    os.rmdir(f"node{n}", dir_fd=top)
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=parent)
            raise
        finally:
            os.close(top)
        return ident, made
    finally:
        os.close(parent)


# The launcher's sweep (remove_run_copies, once its processes are gone) learns the
# directory its forked processes made from this page, shared with them (anonymous and
# shared: made before they fork). Under MPI each rank has its own, and the launcher sweeps
# nothing. Too many nodes to note on one host: nothing noted, nothing swept.
NOTE_BYTES = 1 << 20
_NOTE = mmap.mmap(-1, NOTE_BYTES)


def _note(run_id: str, run: RunDir) -> None:
    data = json.dumps({"run_id": run_id, "memory_dir": run.memory_dir,
                       **replace(run, hosts=((run.ident, dict(run.nodes)),)).record()}).encode()
    if len(data) <= NOTE_BYTES - 8:
        _NOTE[8:8 + len(data)] = data
        _NOTE[:8] = len(data).to_bytes(8, "little")


def _noted(memory_dir: str, run_id: str) -> tuple[str, tuple[HostDirs, ...]] | None:
    size = int.from_bytes(_NOTE[:8], "little")
    try:
        rec = json.loads(_NOTE[8:8 + min(size, NOTE_BYTES - 8)]) if size else None
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.get("run_id") != run_id \
            or rec.get("memory_dir") != memory_dir:
        return None
    return recorded_dirs(rec, run_id)


def remove_run_copies(memory_dir: str, run_id: str) -> None:
    """Every copy of run `run_id` its processes left on this machine: what a process killed
    outright (SIGKILL, a signal to the whole group) could not remove. The launcher calls it
    once its processes are gone, so a copy in tmpfs, which is host memory, never outlives
    the run; only in the directories they made (noted for it), as :func:`remove_copies`."""
    noted = _noted(memory_dir, run_id)
    if noted is None:
        return
    with contextlib.suppress(OSError):
        run = RunDir.found(memory_dir, *noted)
        if run is not None:
            remove_copies(run)


def remove_copies(run: RunDir) -> list[str]:
    """Every copy in the run's node directories on this host, by the names the run gives
    them (parts too), wherever in the run's directory a node's directory was moved to (it
    is found by its identity); then those directories and the run's once empty. Left alone:
    a directory at a node's name that is not the one made (a link, another directory:
    each named in the lines returned), anything else, any file another user owns. NotMade
    when the run's directory itself is not the one made."""
    refused: list[str] = []
    top = run.open()
    try:
        for entry in sorted(os.listdir(top)):
            m = NODE_DIR.fullmatch(entry)
            try:
                if m and int(m.group(1)) in run.nodes:
                    fd = open_recorded(top, entry, run.nodes[int(m.group(1))], run.path / entry)
                else:
                    try:
                        fd = open_dir_in(top, entry, run.path / entry)
                    except OSError:
                        continue  # a file, a link: not the run's to touch
                    if not any(same(identity_of(fd), i) for i in run.nodes.values()):
                        os.close(fd)
                        continue  # not one the run made
            except NotMade as exc:
                refused.append(str(exc))
                continue
            try:
                for name in os.listdir(fd):
                    if COPY_NAME.fullmatch(name):
                        with contextlib.suppress(OSError):
                            unlink_own(fd, name)
            finally:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.rmdir(entry, dir_fd=top)
    finally:
        os.close(top)
    run.remove_if_empty()
    return refused


def copies_on_disk(run: RunDir) -> list[str]:
    """The names of the copies (and parts) in the run's node directories on this host, as
    :func:`remove_copies` finds them."""
    found: list[str] = []
    top = run.open()
    try:
        for n, ident in run.nodes.items():
            try:
                fd = open_recorded(top, f"node{n}", ident, run.path / f"node{n}")
            except NotMade as exc:
                if exc.why == "gone":  # nothing left there
                    continue
                raise
            try:
                found += [f for f in os.listdir(fd) if COPY_NAME.fullmatch(f)]
            finally:
                os.close(fd)
    finally:
        os.close(top)
    return found


# --- the copies ---
@dataclass(frozen=True)
class Copy:
    """A copy's file: its name in its directory, through whose descriptor every operation
    on it goes."""

    where: PlainDir
    name: str

    @property
    def path(self) -> Path:
        return self.where.path / self.name

    def __str__(self) -> str:
        return str(self.path)


def as_copy(path: Path | Copy) -> Copy:
    """A copy given by its path (a tool's or a test's own directory) or in a run's."""
    return path if isinstance(path, Copy) else Copy(PlainDir(path.parent), path.name)


def _open_part(dir_fd: int, copy: Copy, nbytes: int) -> tuple[int, mmap.mmap | None]:
    part = copy.name + ".part"
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FILE, 0o600, dir_fd=dir_fd)
    try:
        os.ftruncate(fd, nbytes)
        if nbytes:
            # Its pages taken now: a full tmpfs is an error here, not a SIGBUS at the
            # first write into the mapping (which kills the process).
            os.posix_fallocate(fd, 0, nbytes)
        return fd, mmap.mmap(fd, nbytes) if nbytes else None
    except BaseException as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(part, dir_fd=dir_fd)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise CkptbenchError(
                f"--memory-dir {copy.where.memory_dir}: no room for a copy of "
                f"{format_size(nbytes)} ({part}; something else filled it after the "
                "run's memory check); allowed: a directory with room, a larger --scale, "
                "fewer --peer-replicas") from None
        raise


def open_copy(path: Path | Copy, nbytes: int) -> tuple[int, mmap.mmap | None]:
    """A new `<path>.part` of `nbytes`, mapped for writing (None for 0 bytes)."""
    copy = as_copy(path)
    with copy.where.fd() as d:
        return _open_part(d, copy, nbytes)


class PreparedCopy:
    """A copy's file made and its pages allocated ahead (off the clock, as the pinned host
    buffers of local checkpointing are allocated once), so the timed part is the copy. Its
    directory stays open from then on (checked when opened): the copy is held, or its
    part removed, in that directory whatever its path leads to by then."""

    def __init__(self, path: Path | Copy, nbytes: int) -> None:
        self.copy = as_copy(path)
        self.path = self.copy.path
        self.dir_fd = self.copy.where.open()
        try:
            self.fd, self.mapped = _open_part(self.dir_fd, self.copy, nbytes)
        except BaseException:
            os.close(self.dir_fd)
            raise
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
        os.rename(self.copy.name + ".part", self.copy.name, src_dir_fd=self.dir_fd,
                  dst_dir_fd=self.dir_fd)

    def _close(self) -> None:
        for fd in (self.fd, self.dir_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.dir_fd = -1

    def release(self) -> None:
        """The view released, the file unmapped and closed (after the timed part)."""
        self.view = np.empty(0, dtype=np.uint8)
        if self.mapped is not None:
            self.mapped.close()
        self._close()

    def abandon(self) -> None:
        """A copy that did not complete: its part removed (never held). A view into the map
        that a failed receive's traceback still holds keeps it open until that goes."""
        self.view = np.empty(0, dtype=np.uint8)
        if self.mapped is not None:
            with contextlib.suppress(BufferError):
                self.mapped.close()
        if self.dir_fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.copy.name + ".part", dir_fd=self.dir_fd)
        self._close()


def write_copy(path: Path | Copy, data: np.ndarray) -> None:
    """`data` (uint8) as the held copy at `path`: one copy into the file's mapping."""
    copy = PreparedCopy(path, data.nbytes)
    copy.fill(data)
    copy.release()


def touched(nbytes: int) -> np.ndarray:
    """`nbytes` of memory with every page faulted in (off the clock)."""
    out = np.empty(nbytes, dtype=np.uint8)
    out.fill(1)
    return out


def _open_held(copy: Copy) -> int:
    """A descriptor to read the held copy by (never through a link; OSError when it is
    absent or no regular file; NotMade when its directory is not the run's)."""
    with copy.where.fd() as d:
        try:
            fd = os.open(copy.name, os.O_RDONLY | os.O_NONBLOCK | _FILE, dir_fd=d)
        except OSError as exc:  # named by its whole path
            raise OSError(exc.errno, exc.strerror, str(copy.path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(copy.path))
    return fd


def open_held(path: Path | Copy) -> int | None:
    """A descriptor to read the held copy at `path` by; None when there is none (absent, or
    something else at its name); NotMade when its directory is not the run's."""
    try:
        return _open_held(as_copy(path))
    except NotMade:
        raise
    except OSError:
        return None


def held_size(path: Path | Copy) -> int:
    """The bytes of the held copy at `path` (OSError when there is none)."""
    fd = _open_held(as_copy(path))
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_copy(path: Path | Copy, out: np.ndarray) -> None:
    """A held copy read into `out` (a restarted process's state, allocated before).

    The file is mapped with ``MAP_POPULATE`` (its page table filled in one call) and copied
    once in user space. On a tmpfs mounted with ``huge=always`` the mapping is 2 MiB pages
    and this ran at 0.82-0.86x a plain memcpy, 8 processes at once, where one ``read`` ran
    at 0.36-0.46x (the kernel copies 4 KiB at a time); on a 4 KiB-page tmpfs (``/dev/shm``
    here) both ran at 0.3-0.4x (benchmarks/results/2026-12-03-tier-speed.md)."""
    copy = as_copy(path)
    with open(_open_held(copy), "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size != out.nbytes:
            raise OSError(f"{copy.path}: {size} bytes, the shard has {out.nbytes}")
        if size == 0:
            return
        with mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                       prot=mmap.PROT_READ) as mapped:
            held = np.frombuffer(mapped, np.uint8)
            np.copyto(out.reshape(-1).view(np.uint8), held)
            del held  # the mapping closes only once no view of it is left


def mapped_copy(path: Path | Copy, need: int) -> tuple[mmap.mmap | None, np.ndarray]:
    """A held copy mapped for reading (``MAP_POPULATE``) and a view of it; OSError when
    it is shorter than `need` bytes. Close the map once the view is gone."""
    copy = as_copy(path)
    with open(_open_held(copy), "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size < need:
            raise OSError(f"{copy.path}: {size} bytes, the reads need {need}")
        if size == 0:
            return None, np.empty(0, dtype=np.uint8)
        mapped = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                           prot=mmap.PROT_READ)
    return mapped, np.frombuffer(mapped, np.uint8)


def read_ranges(path: Path | Copy, ranges: list[tuple[int, int, int]], out: np.ndarray
                ) -> None:
    """Ranges (offset in the copy, bytes, offset in `out`) of a held copy into `out`: a
    restart onto another layout reads the chunks its load plan gives it. Only the span
    the ranges cover is mapped (``MAP_POPULATE``, as :func:`read_copy`): a process reads
    parts of other processes' copies."""
    ranges = [g for g in ranges if g[1]]
    if not ranges:
        return
    copy = as_copy(path)
    lo = min(at for at, _, _ in ranges) // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    hi = max(at + n for at, n, _ in ranges)
    with open(_open_held(copy), "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size < hi:
            raise OSError(f"{copy.path}: {size} bytes, the reads need {hi}")
        with mmap.mmap(f.fileno(), hi - lo, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                       prot=mmap.PROT_READ, offset=lo) as mapped:
            held = np.frombuffer(mapped, np.uint8)
            for at, n, dest in ranges:
                np.copyto(out[dest:dest + n], held[at - lo:at - lo + n])
            del held  # the mapping closes only once no view of it is left


def remove_names(paths: Sequence[Path | Copy]) -> None:
    """Remove exactly these copies (and parts left by a failed write), in their directory
    (NotMade when it is not the run's), never another user's file."""
    for p in paths:
        copy = as_copy(p)
        with copy.where.fd() as d:
            unlink_own(d, copy.name)
            unlink_own(d, copy.name + ".part")


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
