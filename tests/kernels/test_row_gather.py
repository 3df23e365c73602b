"""The lookup kernel on a CPU device: compiled loops, their plain-Python run and the numpy twin agree."""
from __future__ import annotations

import numpy as np
import pytest

from torchrec_frugal.kernels.compiled import numba_available
from torchrec_frugal.kernels.row_gather import GatherScratch, gather_rows


def _case(seed: int, num_rows: int = 500, dim: int = 5, n: int = 400):
    rng = np.random.default_rng(seed)
    slot_of = np.full(num_rows, -1, dtype=np.int64)
    held = rng.choice(num_rows, 80, replace=False)
    slot_of[held] = rng.permutation(100)[:80]  # some slots dynamic (>= 60), some static
    store = rng.standard_normal((100, dim)).astype(np.float32)
    host = rng.standard_normal((num_rows, dim)).astype(np.float32)
    ids = rng.zipf(1.3, n).astype(np.int64) % num_rows  # repeats, as a step's ids have
    return ids, slot_of, store, host


def _expected(ids, slot_of, store, host):
    slots = slot_of[ids]
    out = np.where((slots >= 0)[:, None], store[np.maximum(slots, 0)], host[ids])
    return out, int(np.count_nonzero((slots >= 0) & (slots < 60)))


def _run(run, ids, slot_of, store, host, seen):
    """One variant of the kernel with fresh scratch; (its return, the output, NaN where unwritten)."""
    n, d = ids.shape[0], store.shape[1]
    out = np.full((n, d), np.nan, dtype=np.float32)
    hits = run(ids, slot_of, 60, store, host, seen, np.empty(n, np.int64), np.empty(n, np.int32), np.empty(n, np.int32),
               np.empty((n, d), np.float32), out, np.empty(n, np.int64), np.zeros(1, np.float32))  # fmt: skip
    return hits, out


@pytest.mark.parametrize("seed", range(4))
def test_gather_matches_the_numpy_twin_and_the_plain_loops(seed: int) -> None:
    ids, slot_of, store, host = _case(seed)
    want, want_hits = _expected(ids, slot_of, store, host)
    scratch = GatherScratch(slot_of.shape[0], store.shape[1])
    for run in (gather_rows, gather_rows.loops, gather_rows.twin):
        hits, out = _run(run, ids, slot_of, store, host, scratch.seen)
        assert hits == want_hits
        np.testing.assert_array_equal(out, want)


def test_scratch_is_reused_without_clearing() -> None:
    """``seen`` keeps stale marks between calls: they must never be mistaken for this call's rows."""
    scratch = GatherScratch(500, 5)
    for seed in range(6):
        ids, slot_of, store, host = _case(seed, n=50 + 97 * seed)
        out = np.empty((ids.shape[0], 5), dtype=np.float32)
        hits = scratch.gather(ids, slot_of, 60, store, host, out)
        want, want_hits = _expected(ids, slot_of, store, host)
        assert hits == want_hits
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("bad", [-1, 500, 10**9])
def test_an_id_out_of_range_returns_minus_one_and_writes_nothing(bad: int) -> None:
    ids, slot_of, store, host = _case(0)
    ids[len(ids) // 2] = bad
    scratch = GatherScratch(slot_of.shape[0], store.shape[1])
    for run in (gather_rows, gather_rows.loops, gather_rows.twin):
        hits, out = _run(run, ids, slot_of, store, host, scratch.seen)
        assert hits == -1 and np.isnan(out).all()
    ids, slot_of, store, host = _case(1)  # the scratch serves the next call as before
    out = np.empty((ids.shape[0], 5), dtype=np.float32)
    assert scratch.gather(ids, slot_of, 60, store, host, out) == _expected(ids, slot_of, store, host)[1]


def test_compiled_where_numba_is_installed() -> None:
    assert gather_rows.compiled == numba_available()
