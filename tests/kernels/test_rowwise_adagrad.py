"""Row-wise Adagrad's row passes: compiled loops, their plain-Python run and the numpy twin agree
with each other and with the arithmetic written out in float32, wherever a row lives."""
from __future__ import annotations

import numpy as np
import pytest

from torchrec_frugal.kernels.compiled import numba_available
from torchrec_frugal.kernels.rowwise_adagrad import adagrad_rows, adagrad_state

ROWS, SLOTS, DIM = 400, 300, 6


def _case(seed: int, n: int = 120):
    rng = np.random.default_rng(seed)
    host_w = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    host_s = rng.random((ROWS, 1)).astype(np.float32)
    store_w = rng.standard_normal((SLOTS, DIM)).astype(np.float32)
    store_s = rng.random((SLOTS, 1)).astype(np.float32)
    slot_of = np.full(ROWS, -1, dtype=np.int64)
    slot_of[rng.choice(ROWS, 100, replace=False)] = rng.choice(100, 100, replace=False)
    rows = np.sort(rng.choice(ROWS, n, replace=False))
    grads = (rng.standard_normal((n, DIM)) * 0.1).astype(np.float32)
    return rng, rows, grads, slot_of, (store_w, store_s, host_w, host_s)


@pytest.mark.parametrize("seed", range(4))
def test_state_pass(seed: int) -> None:
    _, rows, grads, slot_of, (_, store_s, _, host_s) = _case(seed)
    square_sum = (grads * grads).sum(1)  # any float32 values: the kernel only divides and adds them
    slots_want = slot_of[rows]
    old = np.where(slots_want < 0, host_s[rows, 0], store_s[np.maximum(slots_want, 0), 0])
    want = old + square_sum / np.float32(DIM)
    for run in (adagrad_state, adagrad_state.loops, adagrad_state.twin):
        slots, m, uncached = np.empty(rows.shape[0], np.int64), np.empty(rows.shape[0], np.float32), np.empty_like(rows)
        u = run(rows, slot_of, square_sum, DIM, store_s, host_s, slots, m, uncached)
        assert uncached[:u].tolist() == rows[slots_want < 0].tolist()
        assert slots.tolist() == slots_want.tolist()
        np.testing.assert_array_equal(m.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("allocate", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_rows_pass_reads_and_writes_each_row_where_it_lives(seed: int, allocate: bool) -> None:
    """Rows with a slot are updated there; the others in host in place, or, given a new slot
    each, read from host and written to that slot."""
    rng, rows, grads, slot_of, tables = _case(seed)
    n = rows.shape[0]
    slots = slot_of[rows]
    uncached = slots < 0
    new_slots = 100 + rng.permutation(int(uncached.sum())) if allocate else np.zeros(0, np.int64)
    m = rng.random(n).astype(np.float32)
    root = np.sqrt(m)
    lr, eps = 0.05, 1e-8
    store_w, store_s, host_w, host_s = tables
    src = np.where(uncached[:, None], host_w[rows], store_w[np.maximum(slots, 0)])
    want_w = src - grads * (np.float32(lr) / (root + np.float32(eps)))[:, None]
    dest = slots.copy()
    if allocate:
        dest[uncached] = new_slots
    in_host = dest < 0
    results = []
    for run in (adagrad_rows, adagrad_rows.loops, adagrad_rows.twin):
        sw, ss, hw, hs = (t.copy() for t in tables)
        held = np.full(n, -1)
        h = run(rows, slots, new_slots, m, root, grads, lr, eps, sw, ss, hw, hs, held, np.zeros(1, np.float32))
        assert held[:h].tolist() == rows[~in_host].tolist()
        np.testing.assert_array_equal(hw[rows[in_host]], want_w[in_host])
        np.testing.assert_array_equal(hs[rows[in_host], 0], m[in_host])
        np.testing.assert_array_equal(sw[dest[~in_host]], want_w[~in_host])
        np.testing.assert_array_equal(ss[dest[~in_host], 0], m[~in_host])
        results.append((sw, ss, hw, hs))
    for other in results[1:]:  # bit for bit, and nothing else touched
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32))
    untouched = np.setdiff1d(np.arange(ROWS), rows[in_host])
    np.testing.assert_array_equal(results[0][2][untouched], host_w[untouched])


def test_rows_pass_divides_by_zero_as_ieee() -> None:
    """lr / (sqrt(0) + 0) is inf (then w - 0 * inf is NaN), as torch computes it, not an error."""
    rows, slots, new_slots = np.array([0]), np.array([-1]), np.zeros(0, np.int64)
    for run in (adagrad_rows, adagrad_rows.twin):
        hw, hs = np.ones((1, 2), np.float32), np.zeros((1, 1), np.float32)
        run(rows, slots, new_slots, np.zeros(1, np.float32), np.zeros(1, np.float32), np.array([[0.0, 1.0]], np.float32),
            0.1, 0.0, hw[:0], hs[:0], hw, hs, np.empty(1, np.int64), np.zeros(1, np.float32))  # fmt: skip
        assert np.isnan(hw[0, 0]) and hw[0, 1] == -np.inf


def test_compiled_where_numba_is_installed() -> None:
    assert adagrad_state.compiled == numba_available() and adagrad_rows.compiled == numba_available()
