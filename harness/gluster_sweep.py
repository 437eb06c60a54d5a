"""`python -m harness.gluster_sweep DIR`: end what Gluster harnesses whose
directories are under DIR left behind, and nothing else.

A harness ends its own processes (GlusterServer.stop, its finalizer, the test fixture's
teardown), but a harness killed outright (SIGKILL, a CI runner giving up) leaves the
bricks, which glusterd daemonizes, and possibly a mount. CI points the harness at a
directory of its own (CKPTBENCH_GLUSTER_DIR) and sweeps it afterwards: FUSE mounts under
DIR are unmounted, Gluster processes (glusterd, glusterfs, glusterfsd) whose command
line names DIR are killed, and those bricks' log files and control sockets, which live
outside DIR, are removed. Other Gluster servers on the machine are not touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from harness import processes
from harness.processes import sweep_dir_argument

GLUSTER_PROGRAMS = frozenset({"glusterd", "glusterfs", "glusterfsd"})


def _inside(path: str, under: str) -> bool:
    return path == under or path.startswith(under.rstrip("/") + "/")


def mounts_under(under: Path) -> list[str]:
    """Mount points under `under`, deepest first."""
    root = os.path.realpath(under)
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if _inside(point, root) and point != root:
                found.append(point)
    return sorted(found, key=len, reverse=True)


def processes_under(under: Path) -> dict[int, list[str]]:
    """pid -> command line of the Gluster processes whose command line names `under`."""
    root = os.path.realpath(under).rstrip("/") + "/"
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if comm in GLUSTER_PROGRAMS and any(root in a for a in args):
            out[int(entry.name)] = [a for a in args if a]
    return out


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def sweep(under: Path) -> list[str]:
    """End what Gluster harnesses under `under` left; one line per thing ended or removed.
    Mounts that would not go are reported as such (their directories must then stay)."""
    said = []
    for point in mounts_under(under):
        done = processes.run(["umount", "-l", point], timeout=60)
        said.append(f"unmounted {point}" if done.returncode == 0
                    else f"could not unmount {point}: {done.tail()}")
    found = processes_under(under)
    for pid, args in found.items():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            said.append(f"killed {Path(args[0]).name} {pid}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in found):
        time.sleep(0.1)
    for args in found.values():  # a brick's log (-l) and control socket (-S)
        for flag in ("-l", "-S"):
            leftover = _flag(args, flag)
            if leftover and Path(leftover).exists() and not _inside(leftover, str(under)):
                Path(leftover).unlink(missing_ok=True)
                said.append(f"removed {leftover}")
    return said


def main(argv: list[str] | None = None) -> int:
    """End what Gluster harnesses under DIR left (mounts, processes, brick logs and
    sockets); exit 1 if a mount under DIR stays."""
    directory = sweep_dir_argument("python -m harness.gluster_sweep", main.__doc__, argv)
    for line in sweep(directory):
        print(f"gluster_sweep: {line}", file=sys.stderr)
    left = mounts_under(directory)
    if left:
        print(f"gluster_sweep: still mounted: {', '.join(left)}", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main())
