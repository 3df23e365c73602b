"""The owner's FLUSHED counter, the gate's check, waits by kind and the SYNC barrier."""
from __future__ import annotations

import numpy as np
import torch

from torchrec_frugal.host.control_record import FLUSHED, NUM_FIELDS, SYNC, UPDATED, Control
from torchrec_frugal.engine.gate import flushed_through, lagging_owners, sync
from torchrec_frugal.metrics import WAIT_EXCHANGE, WAIT_GATE, WAIT_KINDS, WAIT_SYNC
from torchrec_frugal.priorities import INF
from torchrec_frugal.engine.flush.priority_queue import TwoLevelQueue


def test_nothing_pending_is_current_forever() -> None:
    assert flushed_through(None, last_ingested=3, inflight=None) == INF
    assert flushed_through(None, last_ingested=3, inflight=7) == 7


def test_the_earliest_read_of_a_pending_row_bounds_it() -> None:
    assert flushed_through(9, last_ingested=12, inflight=None) == 8
    assert flushed_through(9, last_ingested=12, inflight=5) == 5


def test_deferred_rows_alone_bound_by_the_newest_ingested_step() -> None:
    assert flushed_through(INF, last_ingested=6, inflight=None) == 6
    assert flushed_through(INF, last_ingested=6, inflight=4) == 4


def test_queue_counts_its_deferred_rows() -> None:
    q = TwoLevelQueue(100, lookahead=3)
    q.upsert(np.array([1, 2, 3]), INF)
    assert q.deferred == 3 and flushed_through(q.min_priority(), last_ingested=1, inflight=None) == 1
    q.upsert(np.array([4]), 2)
    assert q.min_priority() == 2 and flushed_through(q.min_priority(), last_ingested=2, inflight=None) == 1
    q.upsert(np.array([1, 2]), 3)  # ingested reads give two deferred rows a priority
    assert q.deferred == 1
    q.remove(np.array([3]))
    assert q.deferred == 0


def _control(world: int = 2, rank: int = 0) -> Control:
    return Control(torch.zeros(world, NUM_FIELDS, dtype=torch.int64), rank, 5.0)


def test_the_gate_waits_for_owners_behind_on_updates_or_flushes() -> None:
    c = _control(3)
    c.block[:, UPDATED] = [4, 4, 3]
    c.block[:, FLUSHED] = [INF, 5, INF]
    assert lagging_owners(c, 5) == [2]  # rank 2 has not applied step 4
    assert lagging_owners(c, 6) == [0, 1, 2]  # nobody applied step 5; rank 1's rows read at 6 are stale
    c.block[2, UPDATED] = 4
    assert lagging_owners(c, 5) == []
    assert c.behind(UPDATED, 4) == [] and c.behind(FLUSHED, 6) == [1]


def test_waits_add_up_by_kind() -> None:
    c = _control()
    assert c.wait(WAIT_GATE, lambda: [], "nothing") == 0.0
    left = [3]

    def lagging() -> list:
        left[0] -= 1
        return [1] if left[0] > 0 else []

    waited = c.wait(WAIT_EXCHANGE, lagging, "two polls")
    taken = c.take_waited()
    assert set(taken) == set(WAIT_KINDS) and taken[WAIT_EXCHANGE] == waited > 0.0 and taken[WAIT_GATE] == 0.0
    assert c.take_waited()[WAIT_EXCHANGE] == 0.0  # taken once


def test_sync_is_a_barrier_of_the_sync_counters() -> None:
    block = torch.zeros(2, NUM_FIELDS, dtype=torch.int64)
    r0, r1 = Control(block, 0, 5.0), Control(block, 1, 5.0)
    r1.set(SYNC, 1)  # rank 1 arrived first
    sync(r0, "a barrier")
    assert r0.get(SYNC).tolist() == [1, 1] and r0.take_waited()[WAIT_SYNC] == 0.0
