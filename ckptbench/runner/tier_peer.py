"""The peer tier's transport: TCP sockets between the run's processes.

Every process serves the replicas it holds: a sender's shard arrives by ``recv_into`` the
mapping of the replica's file in the holder's node directory (runner.tier_store: written
as a part, renamed when complete; every file reached through the directory's checked
descriptor), and a restarted process fetches it back the same way
into its new memory. The plain transfer that a replication is compared with sends the
same bytes to the same process over the same kind of connection, and the plain transfer
a fetch is compared with sends them back: both from and into memory of the shard's size
that is allocated and written before the clock starts (``PeerServer.lend``: the holder
process's own plain-copy memory), as the replicas' files and a restarted process's state
are; never a small reused buffer (it stays in the caches) nor fresh zeroed memory (it
reads the kernel's one zero page).

One request per connection, a fixed header: op, source process, checkpoint, bytes. A
restart onto another layout (runner.tier_reshard) asks for ranges of a copy (RANGES: the
holder node's own memory copy of the source process; REPLICA_RANGES: its replica;
PLAIN_RANGES: as many bytes of the plain-transfer memory, the baseline): the header, a
count, then (offset, bytes) per range; the holder answers the total (or MISSING) and sends
the ranges in order (``sendfile`` from the copy's file).

A process whose peer died (SIGKILL, OOM) sees its connection refused or cut: it raises
``PeerDied`` only once the dead process's launcher has reaped it (a process on the same
machine: /proc tells a dead one from a live one), so the run says which rank died and how,
as a plain run does, rather than "Connection refused".
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ckptbench.backends.owned_dirs import NotMade
from ckptbench.formats.base import everyone
from ckptbench.runner.tier_mpi import MpiPeers, node_local
from ckptbench.runner.tier_store import (
    Copy,
    PlainDir,
    PreparedCopy,
    copy_name,
    mapped_copy,
    open_held,
)

if TYPE_CHECKING:
    from ckptbench.plan.tiers import TierPlan
    from ckptbench.runner.comm import Comm

HEADER = struct.Struct("!BIIQ")  # op, source process, checkpoint, bytes
PUT, GET, SINK, SOURCE = 1, 2, 3, 4
RANGES, REPLICA_RANGES, PLAIN_RANGES = 5, 6, 7
RANGE = struct.Struct("!QQ")  # offset in the copy, bytes
COUNT = struct.Struct("!I")
MISSING = (1 << 64) - 1
CHUNK = 4 << 20
TIMEOUT_S = 600.0


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], min(CHUNK, len(view) - got))
        if n == 0:
            raise ConnectionError(f"the peer closed the connection after {got} of "
                                  f"{len(view)} bytes")
        got += n


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return bytes(buf)


class PeerServer:
    """This process's holder side: replicas in, replicas out, plain transfers discarded."""

    def __init__(self, directory: Path | PlainDir, bind: str | None = "127.0.0.1") -> None:
        """`directory`: the node's (runner.tier_store.NodeDir; a path: a test's own).
        `bind` None: no socket (another transport, MPI, carries the bytes; the replicas are
        still prepared, taken and held here)."""
        self.directory = directory if isinstance(directory, PlainDir) else PlainDir(directory)
        self.sock = socket.create_server((bind, 0)) if bind is not None else None
        self.port = self.sock.getsockname()[1] if self.sock is not None else 0
        self.held: list[Copy] = []  # every replica written (removed by name at the end)
        self.errors: list[str] = []
        self.prepared: dict[tuple[int, int], PreparedCopy] = {}
        self.plain = np.empty(0, dtype=np.uint8)  # the plain transfers' memory (lend)
        self._lock = threading.Lock()
        self._stop = False
        if self.sock is not None:
            threading.Thread(target=self._serve, name="peer-server", daemon=True).start()

    def _serve(self) -> None:
        assert self.sock is not None
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(TIMEOUT_S)
                op, src, it, nbytes = HEADER.unpack(_recv_exact(conn, HEADER.size))
                if op == PUT:
                    self._put(conn, src, it, nbytes)
                elif op == GET:
                    self._get(conn, src, it)
                elif op == SINK:
                    _recv_into(conn, self._plain(nbytes).data)
                    conn.sendall(b"\1")
                elif op == SOURCE:
                    conn.sendall(struct.pack("!Q", nbytes))
                    conn.sendall(self._plain(nbytes).data)
                elif op in (RANGES, REPLICA_RANGES, PLAIN_RANGES):
                    self._ranges(conn, op, src, it)
            except (OSError, struct.error, ConnectionError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def lend(self, memory: np.ndarray) -> None:
        """The plain transfers' memory (uint8, written before any clock starts, as large as
        any shard sent here). Concurrent plain transfers share it: what arrives is
        discarded, what leaves is never checked."""
        self.plain = memory

    def _plain(self, nbytes: int) -> np.ndarray:
        if self.plain.nbytes < nbytes:  # none lent: made here, inside the clock
            self.plain = np.ones(nbytes, dtype=np.uint8)
        return self.plain[:nbytes]

    def path(self, src: int, it: int) -> Copy:
        return self.directory / copy_name(src, it, replica=True)

    def prepare(self, src: int, it: int, nbytes: int) -> None:
        """src's replica of checkpoint `it` allocated ahead (off the clock)."""
        path = self.path(src, it)
        with self._lock:
            self.held.append(path)
            self.prepared[(src, it)] = PreparedCopy(path, nbytes)

    def take(self, src: int, it: int, nbytes: int) -> PreparedCopy:
        """src's replica of checkpoint `it` to be filled (prepared ahead, or made now),
        by a connection here or by another transport (MPI)."""
        with self._lock:
            copy = self.prepared.pop((src, it), None)
            if copy is None:
                self.held.append(self.path(src, it))
        return copy or PreparedCopy(self.path(src, it), nbytes)

    def _put(self, conn: socket.socket, src: int, it: int, nbytes: int) -> None:
        copy = self.take(src, it, nbytes)
        try:
            if copy.view.nbytes != nbytes:
                raise ConnectionError(f"a replica of {nbytes} bytes for a shard of "
                                      f"{copy.view.nbytes}")
            _recv_into(conn, copy.view.data)
            copy.commit()  # held only once every byte is in
        except BaseException:
            copy.abandon()
            raise
        try:
            conn.sendall(b"\1")
        finally:
            copy.release()

    def _get(self, conn: socket.socket, src: int, it: int) -> None:
        fd = open_held(self.path(src, it))
        if fd is None:
            conn.sendall(struct.pack("!Q", MISSING))
            return
        with open(fd, "rb", buffering=0) as f:
            conn.sendall(struct.pack("!Q", os.fstat(f.fileno()).st_size))
            conn.sendfile(f)

    def _ranges(self, conn: socket.socket, op: int, src: int, it: int) -> None:
        (count,) = COUNT.unpack(_recv_exact(conn, COUNT.size))
        raw = _recv_exact(conn, RANGE.size * count)
        ranges = [RANGE.unpack_from(raw, k * RANGE.size) for k in range(count)]
        end = max((at + n for at, n in ranges), default=0)
        total = sum(n for _, n in ranges)
        if op == PLAIN_RANGES:
            plain = self._plain(end)
            conn.sendall(struct.pack("!Q", total))
            for at, n in ranges:
                conn.sendall(plain[at:at + n].data)
            return
        path = (self.path(src, it) if op == REPLICA_RANGES
                else self.directory / copy_name(src, it))
        # Sent from the copy's mapping, as the baseline sends from memory: per range a
        # sendfile() measured 0.73-0.86x the plain transfer, where the whole copy's
        # sendfile (GET) keeps up.
        try:
            mapped, held = mapped_copy(path, end)
        except NotMade:
            raise
        except OSError:  # none held, or shorter than the ranges
            conn.sendall(struct.pack("!Q", MISSING))
            return
        try:
            conn.sendall(struct.pack("!Q", total))
            for at, n in ranges:
                conn.sendall(held[at:at + n].data)
        finally:
            del held
            if mapped is not None:
                mapped.close()

    def close(self) -> None:
        for copy in self.prepared.values():
            copy.abandon()
        self.prepared.clear()
        self._stop = True
        if self.sock is None:
            return
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


# The processes of this machine that this one reaches by TCP, by address: (process, pid,
# start time in /proc). A connection to one of them that fails because it died waits
# until its launcher has reaped it (the local launcher learns which rank died, and how,
# when it reaps it: runner.launch_local), then raises PeerDied, so the run reports the
# dead rank as a plain run does and not this process's "Connection refused".
_PEERS: dict[tuple[str, int], tuple[int, int, str]] = {}
REAP_WAIT_S = 10.0  # at most, for a dead peer to be reaped (then PeerDied all the same)


class PeerDied(ConnectionError):
    """The process at the other end of a peer connection has died."""


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of process `pid` (/proc/PID/stat); None: no such process, or
    no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None


def _watch_peers(comm: Comm, machines: list[str], addresses: list[tuple[str, int]]) -> None:
    """Collective: the processes on this machine, by their servers' addresses (none
    without /proc: their deaths cannot be told from other failures)."""
    pid = os.getpid()
    found = _stat(pid)
    ids = everyone(comm, (pid, found[1] if found else ""))
    here = machines[comm.rank]
    _PEERS.update({(a[0], a[1]): (p, peer, start) for p, (a, m, (peer, start))
                   in enumerate(zip(addresses, machines, ids, strict=True))
                   if m == here and start and p != comm.rank})


def _reaped(address: tuple[str, int]) -> bool:
    """Whether the process serving `address` has died: if so, once its launcher has
    reaped it (REAP_WAIT_S at most); False at once for a live or unknown one."""
    peer = _PEERS.get(address)
    if peer is None:
        return False
    _, pid, start = peer
    found = _stat(pid)
    if found is not None and found[1] == start and found[0] not in ("Z", "X"):
        return False  # alive: the connection failed for another reason
    deadline = time.monotonic() + REAP_WAIT_S
    while found is not None and found[1] == start and time.monotonic() < deadline:
        time.sleep(0.005)
        found = _stat(pid)
    return True


@contextlib.contextmanager
def _peer(address: tuple[str, int]) -> Iterator[None]:
    """Around a connection to the process at `address`: an error on it because that
    process died is PeerDied, raised once the process is reaped."""
    try:
        yield
    except OSError as exc:
        if not _reaped(address):
            raise
        raise PeerDied(f"peer process {_PEERS[address][0]} ({address[0]}:{address[1]}) died: "
                       f"{exc.strerror or exc}") from None


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def send(address: tuple[str, int], op: int, src: int, it: int, data: np.ndarray) -> None:
    """`data` to the holder at `address` (PUT: kept as src's replica; SINK: discarded);
    returns once the holder has every byte (its acknowledgement)."""
    with _peer(address), _connect(address) as sock:
        sock.sendall(HEADER.pack(op, src, it, data.nbytes))
        sock.sendall(data.data)
        if _recv_exact(sock, 1) != b"\1":
            raise ConnectionError("the holder did not acknowledge the replica")


def send_all(addresses: list[tuple[str, int]], op: int, src: int, it: int, data: np.ndarray
             ) -> None:
    """`data` to every holder at once (a thread each); the first error raised."""
    errors: list[BaseException] = []

    def one(address: tuple[str, int]) -> None:
        try:
            send(address, op, src, it, data)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(a,), daemon=True) for a in addresses]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def fetch(address: tuple[str, int], src: int, it: int, out: np.ndarray,
          op: int = GET) -> bool:
    """src's replica of checkpoint `it` from the holder at `address` into `out` (GET;
    SOURCE: as many bytes the holder makes up, the plain transfer); False when the holder
    has none."""
    with _peer(address), _connect(address) as sock:
        sock.sendall(HEADER.pack(op, src, it, out.nbytes))
        (nbytes,) = struct.unpack("!Q", _recv_exact(sock, 8))
        if nbytes == MISSING:
            return False
        if nbytes != out.nbytes:
            raise ConnectionError(f"the holder's replica has {nbytes} bytes, the shard "
                                  f"{out.nbytes}")
        _recv_into(sock, out.data)
        return True


