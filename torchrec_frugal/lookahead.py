"""Lookahead window: for each owned row, the next future step at which some rank reads it from host.

The data loader runs L steps ahead, so the ids of steps (s, s + L] are known while step s runs.
An owner ingests, step by step, the rows that any rank will read from host memory (every row
except the ones a rank finds in its own cache) and keeps ``next_read[row]``: the earliest such
step, or INF. That is the flush priority of a row with a pending write.
"""
from __future__ import annotations

from collections import deque
from typing import Deque, Tuple

import numpy as np

from .priority_queue import INF


class LookaheadWindow:
    """Per-owner next-host-read step of every row, over the ingested window of steps."""

    def __init__(self, num_rows: int) -> None:
        self.next_read = np.full(num_rows, INF, dtype=np.int64)
        self.last_step = -1  # W: newest ingested step
        self._steps: Deque[Tuple[int, np.ndarray]] = deque()
        self._mark = np.zeros(num_rows, dtype=bool)

    def add_step(self, step: int, rows: np.ndarray) -> np.ndarray:
        """Ingest the (unique) rows read from host at ``step``; returns rows whose next read was INF."""
        if step != self.last_step + 1:
            raise RuntimeError(f"lookahead steps must arrive in order: got {step} after {self.last_step}")
        self.last_step = step
        self._steps.append((step, rows))
        newly = rows[self.next_read[rows] == INF]
        self.next_read[newly] = step
        return newly

    def retire(self, step: int) -> None:
        """Forget reads at steps <= ``step`` and recompute the next read of the rows they held."""
        while self._steps and self._steps[0][0] <= step:
            _, done = self._steps.popleft()
            self.next_read[done] = INF
            self._mark[done] = True
            for t, rows in self._steps:
                hit = rows[self._mark[rows]]
                self.next_read[hit] = t
                self._mark[hit] = False
            self._mark[done] = False

    def priorities(self, rows: np.ndarray) -> np.ndarray:
        return self.next_read[rows]
