"""Tests for the pending-write queues (two-level ring and heap baseline)."""

from __future__ import annotations

import numpy as np
import pytest

from torchrec_frugal.priorities import INF, QUEUE_KINDS
from torchrec_frugal.engine.flush.priority_queue import HeapQueue, PendingQueue, TwoLevelQueue, make_queue

KINDS = list(QUEUE_KINDS)


def rows_of(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


def sorted_pop(q: PendingQueue, max_rows: int | None = None) -> tuple[list[int], int]:
    rows, prio = q.pop_min(max_rows)
    assert rows.dtype == np.int64
    return sorted(rows.tolist()), prio


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


def test_make_queue_kinds():
    assert isinstance(make_queue("two_level", 10, 3), TwoLevelQueue)
    assert isinstance(make_queue("heap", 10, 3), HeapQueue)
    with pytest.raises(ValueError, match="two_level"):
        make_queue("fifo", 10, 3)


def test_empty_queue(kind):
    q = make_queue(kind, 10, 4)
    assert len(q) == 0
    assert q.base == 0
    assert q.min_priority() is None
    rows, prio = q.pop_min()
    assert rows.size == 0 and rows.dtype == np.int64 and prio == INF
    assert q.bucket_sizes().tolist() == [0] * 7
    assert q.contains(rows_of(0, 9)).tolist() == [False, False]
    assert q.priority_of(rows_of(0, 9)).tolist() == [-1, -1]


def test_insert_and_pop_order(kind):
    q = make_queue(kind, 100, 4)  # finite priorities 0..5
    q.upsert(rows_of(10, 11), rows_of(3, INF))
    q.upsert(rows_of(20, 21, 22), 1)
    q.upsert(rows_of(30), rows_of(5))
    q.upsert(rows_of(40, 41), rows_of(0, 3))
    assert len(q) == 8
    assert q.bucket_sizes().tolist() == [1, 3, 0, 2, 0, 1, 1]
    assert q.priority_of(rows_of(10, 11, 20, 30, 40, 99)).tolist() == [3, INF, 1, 5, 0, -1]
    assert q.min_priority() == 0
    assert sorted_pop(q) == ([40], 0)
    assert sorted_pop(q) == ([20, 21, 22], 1)
    assert sorted_pop(q) == ([10, 41], 3)
    assert sorted_pop(q) == ([30], 5)
    assert q.min_priority() == INF
    assert sorted_pop(q) == ([11], INF)
    assert q.min_priority() is None
    assert len(q) == 0
    assert q.contains(rows_of(10, 11, 20)).tolist() == [False, False, False]


def test_moves_between_buckets_and_inf(kind):
    q = make_queue(kind, 50, 3)  # finite 0..4
    q.upsert(np.arange(10), 4)
    q.upsert(rows_of(1, 2, 3), rows_of(0, INF, 2))  # finite->finite, finite->INF
    assert len(q) == 10
    assert q.bucket_sizes().tolist() == [1, 0, 1, 0, 7, 1]
    q.upsert(rows_of(2, 5), rows_of(1, 4))  # INF->finite; same-priority no-op
    assert q.bucket_sizes().tolist() == [1, 1, 1, 0, 7, 0]
    assert q.priority_of(np.arange(10)).tolist() == [4, 0, 1, 2, 4, 4, 4, 4, 4, 4]
    assert sorted_pop(q) == ([1], 0)
    assert sorted_pop(q) == ([2], 1)
    assert sorted_pop(q) == ([3], 2)
    assert sorted_pop(q) == ([0, 4, 5, 6, 7, 8, 9], 4)
    assert len(q) == 0


def test_remove(kind):
    q = make_queue(kind, 100, 2)
    q.upsert(np.arange(20), np.array([0, 1, 2, 3, INF] * 4, dtype=np.int64))
    q.remove(rows_of(0, 1, 4, 50, 99, 4))  # absent and repeated rows are ignored
    assert len(q) == 17
    assert q.bucket_sizes().tolist() == [3, 3, 4, 4, 3]
    assert q.contains(rows_of(0, 1, 4, 5, 50)).tolist() == [False, False, False, True, False]
    q.remove(np.arange(5, 20, 5))  # rows 5, 10, 15 all priority 0
    assert q.bucket_sizes().tolist() == [0, 3, 4, 4, 3]
    assert q.min_priority() == 1
    q.remove(np.arange(100))
    assert len(q) == 0 and q.min_priority() is None
    q.remove(rows_of())
    q.upsert(rows_of(7), 2)  # reinsertion after removal
    assert sorted_pop(q) == ([7], 2)


def test_remove_swap_with_tail_keeps_positions(kind):
    """Remove a mix of head and tail rows from one bucket, then check every survivor."""
    q = make_queue(kind, 1000, 1)
    q.upsert(np.arange(500), 1)
    gone = np.r_[0:50, 100:110, 450:500, 497:500]
    q.remove(gone)
    survivors = np.setdiff1d(np.arange(500), gone)
    assert len(q) == survivors.size == 390
    assert q.contains(survivors).all()
    q.remove(survivors[::2])
    assert sorted(q.pop_min()[0].tolist()) == survivors[1::2].tolist()


def test_undefer_moves_only_the_deferred_rows(kind):
    q = make_queue(kind, 100, 3)  # finite 0..4
    q.upsert(rows_of(1, 2, 3), rows_of(INF, 2, INF))
    q.undefer(rows_of(1, 2, 3, 4), 1)  # 2 is due at 2 already, 4 is not pending: both stay as they are
    assert q.priority_of(rows_of(1, 2, 3, 4)).tolist() == [1, 2, 1, -1]
    assert q.bucket_sizes().tolist() == [0, 2, 1, 0, 0, 0]
    q.undefer(rows_of(), 1)
    with pytest.raises(ValueError, match="priority 9"):
        q.undefer(rows_of(1), 9)
    with pytest.raises(ValueError, match="row 100"):
        q.undefer(rows_of(100), 1)
    assert sorted_pop(q) == ([1, 3], 1)


def test_advance(kind):
    q = make_queue(kind, 100, 2)  # window [base, base+3]
    q.upsert(rows_of(1, 2, 3), rows_of(1, 2, INF))
    q.advance(0)  # no-op
    q.advance(1)  # bucket 0 is empty
    assert q.base == 1
    with pytest.raises(ValueError, match="priority 1"):
        q.advance(2)
    with pytest.raises(ValueError, match="priority 1"):
        q.advance(1000)
    with pytest.raises(ValueError, match="decrease"):
        q.advance(0)
    assert q.base == 1
    assert q.bucket_sizes().tolist() == [1, 1, 0, 0, 1]
    assert sorted_pop(q) == ([1], 1)
    q.advance(2)
    assert q.bucket_sizes().tolist() == [1, 0, 0, 0, 1]
    q.upsert(rows_of(4), 5)  # 5 = base + window + 1 is now legal
    assert q.bucket_sizes().tolist() == [1, 0, 0, 1, 1]
    q.remove(rows_of(2, 4))
    q.advance(10**6)  # long jump with only INF rows pending
    assert q.bucket_sizes().tolist() == [0, 0, 0, 0, 1]
    assert q.min_priority() == INF
    q.upsert(rows_of(5), 10**6 + 3)  # only the far end of the window is occupied
    with pytest.raises(ValueError, match=f"priority {10**6 + 3}"):
        q.advance(10**9)
    q.advance(10**6 + 3)
    assert q.bucket_sizes().tolist() == [1, 0, 0, 0, 1]


def test_range_errors(kind):
    q = make_queue(kind, 10, 2)
    q.advance(5)  # window [5, 8]
    for bad in (4, 9, -1, 0):
        with pytest.raises(ValueError, match=f"priority {bad} "):
            q.upsert(rows_of(1, 2), rows_of(5, bad))
    assert len(q) == 0  # a rejected call changes nothing
    with pytest.raises(ValueError, match="row 10"):
        q.upsert(rows_of(1, 10), 5)
    with pytest.raises(ValueError, match="row -1"):
        q.upsert(rows_of(-1), 5)
    with pytest.raises(ValueError, match="more than once"):
        q.upsert(rows_of(3, 4, 3), 5)
    with pytest.raises(ValueError, match="shape"):
        q.upsert(rows_of(1, 2), rows_of(5, 6, 7))
    with pytest.raises(ValueError, match="integers"):
        q.upsert(np.array([1.0]), 5)
    with pytest.raises(ValueError, match="max_rows"):
        q.pop_min(0)
    with pytest.raises(ValueError, match="row 11"):
        q.contains(rows_of(11))
    assert len(q) == 0
    q.upsert(rows_of(1, 2), rows_of(5, 8))
    q.upsert(rows_of(), rows_of())
    assert q.priority_of(rows_of(1, 2)).tolist() == [5, 8]


def test_pop_min_max_rows(kind):
    q = make_queue(kind, 100, 3)
    q.upsert(np.arange(10), 2)
    q.upsert(np.arange(10, 13), 3)
    seen: list[int] = []
    for expect in (4, 4, 2):
        rows, prio = q.pop_min(4)
        assert prio == 2 and rows.size == expect
        seen += rows.tolist()
    assert sorted(seen) == list(range(10))
    assert sorted_pop(q, 100) == ([10, 11, 12], 3)  # never crosses into another priority
    q.upsert(np.arange(20, 30), INF)
    rows, prio = q.pop_min(3)
    assert prio == INF and rows.size == 3 and len(q) == 7
    assert set(rows.tolist()) <= set(range(20, 30))


def test_pop_through_takes_the_due_buckets_lowest_first(kind):
    q = make_queue(kind, 100, 3)
    q.upsert(np.arange(4), 3)
    q.upsert(np.arange(4, 6), 1)
    q.upsert(np.arange(6, 9), 2)
    q.upsert(np.arange(9, 12), INF)
    rows, prio = q.pop_through(2, 100)  # priorities 1 and 2, not 3 nor INF
    assert prio == 1 and sorted(rows[:2].tolist()) == [4, 5] and sorted(rows[2:].tolist()) == [6, 7, 8]
    assert q.min_priority() == 3 and len(q) == 7
    rows, prio = q.pop_through(INF - 1, 3)  # at most 3 rows, of the lowest priority left
    assert prio == 3 and rows.size == 3 and set(rows.tolist()) < {0, 1, 2, 3} and len(q) == 4
    assert q.pop_through(2, 10)[0].size == 0  # the rest is due later
    rows, prio = q.pop_through(None, 10)  # INF too, after the finite row
    assert prio == 3 and rows.size == 4 and sorted(rows[1:].tolist()) == [9, 10, 11] and len(q) == 0
    rows, prio = q.pop_through(None, 10)
    assert rows.size == 0 and prio == INF


def test_window_zero(kind):
    q = make_queue(kind, 10, 0)  # finite priorities base and base+1 only
    q.upsert(rows_of(0, 1, 2), rows_of(0, 1, INF))
    assert q.bucket_sizes().tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="priority 2"):
        q.upsert(rows_of(3), 2)
    assert sorted_pop(q) == ([0], 0)
    q.advance(1)
    q.upsert(rows_of(3), 2)
    assert q.bucket_sizes().tolist() == [1, 1, 1]
    assert sorted_pop(q) == ([1], 1)
    q.advance(2)
    assert sorted_pop(q) == ([3], 2)
    assert sorted_pop(q) == ([2], INF)


