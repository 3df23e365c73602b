"""The two-level queue's kernels: compiled loops, their plain-Python run and the numpy twin leave
the queue in the same state, bucket order included, over random batches."""
from __future__ import annotations

import numpy as np
import pytest

from torchrec_frugal.engine.flush.priority_queue import TwoLevelQueue
from torchrec_frugal.kernels import pending_queue
from torchrec_frugal.kernels.compiled import numba_available, running_as
from torchrec_frugal.kernels.pending_queue import ABSENT, ANY, move_rows
from torchrec_frugal.priorities import INF

KERNELS = (pending_queue.check_batch, pending_queue.read_priorities, pending_queue.move_rows, pending_queue.pop_due,
           pending_queue.lowest_slot)


def _state(q: TwoLevelQueue) -> tuple:
    buckets = [b.tolist() for b in q.bucket_rows()]
    return q.priority_of(np.arange(q.num_rows)).tolist(), buckets, len(q), q.base


def _drive(seed: int, n_ops: int) -> list:
    """Random upserts (moves among buckets, some past a bucket's room), undefers, removals, pops
    and advances; the queue's state after each."""
    rng = np.random.default_rng(seed)
    num_rows, window = 400, 3
    q = TwoLevelQueue(num_rows, window)
    out = []
    for _ in range(n_ops):
        op = rng.integers(12)
        base = q.base
        if op < 5:
            rows = rng.choice(num_rows, size=int(rng.integers(1, 120)), replace=False)
            prios = rng.integers(base, base + window + 3, size=rows.size)
            prios[prios == base + window + 2] = INF
            q.upsert(rows, int(prios[0]) if op == 0 else prios, assume_unique=bool(op % 2))
        elif op == 5:
            q.undefer(rng.choice(num_rows, size=int(rng.integers(1, 120)), replace=False), base + int(rng.integers(3)))
        elif op < 8:
            q.remove(rng.integers(num_rows, size=int(rng.integers(1, 60))))
        elif op < 10:
            out.append(q.pop_min(None if op == 8 else int(rng.integers(1, 20)))[0].tolist())
        elif op == 10:
            out.append(q.pop_through([None, base, base + 2, INF - 1][int(rng.integers(4))], int(rng.integers(1, 80))))
            out[-1] = (out[-1][0].tolist(), out[-1][1], q.min_priority())
        else:
            while q.min_priority() is not None and q.min_priority() <= base:
                q.pop_min()
            q.advance(base + 1)
        out.append(_state(q))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_compiled_plain_and_twin_leave_the_same_queue(seed: int) -> None:
    want = _drive(seed, 300)
    for run in ("loops", "twin"):
        with running_as(run, KERNELS):
            assert _drive(seed, 300) == want, run


@pytest.mark.parametrize("run", ["compiled", "loops", "twin"])
def test_a_batch_leaving_a_bucket_fills_its_holes_with_the_tail_in_order(run: str) -> None:
    """Bucket 0 holds rows 10..15; rows 11, 15 and 13 leave the queue and 12 moves to bucket 1: the
    one surviving tail row, 14, fills the one hole (11's). Bucket 1 takes 20, then 12, in the batch's order."""
    fn = move_rows if run == "compiled" else getattr(move_rows, run)
    state = np.full((30, 2), ABSENT, dtype=np.int64)
    pool = np.zeros(16, dtype=np.int64)
    start, cap = np.array([0, 8], dtype=np.int64), np.array([8, 8], dtype=np.int64)
    counts = np.array([6, 0], dtype=np.int64)
    pool[:6] = np.arange(10, 16)
    state[10:16, 0], state[10:16, 1] = 0, np.arange(6)
    rows = np.array([11, 20, 15, 13, 12], dtype=np.int64)
    prios = np.array([ABSENT, INF, ABSENT, ABSENT, INF], dtype=np.int64)
    need = np.empty(2, dtype=np.int64)
    assert fn(rows, prios, 1, ANY, INF, state, pool, start, cap, counts, need) == (True, -2)
    assert counts.tolist() == [2, 2]
    assert pool[:2].tolist() == [10, 14] and pool[8:10].tolist() == [20, 12]
    assert state[[10, 14, 20, 12], 1].tolist() == [0, 1, 0, 1]
    assert state[[11, 13, 15], 0].tolist() == [ABSENT] * 3 and state[[20, 12], 0].tolist() == [INF, INF]
    cap[1] = 3  # three more rows entering bucket 1 do not fit: nothing changes, need says so
    before = (state.copy(), pool.copy(), counts.copy())
    assert fn(np.array([1, 2, 3], dtype=np.int64), np.array([INF], dtype=np.int64), 0, ANY, INF, state, pool, start,
              cap, counts, need) == (False, 0)  # fmt: skip
    assert need.tolist() == [2, 5]
    for a, b in zip(before, (state, pool, counts)):
        np.testing.assert_array_equal(a, b)


def test_compiled_where_numba_is_installed() -> None:
    assert move_rows.compiled == numba_available()
