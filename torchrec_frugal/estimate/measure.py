"""What a measurement records beside its figure: the checkout it ran on, the CPU the machine and
this process used, and the median time of a callable.
"""
from __future__ import annotations

import os
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence


def git_state(root: Path, paths: Sequence[str] = ("torchrec_frugal",)) -> str:
    """HEAD of the checkout at ``root``, with '+dirty' if ``paths`` have local edits ('unknown' outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *paths],
            cwd=root, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


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


def own_cpu_s() -> float:
    """CPU seconds of this process and its reaped children."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime + children_cpu_s()


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


def median_or_nan(xs: Sequence[float | None]) -> float:
    """Median of the figures of ``xs`` with None and NaN (a failed run, an undefined figure) left out; NaN if none is left."""
    vals = [x for x in xs if x is not None and x == x]
    return statistics.median(vals) if vals else float("nan")
