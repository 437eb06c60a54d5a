"""A real GlusterFS on this machine for tests and benchmarks: glusterd, distributed volumes
over bricks in a temporary directory, FUSE mounts (not a mock).

`GlusterServer().start()` runs `glusterd` in the foreground with a working directory, a
run directory and a CLI socket of its own (nothing under /var/lib/glusterd), bound to one
loopback address: Gluster refuses 127.0.0.1 and localhost as a brick host, and its bricks
find glusterd on port 24007 of the brick host, so each server takes the first address
127.0.1.N whose port 24007 is free (several servers can run side by side).
`create_volume()` makes and starts a distributed volume of N bricks (optionally with the
shard translator, Gluster's striping), `mount()` runs a FUSE client in the foreground.

`stop()` ends what this object started and nothing else: the FUSE clients (unmounted,
then their processes), its volumes (stopped, deleted), the brick processes by the pid
files in its own run directory (only a pid whose command line names that directory), and
glusterd; then it removes its directories and its bricks' logs. Needs root and /dev/fuse
(:func:`unavailable` says why not, in one line).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from ckptbench.backends.striping import gluster_shard_block_size
from harness import processes
from harness.gluster_mounts import bricks_connected, is_mounted
from harness.processes import ToolError

GLUSTERD_PORT = 24007  # where bricks and clients ask glusterd (not configurable for bricks)
BRICK_LOGS = Path("/var/log/glusterfs/bricks")
STATEDUMPS = Path("/var/run/gluster")  # where a client writes its state dump
PACKAGES = "glusterfs-server glusterfs-client"
# Where servers make their directories (default: the temporary directory): CI points it
# at a directory of its own, so that gluster_sweep can end whatever a killed run left.
BASE_ENV = "CKPTBENCH_GLUSTER_DIR"


def unavailable() -> str | None:
    """Why a GlusterFS FUSE mount cannot work here (None: it can): no /dev/fuse, or not
    root (glusterd and mount(2) need it). A missing package is not a reason: that is an
    error (:func:`require`)."""
    if not os.path.exists("/dev/fuse"):
        return "FUSE is unavailable: no /dev/fuse on this machine"
    if os.geteuid() != 0:
        return "FUSE mounts of GlusterFS need root (glusterd and mount)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"FUSE is unavailable: /dev/fuse: {exc.strerror}"
    return None


def require(name: str) -> str:
    """The path of a Gluster tool, or a one-line ToolError naming the packages."""
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.is_file()), None)
    if not found:
        raise ToolError(f"no `{name}` on PATH: apt-get install {PACKAGES} (.ci/setup does)")
    return found


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_loopback_host() -> str:
    """The first 127.0.1.N (N = 1..254) where glusterd's port is free."""
    for n in range(1, 255):
        host = f"127.0.1.{n}"
        if _port_free(host, GLUSTERD_PORT):
            return host
    raise ToolError(f"port {GLUSTERD_PORT} is taken on every 127.0.1.N address (a glusterd "
                    "listening on all addresses?); stop it or run the tests elsewhere")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@dataclass
class Mount:
    """One FUSE client of a volume: its mount point and its `glusterfs` process."""

    volume: str
    path: Path
    proc: subprocess.Popen[str] | None
    log: Path
    options: tuple[str, ...] = ()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None


@dataclass
class Volume:
    name: str
    bricks: list[Path]
    options: dict[str, str] = field(default_factory=dict)
    started: bool = False
    profiling: bool = False
    sockets: list[Path] = field(default_factory=list)


