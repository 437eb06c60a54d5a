"""`ckptbench run --tiers ...` with a hostile neighbour in --memory-dir acting at a known
point of the run, not after a sleep (tests only; issue 43).

    python tests/adversarial/memory_hook_run.py ACTION:ARG -- RUN ARGS...

The real CLI in a real process; the run's ranks are forks of it and inherit the hooks.

predicted:VICTIM       before the run starts: at the name its memory directory had before
                       issue 43 (``ckptbench-<run id>``: the run id is predictable) a
                       directory another user made (owned by nobody when root, mode 0777)
                       whose node0 and node1 are symbolic links to VICTIM
predicted-link:VICTIM  the same name made a symbolic link to VICTIM
first:VICTIM           as the run makes its directory in --memory-dir, at the very name it
                       picked: that planted directory is put there first
first-link:VICTIM      the same, a symbolic link to VICTIM
swap-link:VICTIM       once process 0's memory copy of checkpoint 1 is held: its node's
                       directory moved aside (``node0.moved``) and a symbolic link to VICTIM
                       put in its place
swap-dir:VICTIM        the same, but the directory VICTIM itself moved into its place
swap-link-term:VICTIM  swap-link, then SIGTERM to the whole run (its process group)
swap-dir-term:VICTIM   swap-dir, then SIGTERM to the whole run
foreign:-              once process 0's memory copy of checkpoint 1 is held: a file with a
                       copy's name (p0-ckpt99.bin), owned by nobody (65534), put in that
                       node's directory
kill:-                 once process 0's memory copy of checkpoint 1 is held: SIGKILL to the
                       whole run (before that checkpoint is held by every tier)
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ckptbench.cli import main
from ckptbench.runner import session, tier_store
from tests.adversarial.hooked_run import _once  # the first process of the run to get here

NOBODY = 65534
FOREIGN = "p0-ckpt99.bin"


def _as_other_user(path: Path) -> None:
    if os.geteuid() == 0:
        os.lchown(path, NOBODY, NOBODY)


def plant(path: Path, victim: str, link: bool) -> None:
    """What another user leaves at `path`: a link to `victim`, or a directory open to all
    whose node directories are links to `victim`."""
    if link:
        path.symlink_to(victim, target_is_directory=True)
        _as_other_user(path)
        return
    path.mkdir()
    os.chmod(path, 0o777)
    for node in ("node0", "node1"):
        (path / node).symlink_to(victim, target_is_directory=True)
        _as_other_user(path / node)
    _as_other_user(path)


def _stop_all(sig: int) -> None:
    """`sig` to the run's own process group (the test starts it in a session of its own)."""
    assert os.getpgrp() == os.getsid(0), "start the run with start_new_session"
    os.killpg(os.getpgrp(), sig)
    time.sleep(60)  # this process ends with the signal


def _parent_of(path: Any, dir_fd: int | None) -> tuple[Path, str]:
    name = os.fsdecode(os.fspath(path))
    if dir_fd is not None and not os.path.isabs(name):
        return Path(os.readlink(f"/proc/self/fd/{dir_fd}")), name
    return Path(name).parent, Path(name).name


def install(action: str, memory_dir: str, results: str) -> None:
    name, _, arg = action.partition(":")
    flag = Path(f"{results}.hook")
    mem = Path(memory_dir).resolve()

    if name.startswith("predicted"):
        place = session.place_tiers

        def placed(options: Any, *args: Any, **kwargs: Any) -> Any:
            plant(Path(options.tiers.memory_dir) / f"ckptbench-{options.run_id}", arg,
                  link=name == "predicted-link")
            return place(options, *args, **kwargs)

        session.place_tiers = placed  # type: ignore[assignment]
        return

    if name.startswith("first"):
        mkdir = os.mkdir

        def planting_mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
            parent, base = _parent_of(path, dir_fd)
            if parent.resolve() == mem and base.startswith("ckptbench-") and _once(flag):
                plant(parent / base, arg, link=name == "first-link")
            mkdir(path, mode, dir_fd=dir_fd)

        os.mkdir = planting_mkdir  # type: ignore[assignment]
        return

    commit = tier_store.PreparedCopy.commit

    def hooked_commit(self: Any) -> None:
        commit(self)
        held = Path(self.path)
        if held.name != "p0-ckpt1.bin" or not _once(flag):
            return
        node = held.parent
        if name == "kill":
            _stop_all(signal.SIGKILL)
        if name == "foreign":
            (node / FOREIGN).write_bytes(b"another user's")
            _as_other_user(node / FOREIGN)
            return
        node.rename(node.with_name(node.name + ".moved"))
        if name.startswith("swap-link"):
            node.symlink_to(arg, target_is_directory=True)
        else:
            os.rename(arg, node)
        if name.endswith("-term"):
            _stop_all(signal.SIGTERM)

    tier_store.PreparedCopy.commit = hooked_commit  # type: ignore[method-assign]


if __name__ == "__main__":
    action, rest = sys.argv[1], sys.argv[2:]
    rest = rest[1:] if rest[:1] == ["--"] else rest
    install(action, rest[rest.index("--memory-dir") + 1], rest[rest.index("--results") + 1])
    sys.exit(main(["run", *rest]))
