"""Lookahead window: for each owned row, the next future step at which some rank reads it from host.

The data loader runs L steps ahead, so the ids of steps (s, s + L] are known while step s runs.
An owner ingests, step by step, the rows that any rank will read from host memory and that may
have a pending write (every row except the ones a rank finds in its own cache; where owners
update uncached rows in place in host memory, only cached rows) and keeps ``next_read[row]``:
the earliest such step, or INF. That is the flush priority of a row with a pending write.

Every read in the window is an entry of one flat ring, in step order, and each entry links to
the step of the same row's next entry. Ingesting a step and retiring one therefore cost O(rows
of that step), one compiled pass (``kernels/read_window.py``), whatever the window's length:
retiring step s sets the next read of each row it held to that row's link.
"""
from __future__ import annotations

from collections import deque
from typing import Deque, Tuple

import numpy as np

from ...kernels.read_window import add_step, retire_entries
from ...priorities import INF


class LookaheadWindow:
    """Per-owner next-host-read step of every row, over the ingested window of steps."""

    def __init__(self, num_rows: int, capacity: int = 1024) -> None:
        # One record per row (next read, newest entry), so that a row costs one cache miss, not two:
        # the window is touched once per step, after the model has evicted it from the caches.
        per_row = np.empty((num_rows, 2), dtype=np.int64)
        per_row[:, 0] = INF
        per_row[:, 1] = -1
        self._per_row = per_row
        self.next_read = per_row[:, 0]
        self.last_step = -1  # W: newest ingested step
        self._steps: Deque[Tuple[int, int, int]] = deque()  # (step, first entry, end entry)
        self._lo = 0  # global index of the oldest live entry
        self._hi = 0  # global index one past the newest entry
        # Entry e at ring[e & (len - 1)]: (row, step of the row's next entry or INF); a power of
        # two long, so that an entry's place is a mask, not a division.
        self._ring = np.empty((_power_of_two(capacity), 2), dtype=np.int64)

    def add_step(self, step: int, rows: np.ndarray) -> np.ndarray:
        """Ingest the (unique) rows read from host at ``step``; returns rows whose next read was INF."""
        if step != self.last_step + 1:
            raise RuntimeError(f"lookahead steps must arrive in order: got {step} after {self.last_step}")
        rows = np.asarray(rows, dtype=np.int64)
        n = rows.shape[0]
        self._reserve(n)
        self.last_step = step
        newly = np.empty(n, dtype=np.int64)
        k = add_step(rows, step, self._per_row, self._ring, self._lo, self._hi, INF, newly)
        self._steps.append((step, self._hi, self._hi + n))
        self._hi += n
        return newly[:k]

    def retire(self, step: int) -> None:
        """Forget reads at steps <= ``step``; each row they held moves on to its next read."""
        lo = self._lo
        while self._steps and self._steps[0][0] <= step:
            self._lo = self._steps.popleft()[2]
        if self._lo > lo:
            retire_entries(self._per_row, self._ring, lo, self._lo)

    def priorities(self, rows: np.ndarray) -> np.ndarray:
        return self.next_read[rows]

    def _reserve(self, n: int) -> None:
        """Grow the ring (keeping each live entry's global index) so that n more entries fit."""
        cap = self._ring.shape[0]
        need = self._hi - self._lo + n
        if need <= cap:
            return
        grown = np.empty((_power_of_two(max(need, 2 * cap)), 2), dtype=np.int64)
        old = np.arange(self._lo, self._hi, dtype=np.int64)
        grown[old & (grown.shape[0] - 1)] = self._ring[old & (cap - 1)]
        self._ring = grown


def _power_of_two(n: int) -> int:
    """The least power of two >= n (1 for n < 1)."""
    return 1 << max(0, int(n) - 1).bit_length()