class GlusterServer:
    """One glusterd, its volumes and their mounts: `with GlusterServer() as g:
    g.create_volume("v"); m = g.mount("v")`."""

    def __init__(self, base_dir: str | Path | None = None, host: str | None = None) -> None:
        self.glusterd = require("glusterd")
        self.gluster = require("gluster")
        self.glusterfs = require("glusterfs")
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if base_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ckptbench-gluster-",
                                                    dir=os.environ.get(BASE_ENV) or None)
            base_dir = self._tmp.name
        self.base = Path(base_dir)
        self.host = host
        self.proc: subprocess.Popen[str] | None = None
        self.volumes: dict[str, Volume] = {}
        self.mounts: list[Mount] = []
        self.log_dir = self.base / "log"
        self.run_dir = self.base / "run"

    # --- glusterd ---
    def _volfile(self) -> Path:
        path = self.base / "glusterd.vol"
        path.write_text("\n".join([
            "volume management",
            "    type mgmt/glusterd",
            f"    option working-directory {self.base / 'state'}",
            f"    option run-directory {self.run_dir}",
            f"    option glusterd-sockfile {self.run_dir / 'glusterd.socket'}",
            "    option transport-type socket",
            f"    option transport.socket.bind-address {self.host}",
            "    option ping-timeout 0",
            "    option event-threads 1",
            "end-volume", ""]))
        return path

    def start(self, timeout: float = 60.0) -> GlusterServer:
        if len(str(self.run_dir / "glusterd.socket")) > 107:  # sun_path's limit
            self.stop()
            raise ToolError(f"{self.base}: too long a path for glusterd's socket; use a "
                            f"shorter directory ({BASE_ENV})")
        for sub in ("state", "run", "log", "bricks", "mnt"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        for attempt in range(3):  # another server may take the address between check and bind
            host_given = self.host is not None
            self.host = self.host or free_loopback_host()
            with open(self.log_dir / "glusterd.out", "ab") as out:
                self.proc = processes.start(
                    [self.glusterd, "-N", "-f", str(self._volfile()),
                     "-p", str(self.run_dir / "glusterd.pid"),
                     "--log-file", str(self.log_dir / "glusterd.log")],
                    stdout=out, stderr=subprocess.STDOUT)
            # Even if stop() is never called (a script that forgets it, an exception on
            # the way), everything goes with this object or at exit; a SIGKILLed harness
            # still takes glusterd and the clients along (the death signal), not the
            # bricks, which glusterd daemonizes.
            self._finalizer = weakref.finalize(self, _stop_quietly, self.proc, self.run_dir,
                                               self.mounts)
            if self._wait_ready(timeout):
                return self
            processes.stop(self.proc)
            if host_given or attempt == 2 or _port_free(self.host, GLUSTERD_PORT):
                break
            self.host = None
        tail = self.log_tail("glusterd.log")
        self.stop()
        raise ToolError(f"glusterd did not start: {tail}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if (self.run_dir / "glusterd.socket").exists():
                # The first answer waits for glusterd's init (it runs gsyncd, ~7 s here).
                left = max(1.0, deadline - time.monotonic())
                done = self._cli("volume", "list", check=False, timeout=left)
                if done.returncode == 0:
                    return True
            time.sleep(0.2)
        return False

    def _cli(self, *args: str, check: bool = True, timeout: float = 120) -> processes.Finished:
        done = processes.run([self.gluster, "--mode=script",
                              f"--glusterd-sock={self.run_dir / 'glusterd.socket'}",
                              f"--log-file={self.log_dir / 'cli.log'}", *args], timeout=timeout)
        if check and done.returncode:
            raise ToolError(f"gluster {' '.join(args)} failed ({done.returncode}): {done.tail()}")
        return done

    def cli(self, *args: str) -> str:
        """Run `gluster ARGS` against this glusterd; its output (a failure is a ToolError)."""
        return self._cli(*args).stdout

    def log_tail(self, name: str, n: int = 600) -> str:
        try:
            text = (self.log_dir / name).read_text(errors="replace")
        except OSError:
            return "no log"
        return " ".join(text[-n:].split())

    # --- volumes ---
    def create_volume(self, name: str, bricks: int = 2, shard_block_size: str | None = None,
                      options: dict[str, str] | None = None) -> Volume:
        """A started distributed volume of `bricks` bricks; with `shard_block_size` (e.g.
        '4MB', Gluster's minimum) the shard translator splits every file into pieces of
        that size spread over the bricks. `options`: more `gluster volume set` pairs."""
        paths = [self.base / "bricks" / f"{name}-{i}" for i in range(bricks)]
        for p in paths:
            p.mkdir(parents=True)
        # 'force': the bricks are on the root file system, which Gluster otherwise refuses.
        self.cli("volume", "create", name, *(f"{self.host}:{p}" for p in paths), "force")
        vol = self.volumes[name] = Volume(name, paths)
        settings = dict(options or {})
        if shard_block_size:
            settings = {"features.shard": "on", "features.shard-block-size": shard_block_size,
                        **settings}
        for key, value in settings.items():
            self.set(name, key, value)
        self.cli("volume", "start", name)
        vol.started = True
        # Each brick's control socket is in /var/run/gluster (-S on its command line).
        for pid in self.brick_pids(name):
            args = _cmdline(pid).split()
            if "-S" in args[:-1]:
                vol.sockets.append(Path(args[args.index("-S") + 1]))
        return vol

    def set(self, volume: str, key: str, value: str) -> None:
        """`gluster volume set` (a live volume's clients switch to the new graph)."""
        self.cli("volume", "set", volume, key, value)
        self.volumes[volume].options[key] = value

    def get(self, volume: str, key: str) -> str:
        """The volume's current value of `key` (`gluster volume get`)."""
        for line in self.cli("volume", "get", volume, key).splitlines():
            parts = line.split()
            if parts and parts[0] == key:
                return parts[1]
        raise ToolError(f"gluster volume get {volume} {key}: no value in its output")

    def bytes_read(self, volume: str) -> int:
        """Bytes the volume's bricks served to clients since the previous call (`gluster
        volume profile`, started on the first call): what a restore did not find in a
        client's cache."""
        vol = self.volumes[volume]
        if not vol.profiling:
            self.cli("volume", "profile", volume, "start")
            vol.profiling = True
            self.cli("volume", "profile", volume, "info", "incremental")  # a new interval
            return 0
        out = self.cli("volume", "profile", volume, "info", "incremental")
        return sum(int(line.split()[2]) for line in out.splitlines()
                   if line.split()[:2] == ["Data", "Read:"])

    def brick_pids(self, volume: str | None = None) -> list[int]:
        """Live brick processes of this server's volumes (from its own run directory's pid
        files, kept only when the process's command line names that directory)."""
        return _brick_pids(self.run_dir, volume)

    # --- clients ---
    def mount(self, volume: str, path: str | Path | None = None, *fuse_options: str,
              timeout: float = 30.0) -> Mount:
        """A FUSE mount of `volume` (a `glusterfs` client in the foreground, ours to end).
        `fuse_options`: more client flags, e.g. '--attribute-timeout=0'."""
        where = Path(path) if path else self.base / "mnt" / f"{volume}-{len(self.mounts)}"
        where.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"fuse-{where.name}.log"
        proc = processes.start([self.glusterfs, "-N", f"--volfile-server={self.host}",
                                f"--volfile-id={volume}", f"--log-file={log}", *fuse_options,
                                str(where)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        m = Mount(volume, where, proc, log, tuple(fuse_options))
        self.mounts.append(m)
        deadline = time.monotonic() + timeout
        while not (is_mounted(where) and bricks_connected(where)):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.unmount(m)
                what = "its bricks not all connected" if is_mounted(where) else "failed"
                raise ToolError(f"mounting {volume} on {where}: {what}: "
                                f"{self.log_tail(log.name)}")
            time.sleep(0.1)
        return m

    def statedump(self, m: Mount, timeout: float = 30.0) -> str:
        """A state dump of client `m` (SIGUSR1 to its process; the dump is read from
        /var/run/gluster and removed): every translator's state, e.g. which files
        io-cache holds pages of."""
        if m.proc is None:
            raise ToolError(f"{m.path}: not mounted by this server")
        pattern = f"glusterdump.{m.proc.pid}.dump.*"
        before = set(STATEDUMPS.glob(pattern))
        m.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            new = sorted(set(STATEDUMPS.glob(pattern)) - before)
            if new:
                time.sleep(0.3)  # written at once, but let it finish
                text = new[-1].read_text(errors="replace")
                for f in new:
                    f.unlink(missing_ok=True)
                return text
            time.sleep(0.1)
        raise ToolError(f"no statedump of the client of {m.path} in {STATEDUMPS}")

    def unmount(self, m: Mount) -> None:
        """Unmount (lazily if busy) and end the client's process."""
        if is_mounted(m.path):
            done = processes.run(["umount", str(m.path)], timeout=60)
            if done.returncode and is_mounted(m.path):
                processes.run(["umount", "-l", str(m.path)], timeout=60)
        if m.proc is not None:
            processes.stop(m.proc, timeout=5)
            m.proc = None
        if m in self.mounts:
            self.mounts.remove(m)

    def remount(self, m: Mount) -> Mount:
        """Mount `m`'s volume again at the same place (a new client process, in `m`):
        every client cache is gone."""
        self.unmount(m)
        fresh = self.mount(m.volume, m.path, *m.options)
        self.mounts[self.mounts.index(fresh)] = m  # the same object, a new client process
        m.proc, m.log = fresh.proc, fresh.log
        return m

    # --- the end ---
    def delete_volume(self, name: str) -> None:
        """Unmount, stop and delete volume `name`; end its bricks if glusterd did not;
        remove its bricks' logs and sockets outside this server's directory."""
        for m in [m for m in self.mounts if m.volume == name]:
            self.unmount(m)
        vol = self.volumes.pop(name)
        if self.proc is not None and self.proc.poll() is None:
            if vol.started:
                self._cli("volume", "stop", name, "force", check=False)
            self._cli("volume", "delete", name, check=False)
        for pid in self.brick_pids(name):  # glusterd did not stop them: ours, by pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for brick in vol.bricks:  # glusterfsd logs to /var/log/glusterfs/bricks/<path>.log
            (BRICK_LOGS / (str(brick).strip("/").replace("/", "-") + ".log")).unlink(
                missing_ok=True)
        for sock in vol.sockets:
            sock.unlink(missing_ok=True)

    def stop(self) -> None:
        """End everything this object started (see the module), then remove its files."""
        for m in list(self.mounts):
            self.unmount(m)
        for name in list(self.volumes):
            self.delete_volume(name)
        if self.proc is not None:
            processes.stop(self.proc)
            self.proc = None
        if self._tmp is not None:
            _remove_tree(self.base)
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> GlusterServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _brick_pids(run_dir: Path, volume: str | None = None) -> list[int]:
    pids = []
    for pidfile in sorted((run_dir / "vols").glob(f"{volume or '*'}/*.pid")):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().split()[0])
            if str(pidfile) in _cmdline(pid):
                pids.append(pid)
    return pids


def _stop_quietly(proc: subprocess.Popen[str], run_dir: Path, mounts: list[Mount]) -> None:
    """What stop() ends, without asking glusterd (the finalizer's way out)."""
    with contextlib.suppress(Exception):
        for m in mounts:
            if is_mounted(m.path):
                processes.run(["umount", "-l", str(m.path)], timeout=30)
            if m.proc is not None:
                processes.stop(m.proc, timeout=5)
        for pid in _brick_pids(run_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        processes.stop(proc, timeout=5)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class GlusterBed:
    """What the test session uses: one server; volume `plain` (distributed over two bricks)
    mounted twice (two clients standing for two hosts), volume `shard` (two bricks, the
    shard translator on) mounted once."""

    server: GlusterServer
    plain: Mount
    other: Mount  # a second client of the plain volume
    shard: Mount

    @classmethod
    def start(cls, stripe_size: int = 4 << 20) -> GlusterBed:
        """`stripe_size` ([checkpoint] stripe_size) becomes the shard volume's block size."""
        server = GlusterServer().start()
        try:
            server.create_volume("ckb")
            server.create_volume("ckbshard", shard_block_size=gluster_shard_block_size(stripe_size))
            return cls(server, server.mount("ckb"), server.mount("ckb"),
                       server.mount("ckbshard"))
        except BaseException:
            server.stop()
            raise

    def stop(self) -> None:
        self.server.stop()
