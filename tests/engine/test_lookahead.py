"""LookaheadWindow against a brute-force reference over randomized add_step / retire sequences."""
from __future__ import annotations

from typing import Dict, Set

import numpy as np
import pytest

from torchrec_frugal.engine.lookahead import window as window_module
from torchrec_frugal.engine.lookahead.window import LookaheadWindow
from torchrec_frugal.kernels.read_window import retire_entries
from torchrec_frugal.priorities import INF


class BruteWindow:
    """step -> set of rows; next_read[row] = min ingested, unretired step that contains row, else INF.

    retire(s) forgets the ingested steps <= s (a step ingested after an over-eager retire is live).
    """

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self.steps: Dict[int, Set[int]] = {}

    def add_step(self, step: int, rows) -> None:
        self.steps[step] = set(int(r) for r in rows)

    def retire(self, step: int) -> None:
        self.steps = {s: rows for s, rows in self.steps.items() if s > step}

    def next_read(self) -> np.ndarray:
        out = np.full(self.num_rows, INF, dtype=np.int64)
        for row in range(self.num_rows):
            live = [s for s, rows in self.steps.items() if row in rows]
            if live:
                out[row] = min(live)
        return out


def _check(win: LookaheadWindow, ref: BruteWindow, rng: np.random.Generator, ctx: str) -> None:
    expect = ref.next_read()
    np.testing.assert_array_equal(win.next_read, expect, err_msg=ctx)
    probe = rng.choice(ref.num_rows, size=min(7, ref.num_rows), replace=False)
    np.testing.assert_array_equal(win.priorities(probe), expect[probe], err_msg=ctx)


@pytest.mark.parametrize("capacity", [1, 1024], ids=["ring-grows", "ring-fits"])
@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force(seed, capacity):
    rng = np.random.default_rng(seed)
    num_rows = int(rng.integers(1, 40))
    win = LookaheadWindow(num_rows, capacity=capacity)
    ref = BruteWindow(num_rows)
    nxt = 0
    retired = -1
    newly_total = 0
    for op in range(120):
        if rng.random() < 0.6 or nxt == 0:
            k = int(rng.integers(0, num_rows + 1))
            rows = rng.choice(num_rows, size=k, replace=False).astype(np.int64)
            before = ref.next_read()
            newly = win.add_step(nxt, rows)
            expect_newly = [r for r in rows.tolist() if before[r] == INF]
            # The newly finite rows, in input order, are exactly those whose next read was INF.
            assert newly.tolist() == expect_newly, f"seed {seed} op {op} step {nxt}"
            newly_total += len(expect_newly)
            ref.add_step(nxt, rows)
            assert win.last_step == nxt
            nxt += 1
        else:
            # Retire a step at or behind the newest one, sometimes beyond it, sometimes a no-op.
            r = int(rng.integers(retired - 2, nxt + 1))
            win.retire(r)
            ref.retire(r)
            retired = max(retired, r)
        _check(win, ref, rng, f"seed {seed} op {op}")
    assert newly_total > 0


def test_hand_example():
    win = LookaheadWindow(6)
    assert win.add_step(0, np.array([1, 2])).tolist() == [1, 2]
    assert win.add_step(1, np.array([2, 3])).tolist() == [3]
    assert win.add_step(2, np.array([1, 4])).tolist() == [4]
    assert win.next_read.tolist() == [INF, 0, 0, 1, 2, INF]
    win.retire(0)
    assert win.next_read.tolist() == [INF, 2, 1, 1, 2, INF]
    # Row 1's next read is now finite, so step 3 does not report it; row 0 is new.
    assert win.add_step(3, np.array([0, 1])).tolist() == [0]
    win.retire(2)
    assert win.next_read.tolist() == [3, 3, INF, INF, INF, INF]
    # Retiring beyond the newest step empties the window; steps then continue in order.
    win.retire(10)
    assert (win.next_read == INF).all()
    assert win.add_step(4, np.array([5])).tolist() == [5]
    assert win.priorities(np.array([5, 0])).tolist() == [4, INF]


def test_retire_costs_the_retired_step_not_the_window(monkeypatch):
    """Retiring one step touches only that step's entries, however many steps the window holds."""
    win = LookaheadWindow(100, capacity=4)
    for t in range(50):
        win.add_step(t, np.array([t, 99]))
    touched = []

    def spy(per_row, ring, lo, hi):
        touched.append(hi - lo)
        retire_entries(per_row, ring, lo, hi)

    monkeypatch.setattr(window_module, "retire_entries", spy)
    win.retire(0)
    assert touched == [2]
    assert win.priorities(np.array([0, 99, 1])).tolist() == [INF, 1, 1]


def test_empty_step_and_empty_window():
    win = LookaheadWindow(3)
    assert win.add_step(0, np.empty(0, dtype=np.int64)).size == 0
    win.retire(0)
    win.retire(0)  # retiring twice is a no-op
    assert (win.next_read == INF).all()


@pytest.mark.parametrize("bad", [1, -1])
def test_first_step_must_be_zero(bad):
    win = LookaheadWindow(4)
    with pytest.raises(RuntimeError, match=rf"got {bad} after -1"):
        win.add_step(bad, np.array([0]))


@pytest.mark.parametrize("bad", [0, 1, 4, 7])
def test_out_of_order_step_raises_and_changes_nothing(bad):
    win = LookaheadWindow(4)
    win.add_step(0, np.array([0, 1]))
    win.add_step(1, np.array([2]))
    win.add_step(2, np.array([1, 3]))
    before = win.next_read.copy()
    with pytest.raises(RuntimeError, match=rf"got {bad} after 2"):
        win.add_step(bad, np.array([3]))
    np.testing.assert_array_equal(win.next_read, before)
    assert win.last_step == 2
    assert win.add_step(3, np.array([3])).size == 0  # the in-order step is still accepted
