"""A flush on a CPU device: rows an owner holds in its store, written into the host tables.

The host tables and the store are both host memory there: one loop reads each row's slot and
copies its weights and optimizer state, where torch would gather each into a new tensor and then
scatter it (two passes and an allocation a table).
"""
from __future__ import annotations

import numpy as np

from .compiled import kernel


def _copy_twin(rows: np.ndarray, slots: np.ndarray, store_w: np.ndarray, store_s: np.ndarray,
               host_w: np.ndarray, host_s: np.ndarray, sink: np.ndarray) -> None:  # fmt: skip
    host_w[rows] = store_w[slots]
    host_s[rows] = store_s[slots]


@kernel(_copy_twin)
def copy_rows_to_host(rows: np.ndarray, slots: np.ndarray, store_w: np.ndarray, store_s: np.ndarray,
                      host_w: np.ndarray, host_s: np.ndarray, sink: np.ndarray) -> None:  # fmt: skip
    """``host_w[rows[i]]`` = ``store_w[slots[i]]`` and ``host_s[rows[i]]`` = ``store_s[slots[i]]``
    for unique ``rows`` and their store ``slots``; ``*_s`` may have no columns. ``sink``: float32
    [1] scratch."""
    dw = host_w.shape[1]
    ds = host_s.shape[1]
    # Both ends of each row touched first, a loop of independent loads whose misses overlap; the
    # copy's loop has a few rows in flight at most.
    touched = np.float32(0)
    for i in range(rows.shape[0]):
        touched += store_w[slots[i], 0] + host_w[rows[i], 0]
    sink[0] = touched  # the loads' only use: kept, not optimized away
    for i in range(rows.shape[0]):
        r = rows[i]
        s = slots[i]
        for c in range(dw):
            host_w[r, c] = store_w[s, c]
        for c in range(ds):
            host_s[r, c] = store_s[s, c]
