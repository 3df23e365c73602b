"""The interpreter finalizes only once the process's other threads are at rest.

Why: a gloo worker thread completes a collective, which wakes the rank waiting for it, and only
then drops its own reference to the work. When that reference is the last, destroying the work
releases Python objects (a tensor's, or the context autograd has kept in the thread-local state
of every backward since torch 2.13, copied into the collectives a backward starts) and takes the
GIL to do it. If the interpreter is finalizing by then, CPython ends that thread with
``pthread_exit``, whose unwinding cannot pass torch's ``noexcept`` frames: ``std::terminate``
("terminate called without an active exception"), SIGABRT, and a run that had finished is
reported failed. A busy machine delays the worker long enough: the gradient all-reduce of
DistributedDataParallel's last backward and the pipeline's last batch agreement were both caught
so (docs/robustness.md, "A clean exit", has the backtraces and the rates). PyTorch does not
prevent it.

So at exit, after the engines and batch planners have stopped (their finalizers run newest first,
and each engine and planner calls :func:`arm` before it makes its own), the main thread releases
the GIL and waits until every other thread of the process has been asleep for a few polls in a
row: none is running, waiting to run, or waiting for the GIL (which a sleeping main thread would
hand it). The wait is bounded; where ``/proc`` is missing there is nothing to read and no wait.

The wait is armed by the first engine or planner, not at import (importing the package changes
nothing in the process), and stays armed until exit once armed: the threads it waits for (gloo's,
DistributedDataParallel's) outlive the engines, whose closing comes before the race.
"""
from __future__ import annotations

import os
import threading
import time
import weakref
from typing import List, Optional

POLL_S = 0.001
QUIET_POLLS = 3  # consecutive polls with every other thread asleep
TIMEOUT_S = 2.0  # a thread still busy then (a spinning one) is left to the interpreter
_RUNNING = (b"R", b"D")  # running or runnable; uninterruptible sleep (it runs next)


def busy_threads(own: int) -> List[int]:
    """The native ids of this process's threads, other than ``own``, running or about to run."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return []
    busy = []
    for tid in tids:
        if int(tid) == own:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        end = stat.rindex(b")")  # the state follows the name, which may hold spaces and parentheses
        if stat[end + 2 : end + 3] in _RUNNING:
            busy.append(int(tid))
    return busy


def wait_for_quiet_threads(timeout_s: float = TIMEOUT_S) -> bool:
    """Sleep (GIL released) until every other thread has been asleep for :data:`QUIET_POLLS`
    polls in a row, at most ``timeout_s``; True if they were."""
    own = threading.get_native_id()
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < QUIET_POLLS:
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
        quiet = 0 if busy_threads(own) else quiet + 1
    return True


class _AtExit:
    """What the exit's finalizer hangs on: alive until the interpreter exits."""


_AT_EXIT = _AtExit()
_armed: Optional[weakref.finalize] = None
_arm_lock = threading.Lock()


def arm() -> None:
    """Wait for quiet threads at exit (idempotent); call it before making a finalizer that must run before the wait."""
    global _armed
    with _arm_lock:
        if _armed is None:
            _armed = weakref.finalize(_AT_EXIT, wait_for_quiet_threads)


def armed() -> bool:
    """Whether the exit will wait (:func:`arm` ran in this process)."""
    return _armed is not None and _armed.alive
