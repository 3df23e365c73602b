"""The bitmap deduplication: compiled loops, their plain-Python run and the numpy twin agree."""
from __future__ import annotations

import numpy as np
import pytest

from first_seen import first_seen_unique
from torchrec_frugal.kernels.compiled import numba_available
from torchrec_frugal.kernels.unique_rows import bitmap, unique_rows

RUNS = (unique_rows, unique_rows.loops, unique_rows.twin)


def _ids(seed: int, num_rows: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.zipf(1.3, n).astype(np.int64) * 7919) % num_rows  # repeats, spread over the table


@pytest.mark.parametrize("num_rows, n", [(500, 400), (1_000_000, 300), (64, 0), (65, 1), (1, 5)])
@pytest.mark.parametrize("seed", range(3))
def test_distinct_in_the_order_of_last_occurrence(seed: int, num_rows: int, n: int) -> None:
    """Both ways of clearing (all the bitmap when small beside the ids, else the words marked)."""
    ids = _ids(seed, num_rows, n)
    want = first_seen_unique(ids, num_rows)
    for run in RUNS:
        bits = bitmap(num_rows)
        out = np.full(n, -1, dtype=np.int64)
        k = run(ids, bits, out)
        assert out[:k].tolist() == want.tolist()
        assert not bits.any()  # left clear for the next call


def test_reused_bitmap() -> None:
    bits = bitmap(1000)
    for seed in range(5):
        ids = _ids(seed, 1000, 50 + 100 * seed)
        out = np.empty(ids.shape[0], dtype=np.int64)
        k = unique_rows(ids, bits, out)
        assert out[:k].tolist() == first_seen_unique(ids, 1000).tolist()


def test_compiled_where_numba_is_installed() -> None:
    assert unique_rows.compiled == numba_available()
