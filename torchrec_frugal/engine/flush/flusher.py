"""Proactive flushing (P2F): an owner's pending host writes, copied to host lowest priority first.

Every update of a row this rank owns queues a host write with priority = the next step at which
some rank reads the row from host (INF when no read is in the window: deferred, so that further
updates coalesce into one write). Flusher threads (each a :class:`~torchrec_frugal.worker.Worker`
whose idle task is a chunk) copy chunks of the lowest priorities in the background; the exchange
worker copies the rows the very next step reads at the end of each update (:meth:`Flusher.flush_due`),
and helps while it waits for the peers' gradients or, without flushers, while a gate waits. After every change the owner publishes FLUSHED, the step through which its host rows
are current, which is what the peers' gates read.

One lock guards the queue, the owner store's slots and the lookahead window
(the update and the ingestion of the lookahead take it too, as :attr:`Flusher.lock`). Chunks are
copied one at a time under the flush mutex, so that a row re-queued while its older copy is in
flight never has its newer copy overtaken by the older one.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Protocol, Union

import numpy as np
import torch

from ...host.control_record import FLUSHED, Control
from ..gate import flushed_through
from ..host_tables import HostTables
from ...kernels.row_scatter import copy_rows_to_host
from ..owner_cache import OwnerStore
from ...priorities import INF
from .priority_queue import PendingQueue
from ..streams import REACHED, Marker, Streams, to_device
from ...worker import Worker

POLL_S = (0.01, 0.01)  # a flusher with nothing due looks again this often (a new update wakes it at once)


class ReadAhead(Protocol):
    """What the flusher reads of the lookahead window
    (:class:`~torchrec_frugal.engine.lookahead.window.LookaheadWindow`): stated here, so that
    flushing imports nothing of the lookahead, which imports the flusher to feed its queue."""

    last_step: int  # the newest step whose host reads are known: deferred rows are current through it


@dataclass
class FlushCounts:
    """What was flushed since the previous :meth:`Flusher.take_counts`, and what is pending now."""

    rows: int = 0
    bytes: int = 0
    exchange_thread_s: float = 0.0  # chunks copied by the exchange worker (or any other caller of flush_once)
    flusher_thread_s: float = 0.0  # chunks copied by the background flusher threads
    queue_depth: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per bucket
    pending_rows: int = 0


class Flusher:
    """The pending host writes of the rows one rank owns, and the threads that apply them."""

    def __init__(
        self,
        queue: PendingQueue,
        store: OwnerStore,
        host: HostTables,
        streams: Streams,
        control: Control,
        window: Optional[ReadAhead],
        chunk_rows: int,
        max_deferred_rows: int,
        workers: int,
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.queue = queue
        self.store = store
        self.host = host
        self.streams = streams
        self.control = control
        self.window = window
        self.chunk_rows = chunk_rows
        self.max_deferred_rows = max_deferred_rows
        self.lock = threading.Lock()
        self._mutex = threading.Lock()  # one chunk in flight at a time
        self._inflight: Optional[int] = None  # progress bound of the chunk being copied
        self._updated: Marker = REACHED  # reached once the store holds every update queued so far
        self._row_bytes = (store.dim + store.state_width) * 4
        self._sink = np.zeros(1, dtype=np.float32)  # scratch of copy_rows_to_host (one chunk at a time)
        self._counts = FlushCounts()
        self.total_rows = 0
        self.total_bytes = 0
        self.workers = [
            Worker(f"frugal-flusher-{control.rank}-{i}", on_failure, idle=self._flush_background, poll_s=POLL_S)
            for i in range(workers)
        ]

    @property
    def threads(self) -> List[threading.Thread]:
        return [w.thread for w in self.workers]

    # ------------------------------------------------------------------ called with the lock held
    def queue_writes(self, rows: np.ndarray, priorities: Union[int, np.ndarray], updated: Marker) -> None:
        """Queue the host writes of ``rows``, just updated in the store (lock held).

        ``updated``: a device marker reached once the store holds the new values; a flush of
        these rows starts after it.
        """
        self._updated = updated
        if rows.size:
            self.queue.upsert(rows, priorities, assume_unique=True)  # an update's rows are unique
        self.publish_progress()

    def publish_progress(self) -> None:
        """Publish FLUSHED: the step through which this owner's host rows are current (lock held).

        Without a lookahead window no write is deferred (each is due at the next step), so the
        window's newest step is the only bound deferred rows need.
        """
        last = self.window.last_step if self.window is not None else -1
        self.control.set(FLUSHED, flushed_through(self.queue.min_priority(), last, self._inflight))

    def wake_all(self) -> None:
        """Wake every flusher: new rows may be worth flushing."""
        for w in self.workers:
            w.wake()

    # ------------------------------------------------------------------ flushing
    def flush_once(self, max_priority: Optional[int], wait: bool = True) -> bool:
        """Copy one chunk of the lowest-priority pending rows to host; False if nothing was due.

        ``max_priority``: flush only rows due by then (None: any). ``wait``: wait for a chunk
        another thread is copying (else give up at once).
        """
        return self._flush(max_priority, wait, background=False)

    def flush_due(self, step: int) -> None:
        """Copy, on this thread, the rows step + 1 reads from host; wake a flusher for the rest.

        Writing them here beats waiting for a flusher to be scheduled; the flushers take what
        can wait. Without flusher threads, the rest waits until it is due (or a wait of this
        thread has time for it), and deferred rows beyond the bound are flushed here.
        """
        while self.flush_once(max_priority=step + 1):
            pass
        if not self.workers:  # no flusher keeps the deferred rows bounded: this thread does
            while self.background_bound() == INF and self.flush_once(max_priority=INF):
                pass
            return
        with self.lock:
            m = self.queue.min_priority()
        if m is not None and m != INF:
            self.workers[0].wake()

    def background_bound(self) -> int:
        """Highest priority worth flushing ahead of need: any finite one, INF only past the bound.

        Rows nobody reads within the window stay deferred, so that further updates of the same
        row coalesce into one host write, until too many of them wait.
        """
        with self.lock:
            deferred = self.queue.deferred
        return INF if deferred > self.max_deferred_rows else INF - 1

    def drain(self) -> None:
        """Flush every pending row, and wait for chunks other threads have in flight."""
        while True:
            while self.flush_once(max_priority=None):
                pass
            with self.lock:
                if len(self.queue) == 0 and self._inflight is None:
                    return
            time.sleep(1e-4)

    def _flush(self, max_priority: Optional[int], wait: bool, background: bool) -> bool:
        t0 = time.perf_counter()
        if wait:
            # Wait for a chunk in flight only if there is something to flush after it.
            with self.lock:
                m = self.queue.min_priority()
                if m is None or (max_priority is not None and m > max_priority):
                    return False
            self._mutex.acquire()
        elif not self._mutex.acquire(blocking=False):
            return False
        try:
            with self.lock:
                m = self.queue.min_priority()
                if m is None or (max_priority is not None and m > max_priority):
                    return False
                # Every due priority in one chunk (up to chunk_rows): a chunk costs a fixed
                # overhead beside its rows, and one a bucket would pay it up to L + 2 times a step.
                rows, prio = self.queue.pop_through(max_priority, self.chunk_rows)
                if not self.host.in_place:
                    rows.sort()  # written in row order, as the link likes (a CPU copy gains less than the sort costs)
                # While in flight these rows are still stale on host: a chunk with a finite
                # priority bounds the published progress by its lowest priority - 1, an INF
                # chunk by the window as it is now.
                self._inflight = prio - 1 if prio != INF else self.window.last_step  # type: ignore[union-attr]
                slots = self.store.slot_of[rows]  # read under the lock: a release may follow
                src_w, src_s = self.store.weights, self.store.state
                after = self._updated
            self._copy(rows, slots, src_w, src_s, after)
            with self.lock:
                # Rows updated meanwhile were re-queued by the update (only an update inserts a
                # row, and no other chunk was copied meanwhile): they stay pending, the rest is
                # done, and those in dynamic slots give their slots back (where there are any).
                if self.store.dynamic_in_use:
                    done = rows[~self.queue.contains(rows)]
                    dynamic = done[self.store.slot_of[done] >= self.store.num_static]
                    if dynamic.size:
                        self.store.release(dynamic)
                self._inflight = None
                self.publish_progress()
                n = int(rows.shape[0])
                c = self._counts
                c.rows += n
                c.bytes += n * self._row_bytes
                self.total_rows += n
                self.total_bytes += n * self._row_bytes
                if background:
                    c.flusher_thread_s += time.perf_counter() - t0
                else:
                    c.exchange_thread_s += time.perf_counter() - t0
            return True
        finally:
            self._mutex.release()

    def _copy(self, rows: np.ndarray, slots: np.ndarray, src_w: torch.Tensor, src_s: torch.Tensor, after: Marker) -> None:
        """Write the store's ``slots`` into host ``rows``; the rows are on host once it returns."""
        host = self.host
        if host.in_place:  # store and host tables in one memory: one compiled pass
            copy_rows_to_host(rows, slots, src_w.numpy(), src_s.numpy(), host.tables["weights"].numpy(),
                              host.tables["state"].numpy(), self._sink)  # fmt: skip
            return
        r = torch.from_numpy(rows)
        # On CUDA: a side stream, after the updates on the device, never behind the step's
        # kernels; only this thread waits for the copy (the rows are on host once it returns).
        with self.streams.side(after):
            r_dev, sl = to_device([r, torch.from_numpy(slots)], host.device)
            host.write("weights", r, src_w.index_select(0, sl), r_dev)
            if self.store.state_width:
                host.write("state", r, src_s.index_select(0, sl), r_dev)
            copied = self.streams.mark()
        copied.synchronize()

    def _flush_background(self) -> bool:
        """A flusher's idle task: one chunk of what is worth flushing ahead of need."""
        return self._flush(self.background_bound(), wait=True, background=True)

    # ------------------------------------------------------------------ counters and shutdown
    def take_counts(self) -> FlushCounts:
        """Rows, bytes and seconds flushed since the previous call; the queue as it is now."""
        with self.lock:
            counts, self._counts = self._counts, FlushCounts()
            counts.queue_depth = self.queue.bucket_sizes()
            counts.pending_rows = len(self.queue)
        return counts

    def stop(self, timeout_s: float) -> None:
        """Stop the flusher threads; pending writes stay pending."""
        for w in self.workers:
            w.stop(timeout_s)
