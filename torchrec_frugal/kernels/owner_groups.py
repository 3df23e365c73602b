"""A rank's gradients of a step grouped by owning rank, as the gradient exchange stages them.

A stable counting sort by owner: one pass counts each owner's rows, one copies every row and its
gradient straight to its place in the mailbox (divided on the way where asked), where an argsort
by owner, two gathers, a division and a bincount took five passes and as many calls. Rows keep
their order within their owner's group: strictly increasing rows give strictly increasing groups,
which owners merge without sorting (:mod:`.gradient_sum`).
"""
from __future__ import annotations

import numpy as np

from .compiled import kernel


def _group_twin(
    rows: np.ndarray, grads: np.ndarray, owner: np.ndarray, divide_by: int,
    out_rows: np.ndarray, out_grads: np.ndarray, counts: np.ndarray,
) -> bool:  # fmt: skip
    n = rows.shape[0]
    if n > 1 and not bool(np.all(rows[1:] > rows[:-1])):
        return False
    own = owner[rows]
    order = np.argsort(own, kind="stable")
    out_rows[:n] = rows[order]
    if divide_by == 1:
        out_grads[:n] = grads[order]
    else:
        np.divide(grads[order], np.float32(divide_by), out=out_grads[:n])
    counts[:] = np.bincount(own, minlength=counts.shape[0])
    return True


@kernel(_group_twin)
def group_by_owner(
    rows: np.ndarray, grads: np.ndarray, owner: np.ndarray, divide_by: int,
    out_rows: np.ndarray, out_grads: np.ndarray, counts: np.ndarray,
) -> bool:  # fmt: skip
    """Write ``rows`` [n] and ``grads`` [n, d] (divided by ``divide_by`` in float32 unless it is 1)
    grouped by ``owner[row]`` into ``out_rows`` and ``out_grads``, each group in the rows' order,
    and each owner's count into ``counts`` [world]; returns True.

    Returns False, having written nothing, where ``rows`` are not strictly increasing.
    """
    n = rows.shape[0]
    world = counts.shape[0]
    d = grads.shape[1]
    own = np.empty(n, dtype=np.int64)  # each row's owner, looked up once (a scattered read)
    at = np.zeros(world, dtype=np.int64)
    for i in range(n):
        if i > 0 and rows[i] <= rows[i - 1]:
            return False
        o = owner[rows[i]]
        own[i] = o
        at[o] += 1
    start = 0
    for o in range(world):
        counts[o] = at[o]
        at[o] = start
        start += counts[o]
    if divide_by == 1:
        for i in range(n):
            j = at[own[i]]
            at[own[i]] = j + 1
            out_rows[j] = rows[i]
            for c in range(d):
                out_grads[j, c] = grads[i, c]
    else:
        divisor = np.float32(divide_by)
        for i in range(n):
            j = at[own[i]]
            at[own[i]] = j + 1
            out_rows[j] = rows[i]
            for c in range(d):
                out_grads[j, c] = np.divide(grads[i, c], divisor)  # IEEE, as torch's
    return True
