"""CPU time of an engine's threads by role: the training thread, the exchange worker, the
lookahead worker, the flushers (the benchmarks' per-thread columns)."""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Dict, List, Sequence

ROLES = ("train", "exchange", "lookahead", "flusher")


def thread_kind(name: str) -> str:
    """The role of an engine thread from its name (``frugal-exchange-0``, ``frugal-flusher-0-0``, ...)."""
    if name == "MainThread":
        return "train"
    for kind in ROLES[1:]:
        if name.startswith(f"frugal-{kind}"):
            return kind
    return "other"


def cpu_s(thread: threading.Thread) -> float:
    """CPU seconds of a live thread of this process (nanosecond clock)."""
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))  # type: ignore[arg-type]


class ThreadClock:
    """CPU seconds per role of the calling (training) thread and an engine's background threads."""

    def __init__(self, background: Sequence[threading.Thread]) -> None:
        self.threads: List[threading.Thread] = [threading.current_thread(), *background]
        self.kinds = ["train"] + [thread_kind(t.name) for t in background]

    def read(self) -> Dict[str, float]:
        out: Dict[str, float] = defaultdict(float)
        for kind, t in zip(self.kinds, self.threads):
            out[kind] += cpu_s(t)
        return dict(out)

    @staticmethod
    def spent(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
        return {k: after[k] - before.get(k, 0.0) for k in after}