def test_large_absolute_steps_and_wraparound(kind):
    """Walk the ring round 1000 / (window + 2) times at steps near 10**12, as the engine does."""
    window = 4
    q = make_queue(kind, 64, window)
    start = 10**12 + 3
    q.upsert(rows_of(0), INF)
    for i in range(1000):
        base = start + i
        q.advance(base)
        q.upsert(rows_of(i % 60 + 1), base + window + 1)  # a read at the far end of the window
        if i >= window + 1:
            # the row inserted window + 1 steps ago is due now, and only it
            assert sorted_pop(q) == ([(i - window - 1) % 60 + 1], base)
            assert q.bucket_sizes().tolist() == [0, 1, 1, 1, 1, 1, 1]
        else:
            assert q.min_priority() == start + window + 1
    assert len(q) == window + 2
    assert q.min_priority() == start + 1000
    assert q.priority_of(rows_of(0)).tolist() == [INF]


def test_large_base_near_int64_limit(kind):
    q = make_queue(kind, 4, 2)
    q.advance(2**62)
    q.upsert(rows_of(1, 2), rows_of(2**62 + 3, INF))
    assert q.priority_of(rows_of(1, 2)).tolist() == [2**62 + 3, INF]
    assert sorted_pop(q) == ([1], 2**62 + 3)
    with pytest.raises(ValueError, match="INF"):
        q.advance(INF - 1)


