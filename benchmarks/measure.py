"""What a benchmark records beside its figure: the checkout it ran on, the CPU this process and
its children used, and the median of figures some of which may be missing.

The measuring helpers the package and the examples use themselves (``median_s``,
``machine_busy_s``, ``children_cpu_s``) stay in :mod:`torchrec_frugal.estimate.timing`.
"""
from __future__ import annotations

import resource
import statistics
import subprocess
from pathlib import Path
from typing import Sequence

from torchrec_frugal.estimate.timing import children_cpu_s


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


def own_cpu_s() -> float:
    """CPU seconds of this process and its reaped children."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime + children_cpu_s()


def median_or_nan(xs: Sequence[float | None]) -> float:
    """Median of the figures of ``xs`` with None and NaN (a failed run, an undefined figure) left out; NaN if none is left."""
    vals = [x for x in xs if x is not None and x == x]
    return statistics.median(vals) if vals else float("nan")
