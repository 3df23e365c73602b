"""Row-wise Adagrad applied by an owner to its rows of a step, wherever each row lives.

An owner's rows of a step sit in three places: its static or dynamic store slots (updated
there), host memory updated in place (uncached rows on a CPU device), or host memory to be
moved into a freshly allocated dynamic slot (uncached rows where updates are flushed later). Two
passes read each row where it is and write it where it goes, where splitting the rows by place,
filling the fresh slots and updating each part with a dozen whole-array calls took a pass a call.

The arithmetic is :func:`~torchrec_frugal.engine.optimizers.apply_update`'s, one float32
operation at a time in the same order: ``m += sum(g * g) / d``, ``k = lr / (sqrt(m) + eps)``,
``w -= g * k``. Additions, products and quotients are correctly rounded here as in torch; the
sum of squares (a reduction, in an order of torch's vector width) and the square root (torch's
vectorized float32 square root is not the correctly rounded one) are not, so the caller
computes both with torch, the square roots between :func:`adagrad_state` and :func:`adagrad_rows`.
"""
from __future__ import annotations

import numpy as np

from .compiled import kernel


def _state_twin(
    rows: np.ndarray, slot_of: np.ndarray, square_sum: np.ndarray, d: int, store_s: np.ndarray, host_s: np.ndarray,
    slots: np.ndarray, m: np.ndarray, uncached: np.ndarray,
) -> int:  # fmt: skip
    slots[:] = slot_of[rows]
    in_host = slots < 0
    m[in_host] = host_s[rows[in_host], 0]
    m[~in_host] = store_s[slots[~in_host], 0]
    m += square_sum / np.float32(d)
    u = int(np.count_nonzero(in_host))
    uncached[:u] = rows[in_host]
    return u


@kernel(_state_twin)
def adagrad_state(
    rows: np.ndarray, slot_of: np.ndarray, square_sum: np.ndarray, d: int, store_s: np.ndarray, host_s: np.ndarray,
    slots: np.ndarray, m: np.ndarray, uncached: np.ndarray,
) -> int:  # fmt: skip
    """``slots[i]`` = ``slot_of[rows[i]]`` and ``m[i]`` = that row's state plus its mean square
    ``square_sum[i] / d`` (float32), the state read from its store slot (``store_s`` [slots, 1])
    or, where the slot is < 0, from host (``host_s`` [rows, 1]). The rows without a slot go to
    ``uncached``, in order; returns how many."""
    dim = np.float32(d)
    u = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        s = slot_of[r]
        slots[i] = s
        mean_sq = np.divide(square_sum[i], dim)
        if s < 0:
            m[i] = host_s[r, 0] + mean_sq
            uncached[u] = r
            u += 1
        else:
            m[i] = store_s[s, 0] + mean_sq
    return u


def _rows_twin(
    rows: np.ndarray, slots: np.ndarray, new_slots: np.ndarray, m: np.ndarray, root: np.ndarray, grads: np.ndarray,
    lr: float, eps: float, store_w: np.ndarray, store_s: np.ndarray, host_w: np.ndarray, host_s: np.ndarray,
    held: np.ndarray, sink: np.ndarray,
) -> int:  # fmt: skip
    fresh = slots < 0
    if new_slots.shape[0]:
        slots = slots.copy()
        slots[fresh] = new_slots
    else:
        fresh[:] = False
    in_host = slots < 0
    from_host = in_host | fresh
    w = np.empty_like(grads)
    w[from_host] = host_w[rows[from_host]]
    w[~from_host] = store_w[slots[~from_host]]
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.float32(lr) / (root + np.float32(eps))
        w -= grads * k[:, None]
    host_w[rows[in_host]], host_s[rows[in_host], 0] = w[in_host], m[in_host]
    store_w[slots[~in_host]], store_s[slots[~in_host], 0] = w[~in_host], m[~in_host]
    h = rows.shape[0] - int(np.count_nonzero(in_host))
    held[:h] = rows[~in_host]
    return h


@kernel(_rows_twin)
def adagrad_rows(
    rows: np.ndarray, slots: np.ndarray, new_slots: np.ndarray, m: np.ndarray, root: np.ndarray, grads: np.ndarray,
    lr: float, eps: float, store_w: np.ndarray, store_s: np.ndarray, host_w: np.ndarray, host_s: np.ndarray,
    held: np.ndarray, sink: np.ndarray,
) -> int:  # fmt: skip
    """Update the unique ``rows`` with their ``grads`` [n, d]: ``w -= g * (lr / (root + eps))``
    and the state set to ``m`` (from :func:`adagrad_state`; ``root``: its square roots), all
    float32. Row i is read from and written to store slot ``slots[i]`` (weights ``store_w``, state
    ``store_s``) where that is >= 0. The rows whose slot is < 0 are updated in host (``host_w``,
    ``host_s``) in place, or, where ``new_slots`` is not empty (a slot for each of them, in
    order), read from host and written to their new slot. The rows updated in the store go to
    ``held``, in order; returns how many. ``sink``: float32 [1] scratch (see :mod:`.prefetch`).
    """
    lr32 = np.float32(lr)
    eps32 = np.float32(eps)
    d = grads.shape[1]
    allocate = new_slots.shape[0] > 0
    # Touch each row's weights first (where the update reads them): a loop of independent loads,
    # whose misses overlap, where the update's loop has a few rows in flight at most.
    touched = np.float32(0)
    for i in range(rows.shape[0]):
        s = slots[i]
        touched += store_w[s, 0] if s >= 0 else host_w[rows[i], 0]
    sink[0] = touched
    j = 0
    h = 0
    # One loop per place, each on fixed arrays: a loop over arrays picked per row runs at half speed.
    for i in range(rows.shape[0]):
        r = rows[i]
        s = slots[i]
        k = np.divide(lr32, root[i] + eps32)  # IEEE where the sum is 0 (no ZeroDivisionError)
        if s >= 0:
            for c in range(d):
                store_w[s, c] = store_w[s, c] - grads[i, c] * k
        elif allocate:
            s = new_slots[j]
            j += 1
            for c in range(d):
                store_w[s, c] = host_w[r, c] - grads[i, c] * k
        else:
            for c in range(d):
                host_w[r, c] = host_w[r, c] - grads[i, c] * k
            host_s[r, 0] = m[i]
            continue
        store_s[s, 0] = m[i]
        held[h] = r
        h += 1
    return h
