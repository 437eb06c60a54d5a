"""What a stalled process was waiting on (runner.thread_dump): every thread of a real
process, and the one line that names the run's own frame each thread was in."""

from __future__ import annotations

import sysconfig
import threading

from ckptbench.runner.thread_dump import format_threads, parse, summarize


def _blocked_in_storage(release: threading.Event, inside: threading.Event) -> None:
    inside.set()
    release.wait(30)


def test_the_summary_names_the_frame_each_busy_thread_waits_in() -> None:
    release, inside = threading.Event(), threading.Event()
    busy = threading.Thread(target=_blocked_in_storage, args=(release, inside),
                            name="ckptbench-s3_0", daemon=True)
    idle = threading.Timer(30, lambda: None)  # the standard library's frames only
    busy.start()
    idle.start()
    try:
        inside.wait(10)
        dump = format_threads()
    finally:
        release.set()
        idle.cancel()
    names = [name for name, _frames in parse(dump)]
    assert {"ckptbench-s3_0", idle.name, threading.current_thread().name} <= set(names)
    line = summarize(dump)
    assert ("ckptbench-s3_0 in _blocked_in_storage (tests/runner/test_thread_dump.py:"
            in line), line
    assert "waiting in wait (threading.py:" in line and idle.name not in line, line


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
