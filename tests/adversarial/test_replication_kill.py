"""A rank SIGKILLed while its peer tier replicates (``--tiers memory,peer``; ``--tiers
peer`` in async mode: replicas over TCP) fails the run as a plain run does when a rank dies: "rank N died (signal 9)", kind
internal, exit 1; not the survivor's "Connection refused" (kind backend).

The kill is at a known point of the run, not after a sleep: this file, run as a script,
starts the real CLI with the peer tier's ``send`` wrapped (in the CLI process, so every
forked rank has it). At checkpoint 1's replication the victim process kills itself
(SIGKILL) as it would send its replica, and every other process sends its own only once
the victim is dead, so the victim's holder socket is gone: the survivor's connection is
refused, as in the issue.

    python tests/adversarial/test_replication_kill.py VICTIM FLAG -- RUN ARGS...
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = """
[workload]
name = "two-ranks"
[model]
name = "custom"
layers = 2
dim = 256
heads = 8
kv_heads = 4
ffn_dim = 688
vocab_size = 1000
[state]
param_dtype = "float32"
optimizer = "adamw"
optimizer_dtype = "float32"
[parallel]
world_size = 2
layout = "fsdp2"
tp = 1
"""


def _dead(pid: int) -> bool:
    """The process has ended (a zombie not yet reaped, or gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def install(victim: int, flag: Path) -> None:
    """Wrap the peer tier's send: checkpoint 1's replica from process `victim` kills its
    process instead (its pid in `flag` first); every other process's replica leaves once
    the victim is dead."""
    from ckptbench.runner import tier_peer

    send = tier_peer.send

    def hooked(address: tuple[str, int], op: int, src: int, it: int, data: Any) -> None:
        if op == tier_peer.PUT and it == 1:
            if src == victim:
                part = flag.with_name(flag.name + ".part")
                part.write_text(str(os.getpid()))
                part.rename(flag)
                os.kill(os.getpid(), signal.SIGKILL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                    flag.exists() and _dead(int(flag.read_text()))):
                time.sleep(0.0005)
        send(address, op, src, it, data)

    tier_peer.send = hooked  # send_all's, in async mode and sync mode alike


def _run(tmp_path: Path, victim: int, *args: str) -> tuple[subprocess.CompletedProcess[str],
                                                           Path]:
    workload = tmp_path / "two.toml"
    workload.write_text(WORKLOAD)
    memory = tmp_path / "memory"
    memory.mkdir()
    results = tmp_path / "r.jsonl"
    cmd = [sys.executable, __file__, str(victim), str(tmp_path / "victim.pid"), "--",
           str(workload), "--target", str(tmp_path / "t"), "--results", str(results),
           "--memory-dir", str(memory), "--ranks-per-node", "1", "--iterations", "2", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path, check=False)
    return proc, results


MODE = {"sync": ("--tiers", "memory,peer"),
        # async mode: the peer tier alone, short steps
        "async": ("--tiers", "peer", "--step-seconds", "0.02", "--steps-per-checkpoint", "2")}


@pytest.mark.parametrize("victim", [1, 0])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_rank_killed_during_replication_is_reported_as_dead(tmp_path: Path, victim: int,
                                                              mode: str) -> None:
    from ckptbench.records import read_records

    proc, results = _run(tmp_path, victim, "--mode", mode, *MODE[mode])
    assert (tmp_path / "victim.pid").exists(), proc.stderr  # the kill happened
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("ckptbench: error: ")]
    assert len(lines) == 1, proc.stderr
    assert f"rank {victim} died (signal 9)" in lines[0], lines[0]
    assert "Connection refused" not in proc.stderr
    assert proc.returncode == 1
    errors = [r for r in read_records(results) if r["type"] == "error"]
    assert errors and errors[-1]["kind"] == "internal", errors
    assert f"rank {victim} died (signal 9)" in errors[-1]["message"]


class _TwoProcesses:
    """A Comm's face for the peer tier's collectives: this process is process 0 of two,
    process 1's share given."""

    rank, size = 0, 2

    def __init__(self, other: Any) -> None:
        self.other = other

    def gather(self, obj: Any) -> list[Any]:
        return [obj, self.other]

    def bcast(self, obj: Any) -> Any:
        return obj


SERVE = ("import socket, sys, time; s = socket.create_server(('127.0.0.1', 0)); "
         "print(s.getsockname()[1], flush=True); time.sleep(600)")


def test_a_dead_peer_is_reported_once_its_launcher_has_reaped_it() -> None:
    """The peer tier's side of it, without a launcher's timing: this test is the dead
    peer's parent. Its connection fails at once, but the sender raises only once the
    parent has reaped the peer (what tells a launcher which rank died and how), and then
    names it; a live peer's refusal is raised at once, as it was."""
    import numpy as np

    from ckptbench.runner import tier_peer

    peer = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout is not None
        port = int(peer.stdout.readline())
        start = Path(f"/proc/{peer.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        with socket.socket() as closed:  # a port no one listens on
            closed.bind(("127.0.0.1", 0))
            unused = closed.getsockname()[1]
        addresses = [("127.0.0.1", 1), ("127.0.0.1", port)]
        tier_peer._watch_peers(_TwoProcesses((peer.pid, start)), ["here", "here"], addresses)
        data = np.zeros(16, dtype=np.uint8)
        # alive: the refusal of a port it does not serve is raised at once, as it was
        tier_peer._PEERS[("127.0.0.1", unused)] = (1, peer.pid, start)
        t0 = time.monotonic()
        with pytest.raises(ConnectionRefusedError):
            tier_peer.send(("127.0.0.1", unused), tier_peer.SINK, 0, 1, data)
        assert time.monotonic() - t0 < tier_peer.REAP_WAIT_S / 2
        peer.kill()
        while not _dead(peer.pid):
            time.sleep(0.001)
        failed: list[BaseException] = []

        def sending() -> None:
            try:
                tier_peer.send(addresses[1], tier_peer.PUT, 0, 1, data)
            except BaseException as exc:
                failed.append(exc)

        sender = threading.Thread(target=sending, daemon=True)
        sender.start()
        sender.join(0.5)
        assert sender.is_alive() and not failed, failed  # dead, not reaped: no report yet
        peer.wait()  # reaped, as a launcher does
        sender.join(5)
        assert not sender.is_alive()
        (exc,) = failed
        assert isinstance(exc, tier_peer.PeerDied)
        assert str(exc).startswith(f"peer process 1 (127.0.0.1:{port}) died: ")
    finally:
        peer.kill()
        peer.wait()
        tier_peer._PEERS.clear()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    victim_arg, flag_arg, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    rest = rest[1:] if rest[:1] == ["--"] else rest
    install(int(victim_arg), Path(flag_arg))
    from ckptbench.cli import main

    sys.exit(main(["run", *rest]))
