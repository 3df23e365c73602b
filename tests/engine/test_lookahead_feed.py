"""The lookahead feed on one process: two ranks' feeds sharing one control block, no threads
(each publish handed to the exchange runs at once, on the caller)."""
from __future__ import annotations

from typing import Any, Callable, List

import numpy as np
import pytest
import torch

from torchrec_frugal.host.control_record import INGESTED, PUBLISHED, RING_ROWS, Control, control_field
from torchrec_frugal.errors import FrugalError, FrugalInputError
from torchrec_frugal.engine.flush.flusher import Flusher
from torchrec_frugal.engine.host_tables import HostTables
from torchrec_frugal.engine.lookahead.window import LookaheadWindow
from torchrec_frugal.engine.lookahead.feed import LookaheadFeed
from torchrec_frugal.engine.lookahead.ring import LookaheadRing
from torchrec_frugal.host.mailbox import Record, keep_ring, ring_layout
from torchrec_frugal.engine.owner_cache import OwnerStore
from torchrec_frugal.priorities import INF
from torchrec_frugal.engine.flush.priority_queue import make_queue
from torchrec_frugal.host.shm import PREFIX, Layout, SharedSegment, new_run_id
from torchrec_frugal.engine.streams import REACHED, Streams

WORLD, ROWS, L = 2, 20, 2
CPU = torch.device("cpu")
OWNER = (np.arange(ROWS) % WORLD).astype(np.int16)  # even rows: rank 0, odd rows: rank 1
CACHED = np.isin(np.arange(ROWS), [0, 1])  # rank 0 caches row 0, rank 1 row 1


class InlineExchange:
    """The exchange worker's hand-off, run at once on the caller: a feed with no thread."""

    def __init__(self) -> None:
        self.tickets = 0

    def submit(self, step: Callable[[], None], wake: bool = True) -> int:
        step()
        self.tickets += 1
        return self.tickets

    def wake_through(self, ticket: int) -> None:
        pass


def _feeds(tmp_path) -> List[LookaheadFeed]:
    block = SharedSegment.create(f"{PREFIX}{new_run_id()}_control", Layout([control_field(WORLD)]), str(tmp_path))
    block.unlink()
    prefix = f"{PREFIX}{new_run_id()}_"
    feeds = []
    for r in range(WORLD):
        control = Control(block["control"], r, 5.0)
        control.set(PUBLISHED, -1)
        control.set(INGESTED, -1)
        record = Record("ring", lambda k: ring_layout(L + 2, WORLD, k), keep_ring, RING_ROWS, str(tmp_path), 4, ROWS, r, WORLD)
        record.create_own(control, prefix)
        ring = LookaheadRing(record, L + 2, control, OWNER, ~(CACHED & (OWNER == r)))
        window = LookaheadWindow(ROWS)
        host = HostTables({"weights": torch.zeros(ROWS, 1), "state": torch.zeros(ROWS, 0)}, torch.empty(0), CPU, "auto", None)
        store = OwnerStore(ROWS, np.flatnonzero(CACHED & (OWNER == r)), 1, 0, CPU)
        flusher = Flusher(make_queue("two_level", ROWS, L), store, host, Streams(CPU), control, window, 8, 100, 0, print)
        exchange: Any = InlineExchange()
        feeds.append(LookaheadFeed(L, ring, window, flusher, control, False, exchange, lambda fn: fn(), lambda: None, print))
    for f in feeds:
        f.ring.record.attach_peers()
    for f in feeds:
        f.ring.record.unlink_own()
    return feeds


def test_steps_are_announced_in_order_and_checked_when_they_start(tmp_path) -> None:
    f = _feeds(tmp_path)[0]
    for t in range(L + 1):
        assert f.room(0) == t
        f.push(torch.tensor([2 * t]))
    with pytest.raises(FrugalInputError, match="window full: step 3 pushed while step 0 runs"):
        f.room(0)
    assert f.steps_ahead == L + 1
    with pytest.raises(FrugalInputError, match="step 0: the batch trained differs"):
        f.begin(0, torch.tensor([4]))
    assert f.steps_ahead == L + 1  # refused: nothing changed
    f.begin(0, torch.tensor([0]))
    assert f.steps_ahead == L and f.room(1) == L + 1
    with pytest.raises(FrugalError, match="lookahead holds step 1 while step 2 starts"):
        f.begin(2, torch.tensor([2]))


def test_owners_ingest_what_every_rank_publishes(tmp_path) -> None:
    f0, f1 = _feeds(tmp_path)
    with f0.flusher.lock:
        f0.flusher.queue_writes(np.array([4, 6]), INF, REACHED)  # deferred writes of rank 0's rows
    steps0 = [[0, 4, 5], [2, 3], [4, 6]]  # rank 0 caches row 0: its reads of row 0 are no host reads
    steps1 = [[0, 1], [9], [6, 7, 8]]  # rank 1 reads row 0 from host
    for t in range(L + 1):
        f0.push(torch.tensor(steps0[t]))
        f1.push(torch.tensor(steps1[t]))
    assert f0.ingest_available()
    assert f0.window.last_step == L and int(f0.control.get(INGESTED)[0]) == L
    nxt = f0.window.next_read
    assert nxt[[0, 2, 4, 6, 8]].tolist() == [0, 1, 0, 2, 2]  # rank 0's rows only, each its first host read
    assert nxt[[5, 3, 7, 9]].tolist() == [INF] * 4  # owned by rank 1
    assert f0.flusher.queue.priority_of(np.array([4, 6])).tolist() == [0, 2]  # deferred rows got their reads
    assert not f0.ingest_available()  # nothing new published
    f0.ingest_through(L)  # published and ingested already: no wait
    with f0.flusher.lock:
        f0.retire(0)
        assert f0.priorities(np.array([0, 4, 6]), 0).tolist() == [INF, 2, 2]
    # Row 1 is cached by its owner, rank 1, the only rank reading it: no host read.
    assert f1.ingest_available() and f1.window.next_read[[1, 3, 5, 7, 9]].tolist() == [INF, 1, 0, 2, 1]
