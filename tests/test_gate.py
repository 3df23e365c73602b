"""The owner's FLUSHED counter: the step through which its host rows are current."""
from __future__ import annotations

import numpy as np

from torchrec_frugal.gate import INF_STEP, flushed_through
from torchrec_frugal.priority_queue import INF, TwoLevelQueue


def test_nothing_pending_is_current_forever() -> None:
    assert flushed_through(None, 0, last_ingested=3, inflight=None) == INF_STEP
    assert flushed_through(None, 0, last_ingested=3, inflight=7) == 7


def test_finite_priorities_alone_bound_by_the_earliest_read() -> None:
    assert flushed_through(9, 0, last_ingested=12, inflight=None) == 8
    assert flushed_through(9, 0, last_ingested=12, inflight=5) == 5


def test_deferred_rows_bound_by_the_newest_ingested_step() -> None:
    # Only deferred rows: read at no ingested step, maybe at the next one.
    assert flushed_through(INF, 4, last_ingested=6, inflight=None) == 6
    # Deferred rows beside finite ones whose reads lie beyond the ingested window: a deferred row
    # may be read at step 7 (not yet ingested), so host is current only through 6, not 9.
    assert flushed_through(10, 4, last_ingested=6, inflight=None) == 6
    assert flushed_through(5, 4, last_ingested=6, inflight=None) == 4


def test_queue_counts_its_deferred_rows() -> None:
    q = TwoLevelQueue(100, window=3)
    q.upsert(np.array([1, 2, 3]), INF)
    q.upsert(np.array([4]), 2)
    assert q.deferred == 3 and q.min_priority() == 2
    assert flushed_through(q.min_priority(), q.deferred, last_ingested=1, inflight=None) == 1
    q.upsert(np.array([1, 2]), 3)  # ingested reads give two deferred rows a priority
    assert q.deferred == 1
    q.remove(np.array([3]))
    assert q.deferred == 0
    assert flushed_through(q.min_priority(), q.deferred, last_ingested=1, inflight=None) == 1  # min priority 2
