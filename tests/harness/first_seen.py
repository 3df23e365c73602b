"""The order in which the ring published a step's unique rows before its kernels: of each repeated
value the position kept is the last one a fancy assignment leaves (the reference the kernels keep)."""
from __future__ import annotations

import numpy as np


def first_seen_unique(values: np.ndarray, bound: int) -> np.ndarray:
    """The unique ``values`` (in ``[0, bound)``), in the order the marking of a scratch array keeps."""
    n = values.shape[0]
    if n <= 1:
        return values
    seen = np.zeros(bound, dtype=np.int32)
    at = np.arange(n, dtype=np.int32)
    seen[values] = at
    return values[seen[values] == at]
