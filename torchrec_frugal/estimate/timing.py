"""The median time of a callable (the calibration's), and the CPU the machine and this process's
children used (the examples' runs of train.py record it).

The helpers only the benchmarks use (the checkout a figure was measured on, a median with
missing figures left out) live in ``benchmarks/measure.py``.
"""
from __future__ import annotations

import os
import resource
import statistics
import time
from typing import Callable


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat (0 where there is none)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's reaped children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def median_s(fn: Callable[[], object], reps: int, warmup: int = 3, sync: Callable[[], None] = lambda: None) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after ``warmup``; ``sync`` waits for queued device work."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