def fetch_ranges(address: tuple[str, int], op: int, src: int, it: int,
                 ranges: list[tuple[int, int, int]], out: np.ndarray) -> bool:
    """Ranges (offset in the copy, bytes, offset in `out`) of src's copy of checkpoint
    `it` from the process at `address` (op: RANGES, REPLICA_RANGES or PLAIN_RANGES) into
    `out`, each where it goes; False when it holds no such copy."""
    total = sum(n for _, n, _ in ranges)
    with _peer(address), _connect(address) as sock:
        sock.sendall(HEADER.pack(op, src, it, total) + COUNT.pack(len(ranges))
                     + b"".join(RANGE.pack(at, n) for at, n, _ in ranges))
        (nbytes,) = struct.unpack("!Q", _recv_exact(sock, 8))
        if nbytes == MISSING:
            return False
        if nbytes != total:
            raise ConnectionError(f"the holder sends {nbytes} bytes, the ranges are {total}")
        for _, n, dest in ranges:
            _recv_into(sock, out[dest:dest + n].data)
        return True


class PeerLinks(NamedTuple):
    """How one process's replicas travel: by MPI point-to-point under an MPI launcher with
    ``--peer-transport auto`` (its server then opens no socket: nothing would connect to
    it), else by TCP to every process's server (`addresses`)."""

    server: PeerServer
    mpi: MpiPeers | None
    addresses: list[tuple[str, int]]
    transport: str  # as the tier records name it


def open_links(comm: Comm, tp: TierPlan, directory: PlainDir) -> PeerLinks:
    """Collective: this process's peer server (its replicas in `directory`) and how it
    reaches the others (runner.tiers, runner.async_peer)."""
    # Reached at the machine's name: a node is the scheduler's (comm.host()), and the
    # nodes Slurm emulates on one machine have names no resolver knows.
    machine = socket.gethostname()
    machines = everyone(comm, machine)
    if comm.kind == "mpi" and tp.spec.peer_transport == "auto":
        return PeerLinks(PeerServer(directory, None), MpiPeers(comm), [], node_local(machines))
    loopback = len(set(machines)) == 1
    server = PeerServer(directory, "127.0.0.1" if loopback else "0.0.0.0")
    addresses = everyone(comm, ("127.0.0.1" if loopback else machine, server.port))
    _watch_peers(comm, machines, addresses)
    return PeerLinks(server, None, addresses, "tcp-loopback" if loopback else "tcp")
