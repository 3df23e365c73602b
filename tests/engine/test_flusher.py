"""The Flusher on one process: an owner store and host tables in plain CPU memory, no ranks."""
from __future__ import annotations

import threading
import time
from typing import Tuple

import numpy as np
import torch

from torchrec_frugal.host.control_record import FLUSHED, NUM_FIELDS, Control
from torchrec_frugal.engine.flush.flusher import Flusher
from torchrec_frugal.engine.host_tables import HostTables
from torchrec_frugal.engine.lookahead.window import LookaheadWindow
from torchrec_frugal.engine.owner_cache import OwnerStore
from torchrec_frugal.priorities import INF
from torchrec_frugal.engine.flush.priority_queue import make_queue
from torchrec_frugal.engine.streams import REACHED, Streams

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
    assert counts.exchange_thread_s > 0.0 and counts.flusher_thread_s == 0.0
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
        assert counts.rows == 5 and counts.flusher_thread_s > 0.0 and counts.exchange_thread_s == 0.0
    finally:
        f.stop(5.0)
    assert not any(t.is_alive() for t in f.threads)


def test_flush_once_takes_every_priority_due_in_one_chunk_up_to_its_rows() -> None:
    f, weights, _ = _flusher(workers=0, chunk_rows=100)
    _update(f, np.array([10, 11, 12]), 3.0, np.array([2, 3, 4]))
    assert not f.flush_once(max_priority=1)  # nothing due by step 1
    assert f.flush_once(max_priority=3)  # priorities 2 and 3 in one chunk, not 4
    assert weights[10].eq(3.0).all() and weights[11].eq(3.0).all() and weights[12].eq(0.0).all()
    assert int(f.control.get(FLUSHED)[0]) == 3
    f, weights, _ = _flusher(workers=0, chunk_rows=1)
    _update(f, np.array([10, 11]), 3.0, np.array([2, 4]))
    assert f.flush_once(max_priority=4)  # a chunk of one row: the lowest priority's
    assert weights[10].eq(3.0).all() and weights[11].eq(0.0).all()
    assert int(f.control.get(FLUSHED)[0]) == 3


def test_without_flusher_threads_flush_due_keeps_the_deferred_rows_bounded() -> None:
    """No thread drains the infinity bucket, so the caller of flush_due does, past the bound only."""
    f, weights, _ = _flusher(workers=0, max_deferred_rows=4)
    _update(f, np.array([40, 41, 42]), 1.0, INF)
    f.flush_due(0)
    assert f.queue.deferred == 3 and weights[40:43].eq(0.0).all()  # within the bound: still coalescing
    _update(f, np.array([43, 44]), 1.0, INF)
    f.flush_due(0)
    assert f.queue.deferred <= 4 and weights[40:45].eq(1.0).all()
    assert f.take_counts().exchange_thread_s > 0.0


class _BlockingHost:
    """Host tables whose first write waits for ``release``: a chunk held in flight."""

    def __init__(self, host: HostTables) -> None:
        self.host, self.device = host, host.device
        self.in_place = False  # not the CPU's in-place copy: every chunk goes through write()
        self.entered, self.release = threading.Event(), threading.Event()

    def write(self, *args) -> None:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(10.0)
        self.host.write(*args)


def _chunk_in_flight(f: Flusher) -> Tuple[_BlockingHost, threading.Thread]:
    blocking = _BlockingHost(f.host)
    f.host = blocking
    t = threading.Thread(target=f.flush_once, args=(None,))
    t.start()
    assert blocking.entered.wait(10.0)
    return blocking, t


def test_flush_due_does_not_wait_for_a_chunk_in_flight_when_nothing_is_due() -> None:
    f, weights, _ = _flusher(workers=0, chunk_rows=100)
    _update(f, np.array([10, 11]), 3.0, np.array([3, 3]))
    blocking, t = _chunk_in_flight(f)  # rows 10, 11 in flight, nothing else pending
    t0 = time.perf_counter()
    f.flush_due(0)
    assert time.perf_counter() - t0 < 2.0
    assert int(f.control.get(FLUSHED)[0]) == 2  # the chunk in flight bounds the progress
    blocking.release.set()
    t.join(10.0)
    assert weights[[10, 11]].eq(3.0).all() and int(f.control.get(FLUSHED)[0]) == INF


def test_a_row_updated_while_its_chunk_is_in_flight_stays_pending_and_keeps_its_slot() -> None:
    f, weights, state = _flusher(workers=0, chunk_rows=100)
    _update(f, np.array([20, 21]), 1.0, np.array([1, 1]))  # uncached: dynamic slots
    blocking, t = _chunk_in_flight(f)  # copies the values 1.0
    _update(f, np.array([20]), 5.0, INF)  # updated meanwhile: re-queued, deferred
    blocking.release.set()
    t.join(10.0)
    assert weights[[20, 21]].eq(1.0).all()
    assert f.queue.contains(np.array([20, 21])).tolist() == [True, False]
    assert f.store.slot_of[20] >= 0 and f.store.slot_of[21] == -1  # only the written row freed its slot
    f.drain()
    assert weights[20].eq(5.0).all() and state[20].eq(-5.0).all() and f.store.slot_of[20] == -1
