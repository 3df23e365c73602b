"""Radix sorts of ids: the same permutation as a stable sort, the same unique rows and inverse as
``torch.unique``, for ids below 2^16 (one pass), below 2^32 (two), beyond, and none; the runs
of each unique id in the sort (``sorted_unique``); and the numpy helpers giving exactly what
``np.unique`` gives (values, inverse, dtypes, order)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchrec_frugal.int_sort import (
    sorted_unique,
    stable_argsort,
    stable_argsort_np,
    unique_inverse,
    unique_inverse_np,
)


@pytest.mark.parametrize("bound", [1, 3, 1 << 16, (1 << 16) + 7, 3_000_000, 1 << 33])
@pytest.mark.parametrize("n", [0, 1, 17, 26_624, 40_000])
def test_same_permutation_as_a_stable_sort(bound: int, n: int) -> None:
    ids = torch.randint(0, bound, (n,), generator=torch.Generator().manual_seed(n + bound), dtype=torch.int64)
    expected = torch.argsort(ids, stable=True)
    got = stable_argsort(ids)
    assert got.dtype == torch.int64 and torch.equal(got, expected)
    assert np.array_equal(stable_argsort_np(ids.numpy().astype(np.int32 if bound < 1 << 31 else np.int64)), expected.numpy())
    rows, inverse = unique_inverse(ids)
    ref_rows, ref_inverse = torch.unique(ids, sorted=True, return_inverse=True)
    assert rows.dtype == ref_rows.dtype and torch.equal(rows, ref_rows)
    assert inverse.dtype == ref_inverse.dtype and torch.equal(inverse, ref_inverse)


def test_negative_keys_sort_too() -> None:
    keys = np.array([3, -1, 2, -1, 0, 70_000, -5], dtype=np.int64)
    assert stable_argsort_np(keys).tolist() == np.argsort(keys, kind="stable").tolist()


@pytest.mark.parametrize("bound", [1, 5, 3_000_000])
@pytest.mark.parametrize("n", [0, 1, 9, 30_000])
def test_sorted_unique_runs(bound: int, n: int) -> None:
    ids = torch.randint(0, bound, (n,), generator=torch.Generator().manual_seed(n * 7 + bound), dtype=torch.int64)
    u = sorted_unique(ids)
    ref_rows, ref_inverse, ref_counts = torch.unique(ids, sorted=True, return_inverse=True, return_counts=True)
    assert torch.equal(u.values, ref_rows) and torch.equal(u.inverse, ref_inverse)
    assert torch.equal(u.order, torch.argsort(ids, stable=True))
    assert u.starts.tolist() == [0] + torch.cumsum(ref_counts, 0).tolist()
    for r in range(u.values.numel()):  # row r's run lists its ids' positions, in order
        run = u.order[u.starts[r] : u.starts[r + 1]]
        assert torch.equal(run, torch.nonzero(ids == u.values[r]).flatten())
        if r > 20:
            break


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("bound", [1, 3, 1 << 16, 3_000_000, 1 << 33])
@pytest.mark.parametrize("n", [0, 1, 2, 50, 3000])
def test_unique_inverse_np_equals_numpy_unique(dtype: type, bound: int, n: int) -> None:
    """Values, inverse, their dtypes and order as ``np.unique``: ``plan_lookup`` relies on it."""
    if dtype is np.int32 and bound > 1 << 31:
        pytest.skip("beyond int32")
    rng = np.random.default_rng(n * 31 + bound)
    ids = rng.integers(0, bound, size=n).astype(dtype)  # bound below n: duplicates
    values, inverse = unique_inverse_np(ids)
    ref_values, ref_inverse = np.unique(ids, return_inverse=True)
    assert values.dtype == ref_values.dtype and np.array_equal(values, ref_values)
    assert inverse.dtype == ref_inverse.dtype and inverse.shape == ids.shape and np.array_equal(inverse, ref_inverse)
    np.testing.assert_array_equal(values[inverse], ids)


def test_first_repeat_finds_a_repeated_value_or_none() -> None:
    from torchrec_frugal.int_sort import first_repeat

    assert first_repeat(np.array([1, 4, 9], dtype=np.int64)) is None
    assert first_repeat(np.array([9, 1, 4], dtype=np.int64)) is None  # unique, not sorted
    assert first_repeat(np.array([9, 1, 4, 1], dtype=np.int64)) == 1
    assert first_repeat(np.array([3, 3], dtype=np.int64)) == 3
    assert first_repeat(np.zeros(0, dtype=np.int64)) is None
