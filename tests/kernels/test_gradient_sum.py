"""Merging ranks' sorted runs into sums: compiled loops, their plain-Python run and the numpy twin
agree, and equal a sum from zero in rank order bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from torchrec_frugal.kernels.compiled import numba_available
from torchrec_frugal.kernels.gradient_sum import SumScratch, merge_sum

RUNS = (merge_sum, merge_sum.loops, merge_sum.twin)


def _run(rng: np.random.Generator, n: int, dim: int = 4):
    rows = np.sort(rng.choice(300, n, replace=False))
    grads = (rng.standard_normal((n, dim)) * 10.0 ** rng.uniform(-40, 38, (n, 1))).astype(np.float32)
    grads[rng.random(n) < 0.2] = -0.0
    return rows, grads


def _expected(runs):
    """Zero plus each run's gradient of a row, in run order (what index_add_ in rank order gives)."""
    rows = np.unique(np.concatenate([r for r, _ in runs]))
    sums = np.zeros((rows.shape[0], runs[0][1].shape[1]), np.float32)
    for r, g in runs:
        at = np.searchsorted(rows, r)
        sums[at] = sums[at] + g
    return rows, sums


@pytest.mark.parametrize("a_from_zero", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_merge_sums_two_runs(seed: int, a_from_zero: bool) -> None:
    rng = np.random.default_rng(seed)
    (ra, ga), (rb, gb) = _run(rng, int(rng.integers(0, 120))), _run(rng, int(rng.integers(0, 120)))
    want_rows, want = _expected([(ra, ga), (rb, gb)])
    if not a_from_zero:  # a running sum is taken as it is (a negative zero stays one), then b added
        want[:] = 0.0
        want[np.searchsorted(want_rows, ra)] = ga
        at = np.searchsorted(want_rows, rb)
        want[at] = want[at] + gb
    for run in RUNS:
        out_rows, out = np.full(250, -1), np.full((250, 4), np.nan, np.float32)
        k = run(ra, ga, a_from_zero, rb, gb, out_rows, out)
        assert out_rows[:k].tolist() == want_rows.tolist()
        np.testing.assert_array_equal(out[:k].view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_scratch_sums_any_number_of_runs_in_run_order(world: int) -> None:
    rng = np.random.default_rng(world)
    scratch = SumScratch(4)
    for step in range(3):  # the buffers are reused and grown
        runs = [_run(rng, int(rng.integers(0, 40 + 60 * step))) for _ in range(world)]
        rows, sums = scratch.sum([r for r, _ in runs], [g for _, g in runs])
        want_rows, want = _expected(runs)
        assert rows.tolist() == want_rows.tolist()
        np.testing.assert_array_equal(sums.view(np.int32), want.view(np.int32))


def test_refuses_runs_not_increasing() -> None:
    rows, grads = _run(np.random.default_rng(0), 20)
    bad = rows[::-1].copy()
    for run in RUNS:
        with pytest.raises(ValueError, match="strictly increasing"):
            run(rows, grads, True, bad, grads, np.empty(40, np.int64), np.empty((40, 4), np.float32))


def test_compiled_where_numba_is_installed() -> None:
    assert merge_sum.compiled == numba_available()
