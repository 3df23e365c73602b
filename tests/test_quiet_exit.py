"""The exit waits for threads still at work (torchrec_frugal.quiet_exit).

A thread hashing a large buffer runs without the GIL, as a gloo worker destroying a collective
does until it needs it: the wait must see it as busy, and the interpreter must not finalize under it.
"""
import hashlib
import os
import subprocess
import sys
import threading
import time

import pytest

from torchrec_frugal import quiet_exit

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads are read from /proc (Linux)")

_CHUNK = b"x" * (8 << 20)  # hashed without the GIL, a few milliseconds a chunk


def _hash_for(seconds: float, done: threading.Event) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hashlib.sha256(_CHUNK).digest()
    done.set()


def test_the_wait_lasts_until_a_working_thread_is_done():
    done = threading.Event()
    worker = threading.Thread(target=_hash_for, args=(0.3, done), daemon=True)
    worker.start()
    time.sleep(0.02)
    assert worker.native_id in quiet_exit.busy_threads(threading.get_native_id())
    assert quiet_exit.wait_for_quiet_threads(timeout_s=10.0)
    assert done.is_set()
    worker.join()
    assert worker.native_id not in quiet_exit.busy_threads(threading.get_native_id())


def test_the_wait_is_bounded():
    done = threading.Event()
    worker = threading.Thread(target=_hash_for, args=(1.5, done), daemon=True)
    worker.start()
    start = time.monotonic()
    assert not quiet_exit.wait_for_quiet_threads(timeout_s=0.2)
    assert 0.2 <= time.monotonic() - start < 1.0
    assert not done.is_set()
    worker.join()


def test_sleeping_threads_end_the_wait_at_once():
    stop = threading.Event()
    sleeper = threading.Thread(target=stop.wait, daemon=True)
    sleeper.start()
    start = time.monotonic()
    assert quiet_exit.wait_for_quiet_threads(timeout_s=10.0)
    assert time.monotonic() - start < 1.0
    stop.set()
    sleeper.join()


def test_the_interpreter_finalizes_after_a_working_daemon_thread():
    """Without the wait, the interpreter finalizes at once and the daemon thread never reports."""
    script = (
        "import hashlib, threading, time\n"
        "from torchrec_frugal import quiet_exit\n"
        "quiet_exit.arm()  # as the first engine or batch planner does\n"
        "def work():\n"
        "    end = time.monotonic() + 0.3\n"
        "    while time.monotonic() < end:\n"
        "        hashlib.sha256(b'x' * (8 << 20)).digest()\n"
        "    print('done', flush=True)\n"
        "threading.Thread(target=work, daemon=True).start()\n"
        "time.sleep(0.02)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["done"]
