"""Grouping a step's gradients by owner: compiled loops, their plain-Python run and the numpy twin agree."""
from __future__ import annotations

import numpy as np
import pytest

from torchrec_frugal.kernels.compiled import numba_available
from torchrec_frugal.kernels.owner_groups import group_by_owner

RUNS = (group_by_owner, group_by_owner.loops, group_by_owner.twin)


def _case(seed: int, n: int = 300, world: int = 3, dim: int = 5):
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, world, 1000).astype(np.int16)
    rows = np.sort(rng.choice(1000, n, replace=False))
    grads = (rng.standard_normal((n, dim)) * 10.0 ** rng.uniform(-40, 38, (n, 1))).astype(np.float32)
    grads[::7] = -0.0
    return rows, grads, owner


@pytest.mark.parametrize("divide_by", [1, 2, 3])
@pytest.mark.parametrize("seed", range(3))
def test_groups_by_owner_in_row_order(seed: int, divide_by: int) -> None:
    rows, grads, owner = _case(seed)
    by_owner = np.argsort(owner[rows], kind="stable")
    want_grads = grads[by_owner] / np.float32(divide_by) if divide_by != 1 else grads[by_owner]
    for run in RUNS:
        out_rows, out_grads, counts = np.full(400, -1), np.full((400, 5), np.nan, np.float32), np.full(3, -1)
        assert run(rows, grads, owner, divide_by, out_rows, out_grads, counts)
        assert counts.tolist() == np.bincount(owner[rows], minlength=3).tolist()
        assert out_rows[:300].tolist() == rows[by_owner].tolist() and (out_rows[300:] == -1).all()
        np.testing.assert_array_equal(out_grads[:300].view(np.int32), want_grads.view(np.int32))


def test_refuses_rows_not_increasing() -> None:
    rows, grads, owner = _case(0, n=50)
    rows[[10, 11]] = rows[[11, 10]]
    for bad in (rows, np.concatenate([rows[:5], rows[4:5]])):
        for run in RUNS:
            out_rows = np.full(60, -1)
            assert not run(bad, grads[: bad.shape[0]], owner, 1, out_rows, np.zeros((60, 5), np.float32), np.zeros(3, np.int64))
            assert (out_rows == -1).all()


def test_compiled_where_numba_is_installed() -> None:
    assert group_by_owner.compiled == numba_available()
