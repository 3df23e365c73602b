"""The Flusher on one process: an owner store and host tables in plain CPU memory, no ranks."""
from __future__ import annotations

import time
from typing import Tuple

import numpy as np
import torch

from torchrec_frugal.device import REACHED, HostTables, Streams
from torchrec_frugal.flusher import Flusher
from torchrec_frugal.gate import FLUSHED, NUM_FIELDS, Control
from torchrec_frugal.lookahead import LookaheadWindow
from torchrec_frugal.owner_cache import OwnerStore
from torchrec_frugal.priority_queue import INF, make_queue

ROWS, DIM, WIDTH, L = 64, 4, 1, 3
CPU = torch.device("cpu")


def _flusher(workers: int, max_deferred_rows: int = 1000, chunk_rows: int = 8) -> Tuple[Flusher, torch.Tensor, torch.Tensor]:
    """A flusher over rows 0..7 cached (static slots) and the rest uncached; host rows start at 0."""
    weights, state = torch.zeros(ROWS, DIM), torch.zeros(ROWS, WIDTH)
    host = HostTables({"weights": weights, "state": state}, torch.empty(0, dtype=torch.uint8), CPU, "auto", None)
    store = OwnerStore(ROWS, np.arange(8), DIM, WIDTH, CPU)
    control = Control(torch.zeros(1, NUM_FIELDS, dtype=torch.int64), 0, 5.0)
    window = LookaheadWindow(ROWS)
    failures = []
    f = Flusher(
        make_queue("two_level", ROWS, L), store, host, Streams(CPU), control, window,
        chunk_rows, max_deferred_rows, workers, failures.append,
    )  # fmt: skip
    return f, weights, state


def _update(f: Flusher, rows: np.ndarray, value: float, prio) -> None:
    """What the owner's update does: new values in the store (dynamic slots for uncached rows), then queue."""
    with f.lock:
        slots = f.store.slot_of[rows]
        fresh = slots < 0
        slots[fresh] = f.store.alloc(rows[fresh])
        sl = torch.from_numpy(slots)
        f.store.weights[sl] = value
        f.store.state[sl] = -value
        f.queue_writes(rows, prio, REACHED)


def test_rows_due_next_step_are_flushed_on_the_calling_thread() -> None:
    f, weights, state = _flusher(workers=0)
    rows = np.array([1, 20, 30])
    _update(f, rows, 2.0, np.array([1, 1, 3]))
    assert int(f.control.get(FLUSHED)[0]) == 0  # row due at step 1 pending: current through step 0
    f.flush_due(0)  # step 0 ended: the rows step 1 reads go now, the one due at 3 waits
    assert weights[[1, 20]].eq(2.0).all() and state[[1, 20]].eq(-2.0).all()
    assert weights[30].eq(0.0).all()
    assert int(f.control.get(FLUSHED)[0]) == 2
    assert f.store.slot_of[20] == -1 and f.store.slot_of[30] >= 0 and f.store.slot_of[1] == 1  # dynamic slot released
    counts = f.take_counts()
    assert counts.rows == 2 and counts.bytes == 2 * (DIM + WIDTH) * 4
    assert counts.train_thread_s > 0.0 and counts.flusher_thread_s == 0.0
    assert counts.pending_rows == 1 and counts.queue_depth[3] == 1
    assert f.take_counts().rows == 0  # counted once
    f.drain()
    assert weights[30].eq(2.0).all() and f.total_rows == 3 and len(f.queue) == 0
    assert int(f.control.get(FLUSHED)[0]) == INF  # nothing pending: current for ever


def test_deferred_rows_wait_until_too_many_then_the_flusher_threads_write_them() -> None:
    f, weights, _ = _flusher(workers=1, max_deferred_rows=4)
    try:
        _update(f, np.array([40, 41, 42]), 1.0, INF)
        time.sleep(0.1)
        assert len(f.queue) == 3 and weights[40:43].eq(0.0).all()  # deferred: coalescing further updates
        assert f.background_bound() == INF - 1
        _update(f, np.array([43, 44]), 1.0, INF)  # 5 > 4 deferred: worth flushing now
        deadline = time.time() + 10
        while len(f.queue) and time.time() < deadline:
            time.sleep(0.01)
        assert len(f.queue) == 0 and weights[40:45].eq(1.0).all()
        counts = f.take_counts()
        assert counts.rows == 5 and counts.flusher_thread_s > 0.0 and counts.train_thread_s == 0.0
    finally:
        f.stop(5.0)
    assert not any(t.is_alive() for t in f.threads)


def test_flush_once_respects_the_priority_bound_and_one_priority_per_chunk() -> None:
    f, weights, _ = _flusher(workers=0, chunk_rows=100)
    _update(f, np.array([10, 11]), 3.0, np.array([2, 4]))
    assert not f.flush_once(max_priority=1)  # nothing due by step 1
    assert f.flush_once(max_priority=4)
    assert weights[10].eq(3.0).all() and weights[11].eq(0.0).all()  # the chunk took priority 2 only
    assert int(f.control.get(FLUSHED)[0]) == 3

