"""What a stalled process was waiting on (runner.thread_dump): every thread of a real
process, and the one line that names the run's own frame each thread was in."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from ckptbench.runner.thread_dump import parse, summarize

ROOT = Path(__file__).resolve().parents[2]


BLOCKED = """
import sys, threading
from ckptbench.runner.thread_dump import format_threads

def _blocked_in_storage(release, inside):
    inside.set()
    release.wait(30)

release, inside = threading.Event(), threading.Event()
busy = threading.Thread(target=_blocked_in_storage, args=(release, inside),
                        name="ckptbench-s3_0", daemon=True)
idle = threading.Timer(30, lambda: None)  # the standard library's frames only
busy.start()
idle.start()
inside.wait(10)
print(idle.name)
print(format_threads())
release.set()
idle.cancel()
"""


def test_the_summary_names_the_frame_each_busy_thread_waits_in(tmp_path: Path) -> None:
    """In a process of its own: the test process holds other tests' threads, and a
    summary names the first few of a process's busy threads only."""
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         check=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}
                         ).stdout
    idle_name, dump = out.split("\n", 1)
    names = [name for name, _frames in parse(dump)]
    assert {"ckptbench-s3_0", idle_name, "MainThread"} <= set(names), names
    line = summarize(dump)
    assert "ckptbench-s3_0 in _blocked_in_storage (" in line and "blocked.py:" in line, line
    assert "waiting in wait (threading.py:" in line and idle_name not in line, line


def test_a_faulthandler_dump_is_read_the_same_way() -> None:
    stdlib = sysconfig.get_paths()["stdlib"]
    dump = ('Thread 0x00007f1 (most recent call first):\n'
            f'  File "{stdlib}/threading.py", line 327 in wait\n'
            '  File "/src/ckptbench/backends/s3/writer.py", line 95 in _harvest\n'
            '  File "/src/ckptbench/formats/raw.py", line 145 in _write\n\n'
            'Current thread 0x00007f2 (most recent call first):\n'
            '  File "/src/ckptbench/runner/stall.py", line 120 in _run\n')
    assert summarize(dump) == ("0x00007f1 in _harvest (ckptbench/backends/s3/writer.py:95) "
                               "waiting in wait (threading.py:327)")
    assert summarize("") == "no thread of the run's code found in its thread dump"
