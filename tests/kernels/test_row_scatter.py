"""The flush kernel on a CPU device: compiled loops, their plain-Python run and the numpy twin agree."""
from __future__ import annotations

import numpy as np
import pytest

from torchrec_frugal.kernels.compiled import numba_available
from torchrec_frugal.kernels.row_scatter import copy_rows_to_host


@pytest.mark.parametrize("state_width", [0, 1, 3])
def test_copy_matches_the_numpy_twin_and_the_plain_loops(state_width: int) -> None:
    rng = np.random.default_rng(state_width)
    rows = rng.choice(300, 70, replace=False)
    slots = rng.choice(90, 70, replace=False)
    store_w = rng.standard_normal((90, 4)).astype(np.float32)
    store_s = rng.standard_normal((90, state_width)).astype(np.float32)
    host_w0 = rng.standard_normal((300, 4)).astype(np.float32)
    host_s0 = rng.standard_normal((300, state_width)).astype(np.float32)
    want_w, want_s = host_w0.copy(), host_s0.copy()
    for i, (r, s) in enumerate(zip(rows, slots)):
        want_w[r], want_s[r] = store_w[s], store_s[s]
    for run in (copy_rows_to_host, copy_rows_to_host.loops, copy_rows_to_host.twin):
        host_w, host_s = host_w0.copy(), host_s0.copy()
        run(rows, slots, store_w, store_s, host_w, host_s, np.zeros(1, np.float32))
        np.testing.assert_array_equal(host_w, want_w)
        np.testing.assert_array_equal(host_s, want_s)
    assert copy_rows_to_host.compiled == numba_available()
