"""The lookahead window's bookkeeping of a step, one compiled pass a step.

The window (``engine/lookahead/window.py``) keeps, per row, its next read and its newest entry
in one record (``per_row[r] = (next read, newest entry)``), and every read of the window as an
entry of a ring (``ring[e & mask] = (row, step of the row's next entry)``), a power of two long.
Ingesting a step reads each row's record once and writes its entry; retiring one moves each row
it held on to the step its entry links to. The records are read in a loop of their own and the
loops have no branch, so that the cache misses of successive rows overlap.
"""
from __future__ import annotations

import numpy as np

from .compiled import kernel


def _add_twin(rows: np.ndarray, step: int, per_row: np.ndarray, ring: np.ndarray, lo: int, hi: int, inf: int,
              newly: np.ndarray) -> int:  # fmt: skip
    mask = ring.shape[0] - 1
    entries = np.arange(hi, hi + rows.shape[0], dtype=np.int64)
    prev = per_row[rows, 1]
    live = prev >= lo
    ring[prev[live] & mask, 1] = step
    ring[entries & mask, 0] = rows
    ring[entries & mask, 1] = inf
    per_row[rows, 1] = entries
    fresh = rows[~live]
    per_row[fresh, 0] = step
    newly[: fresh.shape[0]] = fresh
    return fresh.shape[0]


@kernel(_add_twin)
def add_step(rows: np.ndarray, step: int, per_row: np.ndarray, ring: np.ndarray, lo: int, hi: int, inf: int,
             newly: np.ndarray) -> int:  # fmt: skip
    """Ingests ``step``'s unique ``rows`` as the ring's entries ``hi, hi + 1, ...``; entries below
    ``lo`` are retired. Writes the rows that had no live entry (their next read was ``inf``, now
    ``step``) into ``newly``, in the rows' order, and returns how many.

    ``per_row``: int64 [rows, 2]; ``ring``: int64 [2^k, 2] with room for the step's entries.
    """
    mask = ring.shape[0] - 1
    n = rows.shape[0]
    prev = np.empty(n, dtype=np.int64)
    for i in range(n):  # the misses only, so that they overlap: the writes below hit the cache
        prev[i] = per_row[rows[i], 1]
    k = 0
    for i in range(n):
        r = rows[i]
        e = hi + i
        live = prev[i] >= lo
        # A live entry links on to this step; else the link written is this entry's, reset below.
        ring[(prev[i] if live else e) & mask, 1] = step
        ring[e & mask, 0] = r
        ring[e & mask, 1] = inf
        per_row[r, 1] = e
        per_row[r, 0] = per_row[r, 0] if live else step
        newly[k] = r
        k += not live
    return k


def _retire_twin(per_row: np.ndarray, ring: np.ndarray, lo: int, hi: int) -> None:
    at = np.arange(lo, hi, dtype=np.int64) & (ring.shape[0] - 1)
    per_row[ring[at, 0], 0] = ring[at, 1]


@kernel(_retire_twin)
def retire_entries(per_row: np.ndarray, ring: np.ndarray, lo: int, hi: int) -> None:
    """Retires the ring's entries ``lo .. hi - 1``: each one's row moves on to its next read."""
    mask = ring.shape[0] - 1
    for e in range(lo, hi):
        at = e & mask
        per_row[ring[at, 0], 0] = ring[at, 1]
