"""An owner's rows of a step summed over ranks: merges of the ranks' sorted runs.

Each rank stages its rows of an owner strictly increasing (:mod:`.owner_groups`), so the owner's
unique rows are a merge of those runs, and each row's sum is made as the merge reaches it: zero,
plus each rank's gradient of the row in rank order, in float32. That is the sum, bit for bit, of
``index_add_`` of every rank's gradients in rank order into zeros, where a sort of the
concatenated runs, the inverse of the unique rows and one scattered add a rank took several
passes. Runs are merged two at a time (the running sum with the next rank's run): a loop over
two fixed runs runs at three times the speed of one over a tuple of runs picked per row.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

from .compiled import kernel


def _merge_twin(
    rows_a: np.ndarray, vals_a: np.ndarray, a_from_zero: bool, rows_b: np.ndarray, grads_b: np.ndarray,
    out_rows: np.ndarray, out_sums: np.ndarray,
) -> int:  # fmt: skip
    for run in (rows_a, rows_b):
        if run.shape[0] > 1 and not bool(np.all(run[1:] > run[:-1])):
            raise ValueError("merge_sum takes strictly increasing runs")
    rows = np.union1d(rows_a, rows_b)
    k = rows.shape[0]
    out_rows[:k] = rows
    sums = out_sums[:k]
    in_a = np.searchsorted(rows, rows_a)
    sums[:] = 0.0
    if a_from_zero:
        sums[in_a] += vals_a
    else:
        sums[in_a] = vals_a
    sums[np.searchsorted(rows, rows_b)] += grads_b
    return k


@kernel(_merge_twin)
def merge_sum(
    rows_a: np.ndarray, vals_a: np.ndarray, a_from_zero: bool, rows_b: np.ndarray, grads_b: np.ndarray,
    out_rows: np.ndarray, out_sums: np.ndarray,
) -> int:  # fmt: skip
    """Merge two strictly increasing runs of non-negative rows into ``out_rows`` (their unique
    rows, sorted) and ``out_sums`` [rows, d] (float32): a row's value of run a (``vals_a``, added
    to zero first where ``a_from_zero``: a rank's gradients, not a running sum) plus its gradient
    of run b (``grads_b``); returns how many rows.

    Raises ValueError where a run is not strictly increasing.
    """
    d = out_sums.shape[1]
    na = rows_a.shape[0]
    nb = rows_b.shape[0]
    zero = np.float32(0.0)
    a = 0
    b = 0
    k = 0
    while a < na or b < nb:
        if b == nb or (a < na and rows_a[a] < rows_b[b]):
            out_rows[k] = rows_a[a]
            if a_from_zero:
                for c in range(d):
                    out_sums[k, c] = zero + vals_a[a, c]
            else:
                for c in range(d):
                    out_sums[k, c] = vals_a[a, c]
            a += 1
        elif a == na or rows_b[b] < rows_a[a]:
            out_rows[k] = rows_b[b]
            for c in range(d):
                out_sums[k, c] = zero + grads_b[b, c]
            b += 1
        else:
            out_rows[k] = rows_a[a]
            if a_from_zero:
                for c in range(d):
                    out_sums[k, c] = (zero + vals_a[a, c]) + grads_b[b, c]
            else:
                for c in range(d):
                    out_sums[k, c] = vals_a[a, c] + grads_b[b, c]
            a += 1
            b += 1
        if (a < na and 0 < a and rows_a[a] <= rows_a[a - 1]) or (b < nb and 0 < b and rows_b[b] <= rows_b[b - 1]):
            raise ValueError("merge_sum takes strictly increasing runs")
        k += 1
    return k


class SumScratch:
    """Two buffers of sums for one summing thread, used in turn by the merges and grown as steps need."""

    def __init__(self, width: int) -> None:
        self.bufs = [np.empty((0, width), dtype=np.float32) for _ in range(2)]

    def sum(self, rows_parts: Sequence[np.ndarray], grads_parts: Sequence[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
        """The unique rows of the strictly increasing runs ``rows_parts`` (one a rank, at least
        one), sorted (a new array), and each row's gradients of ``grads_parts`` summed from zero
        in the runs' order (a view of this scratch, valid until the next call)."""
        total = sum(p.shape[0] for p in rows_parts)
        for i, buf in enumerate(self.bufs):
            if buf.shape[0] < total:
                self.bufs[i] = np.empty((max(total, 2 * buf.shape[0]), buf.shape[1]), dtype=np.float32)
        rows, sums = rows_parts[0], grads_parts[0]
        from_zero = True
        for i in range(1, max(len(rows_parts), 2)):
            rows_b, grads_b = (rows_parts[i], grads_parts[i]) if i < len(rows_parts) else (rows[:0], sums[:0])
            out_rows = np.empty(total, dtype=np.int64)
            out = self.bufs[i % 2]
            k = merge_sum(rows, sums, from_zero, rows_b, grads_b, out_rows, out)
            rows, sums, from_zero = out_rows[:k], out[:k], False
        return rows, sums
