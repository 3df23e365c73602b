"""The distinct rows of a step's ids, in the order of their last occurrence, by a bitmap of the table.

A step's 26,624 ids hold about 5,300 distinct rows. One bit a row of the table (211 KB for 1.7
million rows) fits in a core's L2 cache, where an int32 mark a row (6.8 MB) does not: each id is
then tested and marked without a cache miss, and without a branch, so that the loads of
successive ids overlap. The bitmap is clear between calls: a call clears the words it marked.
When the bitmap is small beside the ids, a call first streams it into the cache by writing its
(already clear) words in order, which costs less than the misses of the ids' first touches.
"""
from __future__ import annotations

import numpy as np

from .compiled import kernel


def bitmap(num_rows: int) -> np.ndarray:
    """A clear bitmap of ``num_rows`` rows for :func:`unique_rows`."""
    return np.zeros((num_rows + 63) // 64, dtype=np.uint64)


def _unique_twin(ids: np.ndarray, bits: np.ndarray, out: np.ndarray) -> int:
    _, first = np.unique(ids[::-1], return_index=True)
    k = first.shape[0]
    out[:k] = ids[np.sort(ids.shape[0] - 1 - first)]
    return k


@kernel(_unique_twin)
def unique_rows(ids: np.ndarray, bits: np.ndarray, out: np.ndarray) -> int:
    """Writes the distinct ``ids`` into ``out`` in the order of their last occurrence (as
    a marking of a scratch array keeps them, as the ring did before); returns how many.

    ``bits``: a clear :func:`bitmap` of the table's rows (left clear); ``out``: int64, at least ``len(ids)``.
    """
    n = ids.shape[0]
    if bits.shape[0] <= 32 * n:  # a line of 8 words streamed costs less than a quarter of a miss
        bits[:] = 0  # clear already: in order, it brings the bitmap into the cache
    one = np.uint64(1)
    k = 0
    for i in range(n - 1, -1, -1):  # from the end: each row at its last occurrence, then reversed
        r = ids[i]
        w = r >> 6
        m = one << np.uint64(r & 63)
        b = bits[w]
        out[k] = r
        k += (b & m) == 0
        bits[w] = b | m
    for j in range(k // 2):
        out[j], out[k - 1 - j] = out[k - 1 - j], out[j]
    for j in range(k):
        bits[out[j] >> 6] = 0
    return k