# --------------------------------------------------------------- randomized


class Reference:
    """Obviously-correct model: row -> priority, plus the rows of each priority."""

    def __init__(self) -> None:
        self.prio: dict[int, int] = {}
        self.by_prio: dict[int, set[int]] = {}

    def set(self, row: int, p: int) -> None:
        self.drop(row)
        self.prio[row] = p
        self.by_prio.setdefault(p, set()).add(row)

    def drop(self, row: int) -> None:
        p = self.prio.pop(row, None)
        if p is not None:
            self.by_prio[p].discard(row)
            if not self.by_prio[p]:
                del self.by_prio[p]

    def min(self) -> int | None:
        return min(self.by_prio) if self.by_prio else None


def _ref_check(q: PendingQueue, ref: Reference, num_rows: int, window: int) -> None:
    assert len(q) == len(ref.prio)
    expect = np.full(num_rows, -1, dtype=np.int64)
    for r, p in ref.prio.items():
        expect[r] = p
    assert np.array_equal(q.priority_of(np.arange(num_rows)), expect)
    assert np.array_equal(q.contains(np.arange(num_rows)), expect >= 0)
    assert q.min_priority() == ref.min()
    sizes = np.zeros(window + 3, dtype=np.int64)
    for p, rows in ref.by_prio.items():
        sizes[-1 if p == INF else p - q.base] = len(rows)
    assert np.array_equal(q.bucket_sizes(), sizes)


