"""A real Slurm cluster on this machine for tests: munged, slurmctld and one slurmd per
emulated node (not a mock), all in a directory of its own.

`SlurmCluster(nodes=2).start()` writes its own munge key, `slurm.conf` (nodes n1..nN on
127.0.0.1, each slurmd on a port of its own; controller and node ports are free ports),
state, spool, per-node TmpFS and logs under one directory, starts `munged` with its own
socket, `slurmctld -D` and `slurmd -D -N nK` for every node, and waits until every node
is idle. Nothing of a Slurm installation the machine may have is read or touched: every
command gets `SLURM_CONF` pointing at this cluster's file (:meth:`SlurmCluster.env`),
authentication goes to this cluster's munge socket, and the plugin stack is its own.

Emulated nodes share one host, so Open MPI's shared-memory transport would mix up the
ranks of two nodes (same host name, same job, same local ranks): :data:`OMPI_ENV` makes
ranks talk TCP over loopback. Debian's Open MPI speaks PMIx to Slurm's `mpi/pmix`
plugin (:data:`MPI_PLUGIN`); it has no PMI-2 client, so `srun --mpi=pmi2` fails.

Ending: `stop()` cancels the jobs, stops the daemons and then kills every process that
carries this cluster's marker (:data:`MARKER`, set in the daemons' and the clients'
environment and inherited by slurmstepd and every task it starts), then removes the
directory. A harness killed outright takes munged and the daemons along (the death
signal), but not slurmstepd and its tasks, which slurmd detaches:
`python -m harness.slurm DIR` ends every process of clusters under DIR, and
only those (CI runs it on the way out).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from harness import processes
from harness.processes import ToolError, free_port, sweep_dir_argument

PACKAGES = "slurmctld slurmd slurm-client munge"
BASE_ENV = "CKPTBENCH_SLURM_DIR"  # where clusters make their directories (CI: its own)
MARKER = "CKPTBENCH_SLURM_CLUSTER"  # env var naming the cluster's directory
NODE_MARKER = "CKPTBENCH_SLURM_NODE"  # env var naming a slurmd's node (its slurmstepds keep it)
MPI_PLUGIN = "pmix"
LIVE_STATES = frozenset({"", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"})
OMPI_ENV = {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo"}


def unavailable() -> str | None:
    """Why a Slurm cluster cannot run here (None: it can). A missing package is not a
    reason where apt-get could install it: that is an error (:func:`require`)."""
    if not sys.platform.startswith("linux"):
        return f"Slurm's daemons run on Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "slurmd launches jobs as their user and needs root"
    if not shutil.which("slurmd", path=_path()) and not shutil.which("apt-get"):
        return f"no Slurm packages and no apt-get to install them ({PACKAGES})"
    return None


def _path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def require(name: str) -> str:
    """The path of a Slurm or munge program, or a one-line ToolError naming the packages."""
    found = shutil.which(name, path=_path())
    if not found:
        raise ToolError(f"no `{name}` on PATH: apt-get install {PACKAGES} (.ci/setup does)")
    return found


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _environ(pid: int) -> dict[str, str]:
    out = {}
    for item in _read(Path(f"/proc/{pid}/environ")).split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for its parent)."""
    stat = _read(Path(f"/proc/{pid}/stat")).decode(errors="replace")
    return bool(stat) and stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def _inside(path: str, under: str) -> bool:
    return path == under or path.startswith(under.rstrip("/") + "/")


def processes_of(under: Path, node: str | None = None) -> dict[int, str]:
    """pid -> command line of the live processes of the clusters under `under` (their
    marker, or a command line naming the directory); with `node`, only that node's
    slurmd, its slurmstepds and their tasks."""
    root = os.path.realpath(under)
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        env = _environ(pid)
        args = _read(entry / "cmdline").decode(errors="replace").replace("\0", " ").strip()
        ours = _inside(env.get(MARKER, "\0"), root) or root + "/" in args
        on_node = node is None or node in (env.get(NODE_MARKER), env.get("SLURMD_NODENAME"))
        if ours and on_node and _alive(pid):
            found[pid] = args
    return found


