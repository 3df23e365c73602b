"""A step's lookup on a CPU device: each row from the owner store if this rank holds it, else from host.

One pass deduplicates the step's ids (a step of 26,624 ids holds about 5,300 rows), one reads
each distinct row once from wherever it is, one writes every id's row into the output. Reading
each id straight from a table of millions of rows costs a TLB miss an id, as its rows lie on
pages of their own; the distinct rows in a compact buffer stay in cache while the output is
written. The deduplication marks rows in ``seen`` (one int32 a row of the table), a sparse set:
``seen[r]`` is trusted only if the distinct row it points at is ``r``, so ``seen`` is never cleared.
"""
from __future__ import annotations

import numpy as np

from .compiled import kernel


class GatherScratch:
    """The scratch arrays of :func:`gather_rows` for one reading thread, grown as steps need."""

    def __init__(self, num_rows: int, width: int) -> None:
        self.seen = np.zeros(num_rows, dtype=np.int32)
        self.width = width
        self._grow(0)

    def _grow(self, n: int) -> None:
        self.distinct = np.empty(n, dtype=np.int64)
        self.inverse = np.empty(n, dtype=np.int32)
        self.counts = np.empty(n, dtype=np.int32)
        self.rows = np.empty((n, self.width), dtype=np.float32)
        self.slots = np.empty(n, dtype=np.int64)
        self.sink = np.zeros(1, dtype=np.float32)

    def gather(self, ids: np.ndarray, slot_of: np.ndarray, num_static: int, store: np.ndarray, host: np.ndarray,
               out: np.ndarray) -> int:  # fmt: skip
        """:func:`gather_rows` with this scratch; returns the ids found in static slots (-1: an
        id out of range, nothing read)."""
        if self.distinct.shape[0] < ids.shape[0]:
            self._grow(max(ids.shape[0], 2 * self.distinct.shape[0]))
        return int(gather_rows(ids, slot_of, num_static, store, host, self.seen, self.distinct, self.inverse,
                               self.counts, self.rows, out, self.slots, self.sink))  # fmt: skip


def _gather_twin(
    ids: np.ndarray, slot_of: np.ndarray, num_static: int, store: np.ndarray, host: np.ndarray,
    seen: np.ndarray, distinct: np.ndarray, inverse: np.ndarray, counts: np.ndarray, rows: np.ndarray, out: np.ndarray,
    slots: np.ndarray, sink: np.ndarray,
) -> int:  # fmt: skip
    if ids.size and (ids.min() < 0 or ids.max() >= slot_of.shape[0]):
        return -1
    at = slot_of[ids]
    held = at >= 0
    out[held] = store[at[held]]
    out[~held] = host[ids[~held]]
    return int(np.count_nonzero(held & (at < num_static)))


@kernel(_gather_twin)
def gather_rows(
    ids: np.ndarray, slot_of: np.ndarray, num_static: int, store: np.ndarray, host: np.ndarray,
    seen: np.ndarray, distinct: np.ndarray, inverse: np.ndarray, counts: np.ndarray, rows: np.ndarray, out: np.ndarray,
    slots: np.ndarray, sink: np.ndarray,
) -> int:  # fmt: skip
    """``out[i]`` = ``store[slot_of[ids[i]]]`` where that slot is >= 0, else ``host[ids[i]]``;
    returns how many ids have a static slot (below ``num_static``), or -1, having written nothing
    into ``out``, where an id is outside ``slot_of`` (the table's rows).

    ``seen``: int32 scratch of the table's rows (any content); ``distinct`` and ``slots`` (int64),
    ``inverse`` and ``counts`` (int32) and ``rows`` (float32, as wide as ``out``): scratch of
    ``len(ids)``; ``sink``: float32 [1] scratch.
    """
    n = ids.shape[0]
    d = out.shape[1]
    num_rows = slot_of.shape[0]
    k = 0
    for i in range(n):
        r = ids[i]
        if r < 0 or r >= num_rows:
            return -1
        j = seen[r]
        if j < k and distinct[j] == r:
            counts[j] += 1
        else:
            j = k
            seen[r] = j
            distinct[j] = r
            counts[j] = 1
            k += 1
        inverse[i] = j
    # The distinct rows' slots, then one value of each row, each a loop of loads independent of
    # one another, whose misses overlap; the copy's loop, 32 loads a row, has few rows in flight.
    for j in range(k):
        slots[j] = slot_of[distinct[j]]
    touched = np.float32(0)
    for j in range(k):
        s = slots[j]
        touched += store[s, 0] if s >= 0 else host[distinct[j], 0]
    sink[0] = touched  # the loads' only use: kept, not optimized away
    static_hits = 0
    for j in range(k):
        r = distinct[j]
        s = slots[j]
        if s >= 0:
            if s < num_static:
                static_hits += counts[j]
            for c in range(d):
                rows[j, c] = store[s, c]
        else:
            for c in range(d):
                rows[j, c] = host[r, c]
    for i in range(n):
        j = inverse[i]
        for c in range(d):
            out[i, c] = rows[j, c]
    return static_hits
