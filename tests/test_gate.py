"""The owner's FLUSHED counter: the step through which its host rows are current."""
from __future__ import annotations

import numpy as np

from torchrec_frugal.gate import INF_STEP, flushed_through
from torchrec_frugal.priority_queue import INF, TwoLevelQueue


def test_nothing_pending_is_current_forever() -> None:
    assert flushed_through(None, last_ingested=3, inflight=None) == INF_STEP
    assert flushed_through(None, last_ingested=3, inflight=7) == 7


def test_the_earliest_read_of_a_pending_row_bounds_it() -> None:
    assert flushed_through(9, last_ingested=12, inflight=None) == 8
    assert flushed_through(9, last_ingested=12, inflight=5) == 5


def test_deferred_rows_alone_bound_by_the_newest_ingested_step() -> None:
    assert flushed_through(INF, last_ingested=6, inflight=None) == 6
    assert flushed_through(INF, last_ingested=6, inflight=4) == 4


def test_queue_counts_its_deferred_rows() -> None:
    q = TwoLevelQueue(100, window=3)
    q.upsert(np.array([1, 2, 3]), INF)
    assert q.deferred == 3 and flushed_through(q.min_priority(), last_ingested=1, inflight=None) == 1
    q.upsert(np.array([4]), 2)
    assert q.min_priority() == 2 and flushed_through(q.min_priority(), last_ingested=2, inflight=None) == 1
    q.upsert(np.array([1, 2]), 3)  # ingested reads give two deferred rows a priority
    assert q.deferred == 1
    q.remove(np.array([3]))
    assert q.deferred == 0