def kill_all(pids: list[int], within: float = 15.0) -> list[int]:
    """SIGKILL each pid and wait until they are gone; the pids still alive."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


class SlurmCluster:
    """munged, slurmctld and `nodes` slurmd daemons: `with SlurmCluster(2) as c:
    c.run("srun", "-N2", "hostname")`."""

    def __init__(self, nodes: int = 2, cpus: int = 4, base_dir: str | Path | None = None) -> None:
        self.programs = {n: require(n) for n in ("munged", "slurmctld", "slurmd", "srun",
                                                 "sinfo", "scontrol", "scancel")}
        self.names = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if base_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ckb-slurm-",
                                                    dir=os.environ.get(BASE_ENV) or None)
            base_dir = self._tmp.name
        self.base = Path(base_dir).resolve()
        self.conf = self.base / "slurm.conf"
        self.socket = self.base / "munge" / "munge.sock"
        self.log_dir = self.base / "log"
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.ports: dict[str, int] = {}
        self._finalizer: weakref.finalize[[Path, dict[str, subprocess.Popen[str]]], SlurmCluster] | None = None

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for this cluster's commands (srun, sbatch, squeue...): its
        SLURM_CONF, its marker, Open MPI over loopback TCP; `extra` on top."""
        return {**os.environ, "SLURM_CONF": str(self.conf), MARKER: str(self.base),
                **OMPI_ENV, **extra}

    # --- starting ---
    def _write_config(self) -> None:
        b = self.base
        self.ports = {"slurmctld": free_port(), **{n: free_port() for n in self.names}}
        (b / "plugstack.conf").write_text("")
        lines = [
            "ClusterName=ckptbench", "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ports['slurmctld']}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={b / 'state'}", f"SlurmdSpoolDir={b / 'spool' / '%n'}",
            f"TmpFS={b / 'tmp' / '%n'}",  # PMIx's per-step directory, one per node
            f"SlurmctldPidFile={b / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={b / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd-%n.log'}",
            f"PlugStackConfig={b / 'plugstack.conf'}", "MailProg=/bin/true",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "SlurmdParameters=config_overrides",
            "MpiDefault=none", "ReturnToService=2", "SlurmdTimeout=15", "InactiveLimit=0",
            "KillWait=5", "MinJobAge=600", "MessageTimeout=10",
        ]
        lines += [f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.ports[n]} "
                  f"CPUs={self.cpus} RealMemory=1000 State=UNKNOWN" for n in self.names]
        lines.append(f"PartitionName=ckb Nodes={','.join(self.names)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _start(self, key: str, cmd: list[str], **env: str) -> None:
        with open(self.log_dir / f"{key}.out", "ab") as out:
            self.procs[key] = processes.start(cmd, env=self.env(**env), stdout=out,
                                              stderr=subprocess.STDOUT)

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        if len(str(self.socket)) > 100:  # sun_path's limit
            raise ToolError(f"{self.base}: too long a path for munge's socket ({BASE_ENV})")
        for sub in ("munge", "state", "run", "log", *(f"spool/{n}" for n in self.names),
                    *(f"tmp/{n}" for n in self.names)):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "munge").chmod(0o755)
        keyfile = self.base / "munge.key"
        keyfile.write_bytes(secrets.token_bytes(128))
        keyfile.chmod(0o400)
        self._write_config()
        self._finalizer = weakref.finalize(self, _end, self.base, self.procs)
        try:
            self._start("munged", [self.programs["munged"], "-F", "-f",
                                   f"--socket={self.socket}", f"--key-file={keyfile}",
                                   f"--pid-file={self.base / 'run' / 'munged.pid'}",
                                   f"--seed-file={self.base / 'munge' / 'seed'}",
                                   f"--log-file={self.log_dir / 'munged.log'}"])
            self._wait(self.socket.exists, timeout, "munged did not make its socket")
            self._start("slurmctld", [self.programs["slurmctld"], "-D", "-f", str(self.conf)])
            for n in self.names:
                self.start_node(n)
            self.wait_nodes("idle", timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, name: str) -> None:
        """Start (or start again) node `name`'s slurmd."""
        self._start(f"slurmd-{name}", [self.programs["slurmd"], "-D", "-N", name,
                                       "-f", str(self.conf)], **{NODE_MARKER: name})

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [k for k, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"not within {timeout:.0f} s"
                raise ToolError(f"Slurm: {what} ({why}): {self.log_tail(dead[0] if dead else 'slurmctld')}")
            time.sleep(0.1)

    # --- asking ---
    def run(self, *args: str, timeout: float = 120, **env: str) -> processes.Finished:
        """A Slurm command (srun, sbatch, squeue...) against this cluster, to its end."""
        return processes.run(list(args), env=self.env(**env), timeout=timeout)

    def node_states(self) -> dict[str, str]:
        """node -> its state as sinfo says it (idle, alloc, mix, down*, ...)."""
        done = self.run("sinfo", "-h", "-N", "-o", "%N %T", timeout=30)
        return dict(line.split()[:2] for line in done.stdout.splitlines() if len(line.split()) >= 2)

    def wait_nodes(self, state: str, nodes: list[str] | None = None, timeout: float = 60) -> None:
        """Until every node (of `nodes`) is in `state` (sinfo's word, e.g. idle)."""
        want = nodes or self.names
        self._wait(lambda: all(self.node_states().get(n) == state for n in want), timeout,
                   f"nodes {','.join(want)} not {state} (states: {self.node_states()})")

    def job_state(self, job_id: str) -> str:
        """The job's state (RUNNING, COMPLETED, CANCELLED, TIMEOUT, NODE_FAIL...), '' if unknown."""
        out = self.run("scontrol", "-o", "show", "job", job_id, timeout=30).stdout
        fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
        return fields.get("JobState", "")

    def wait_job(self, job_id: str, timeout: float = 300) -> str:
        """The job's final state (COMPLETED, CANCELLED, TIMEOUT, NODE_FAIL, FAILED...),
        once it is no longer pending, running or completing."""
        deadline = time.monotonic() + timeout
        while (state := self.job_state(job_id)) in LIVE_STATES:
            if time.monotonic() > deadline:
                raise ToolError(f"Slurm job {job_id} still {state or 'unknown'} after {timeout:.0f} s")
            time.sleep(0.2)
        return state

    def log_tail(self, name: str, chars: int = 600) -> str:
        for path in (self.log_dir / f"{name}.log", self.log_dir / f"{name}.out"):
            text = _read(path).decode(errors="replace")
            if text:
                return " ".join(text[-chars:].split())
        return "no log"

    def processes(self, node: str | None = None) -> dict[int, str]:
        """pid -> command line of this cluster's live processes (of `node` only)."""
        return processes_of(self.base, node)

    # --- ending ---
    def kill_node(self, name: str) -> list[int]:
        """A node's failure: SIGKILL its slurmd, its slurmstepds and their tasks at once;
        the pids killed."""
        pids = sorted(self.processes(name))
        left = kill_all(pids)
        proc = self.procs.pop(f"slurmd-{name}", None)
        if proc is not None:
            proc.wait()
        if left:
            raise ToolError(f"node {name}: processes {left} outlived SIGKILL")
        return pids

    def stop(self) -> None:
        """Cancel every job, stop the daemons, kill what is left of this cluster (by its
        marker), stop munged and remove the directory."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(ToolError, subprocess.SubprocessError, OSError):
                self.run("scancel", "--full", "--user", str(os.getuid()), timeout=15)
        if self._finalizer is not None:
            self._finalizer.detach()
        _end(self.base, self.procs)
        self.procs.clear()
        if self._tmp is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _end(base: Path, procs: dict[str, subprocess.Popen[str]]) -> None:
    """Daemons first (slurmd, then slurmctld, munged last: the others ask it), then
    every process still carrying the cluster's marker."""
    order = sorted(procs, key=lambda k: (k == "munged", k == "slurmctld"))
    for key in order:
        with contextlib.suppress(Exception):
            processes.stop(procs[key], timeout=10)
    kill_all(sorted(processes_of(base)))


def sweep(under: Path) -> list[str]:
    """Kill every process of the Slurm clusters under `under`; one line per process."""
    found = processes_of(under)
    left = kill_all(sorted(found))
    return [f"{'could not kill' if pid in left else 'killed'} {pid} {args[:80]}"
            for pid, args in found.items()]


def main(argv: list[str] | None = None) -> int:
    """End every process of the Slurm test clusters whose directories are under DIR
    (munged, slurmctld, slurmd, slurmstepd and their tasks), nothing else; exit 1 if
    one outlives SIGKILL."""
    directory = sweep_dir_argument("python -m harness.slurm", main.__doc__, argv)
    said = sweep(directory)
    for line in said:
        print(f"slurm sweep: {line}", file=sys.stderr)
    return 1 if any(line.startswith("could not") for line in said) else 0


if __name__ == "__main__":
    raise SystemExit(main())
