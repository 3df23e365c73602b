"""The lookahead window's kernels: compiled loops, their plain-Python run and the numpy twin agree,
with each other and with the window as it was written in numpy."""
from __future__ import annotations

import numpy as np
import pytest

from torchrec_frugal.kernels.compiled import numba_available
from torchrec_frugal.kernels.read_window import add_step, retire_entries

INF = np.iinfo(np.int64).max


class NumpyWindow:
    """The window before its kernels: two flat arrays for the ring, a division for an entry's place."""

    def __init__(self, num_rows: int, capacity: int) -> None:
        self.next_read = np.full(num_rows, INF, dtype=np.int64)
        self.latest = np.full(num_rows, -1, dtype=np.int64)
        self.rows = np.empty(capacity, dtype=np.int64)
        self.link = np.empty(capacity, dtype=np.int64)
        self.steps: list = []
        self.lo = self.hi = 0

    def add(self, step: int, rows: np.ndarray) -> np.ndarray:
        cap, n = self.rows.shape[0], rows.shape[0]
        entries = np.arange(self.hi, self.hi + n, dtype=np.int64)
        prev = self.latest[rows]
        live = prev >= self.lo
        self.link[prev[live] % cap] = step
        self.rows[entries % cap] = rows
        self.link[entries % cap] = INF
        self.latest[rows] = entries
        self.steps.append((step, self.hi, self.hi + n))
        self.hi += n
        self.next_read[rows[~live]] = step
        return rows[~live]

    def retire(self, step: int) -> None:
        cap = self.rows.shape[0]
        while self.steps and self.steps[0][0] <= step:
            _, lo, hi = self.steps.pop(0)
            at = np.arange(lo, hi, dtype=np.int64) % cap
            self.next_read[self.rows[at]] = self.link[at]
            self.lo = hi


@pytest.mark.parametrize("run", ["compiled", "loops", "twin"])
@pytest.mark.parametrize("seed", range(3))
def test_add_and_retire_match_the_numpy_window(run: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_rows, cap = 300, 1024  # room for every live entry: a power of two, as the window keeps it
    add = add_step if run == "compiled" else getattr(add_step, run)
    retire = retire_entries if run == "compiled" else getattr(retire_entries, run)
    ref = NumpyWindow(num_rows, cap)
    per_row = np.empty((num_rows, 2), dtype=np.int64)
    per_row[:, 0], per_row[:, 1] = INF, -1
    ring = np.empty((cap, 2), dtype=np.int64)
    steps: list = []
    lo = hi = 0
    for step in range(60):
        rows = rng.choice(num_rows, size=int(rng.integers(0, 60)), replace=False).astype(np.int64)
        newly = np.empty(rows.shape[0], dtype=np.int64)
        k = add(rows, step, per_row, ring, lo, hi, INF, newly)
        assert newly[:k].tolist() == ref.add(step, rows).tolist()
        steps.append((step, hi + rows.shape[0]))
        hi += rows.shape[0]
        if step % 3 == 2:  # retire two steps at once, as one range of entries
            upto = step - int(rng.integers(1, 8))
            ref.retire(upto)
            end = lo
            while steps and steps[0][0] <= upto:
                end = steps.pop(0)[1]
            if end > lo:
                retire(per_row, ring, lo, end)
                lo = end
        np.testing.assert_array_equal(per_row[:, 0], ref.next_read)


def test_compiled_where_numba_is_installed() -> None:
    assert add_step.compiled == numba_available()
