"""An MPI rank ends at once on SIGTERM, with one line, even while its main thread is
blocked where no Python handler runs (as in an MPI call): runner.signals.exit_on_signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_blocked_main_thread_still_ends_on_sigterm_with_one_line():
    script = textwrap.dedent("""
        import signal, threading
        from ckptbench.runner.signals import exit_on_signals, say_on_signal
        exit_on_signals()
        say_on_signal(lambda name: f"stopped by {name}")
        # The main thread cannot take the signal (nor run a Python handler): it lands in
        # another thread, as it does while MPI holds the main thread.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        threading.Thread(target=threading.Event().wait, daemon=True).start()
        print("ready", flush=True)
        threading.Event().wait()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err == "ckptbench: error: stopped by SIGTERM\n"


def test_an_ignored_signal_stays_ignored():
    script = textwrap.dedent("""
        import os, signal
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        from ckptbench.runner.signals import exit_on_signals
        exit_on_signals()
        os.kill(os.getpid(), signal.SIGHUP)
        print("still here")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=30)
    assert done.returncode == 0 and done.stdout == "still here\n"