@pytest.mark.parametrize(
    "seed, max_batch, n_ops, min_count", [(1, 9, 50_000, 1000), (2, 9, 50_000, 1000), (3, 400, 5_000, 25)]
)
def test_randomized_against_reference(kind, seed, max_batch, n_ops, min_count):
    """Mixed operations against the reference: 100,000 of up to 8 rows per kind, and 5,000 of up
    to 399 rows (batches spread over every bucket at once; buckets grow while rows move)."""
    rng = np.random.default_rng(seed)
    num_rows, window = 2000, 6
    q = make_queue(kind, num_rows, window)
    base = 10**9 * seed  # large absolute steps from the start
    q.advance(base)
    ref = Reference()
    counts = dict.fromkeys(["upsert", "remove", "pop", "advance", "refused"], 0)
    for i in range(n_ops):
        op = rng.integers(100)
        if op < 45:
            rows = rng.choice(num_rows, size=rng.integers(1, max_batch), replace=False)
            prios = rng.integers(base, base + window + 3, size=rows.size)
            prios[prios == base + window + 2] = INF
            if rng.integers(4) == 0:
                prios = prios[:1].repeat(rows.size)
            q.upsert(rows, prios, assume_unique=bool(rng.integers(2)))  # the rows are unique: same outcome
            for r, p in zip(rows.tolist(), prios.tolist()):
                ref.set(r, p)
            counts["upsert"] += 1
        elif op < 65:
            rows = rng.integers(num_rows, size=rng.integers(1, max_batch))  # may repeat, may be absent
            q.remove(rows)
            for r in rows.tolist():
                ref.drop(r)
            counts["remove"] += 1
        elif op < 90:
            max_rows = None if rng.integers(3) == 0 else int(rng.integers(1, 6))
            rows, prio = q.pop_min(max_rows)
            low = ref.min()
            if low is None:
                assert rows.size == 0 and prio == INF
            else:
                at_low = ref.by_prio[low]
                want = len(at_low) if max_rows is None else min(max_rows, len(at_low))
                popped = rows.tolist()
                assert prio == low
                assert len(popped) == want == len(set(popped))
                assert set(popped) <= at_low
                for r in popped:
                    ref.drop(r)
            counts["pop"] += 1
        else:
            step = int(rng.integers(1, 3))
            if all(p == INF or p >= base + step for p in ref.by_prio):
                q.advance(base + step)
                base += step
                counts["advance"] += 1
            else:
                with pytest.raises(ValueError, match="still pending"):
                    q.advance(base + step)
                counts["refused"] += 1
        assert q.base == base
        assert len(q) == len(ref.prio)
        if i % 500 == 0 or i == n_ops - 1:
            _ref_check(q, ref, num_rows, window)
    # The mix must really exercise every path.
    assert min(counts.values()) > min_count, counts
