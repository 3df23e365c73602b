"""A step's update, from backward's hand-off to its metrics.

The training thread only launches the copy of its step's gradients to host and hands the step
over (:meth:`StepUpdate.hand_over`); the exchange worker then stages the gradients sorted by owner,
waits for every rank's, sums the gradients of the rows this rank owns, applies the optimizer
(``owner_update``), queues the host writes by the step at which a rank next reads each row from
host, flushes what is due and records the step's metrics (:meth:`StepUpdate.run`). The next
step's gate (:meth:`StepUpdate.wait_gate`) waits for that update, and for every owner's.

The exchange worker is one :class:`~torchrec_frugal.worker.Worker` a rank: the steps handed over
run on it in order, each with a ticket, and a gate waits only for the tickets its step needs. A
step handed over belongs to the worker until it is done; a failure there is raised, with its
cause, at the training thread's next call. Where the lookahead has no thread of its own (a CPU
device), the worker also publishes this rank's announced steps, in announce order among the updates.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, Deque, List, Optional

import numpy as np
import torch

from ..host.control_record import FLUSHED, UPDATED, Control
from ..worker import Worker
from .flush.flusher import Flusher
from .gate import lagging_owners
from .gradient_exchange import GradientExchange
from .gradient_staging import GradientStaging
from .lookahead.feed import LookaheadFeed
from ..host.mailbox import Record
from ..metrics import WAIT_GATE, StepMetrics, StepRecorder
from .owner_cache import OwnerStore
from .owner_update import OwnerUpdate
from .streams import Marker, Streams


class StepUpdate:
    """The update half of every step of one rank's engine, run by its exchange worker."""

    def __init__(
        self, rank: int, grad_record: Record, control: Control, owner: np.ndarray, dim: int, device: torch.device,
        owner_update: OwnerUpdate, store: OwnerStore, flusher: Flusher, lookahead_feed: LookaheadFeed,
        streams: Streams, worker: Worker, recorder: StepRecorder, guard: Callable[[Callable[[], object]], object],
    ) -> None:  # fmt: skip
        self._exchange = GradientExchange(grad_record, control, owner, dim)
        self._staging = GradientStaging(dim, device)
        self._rank = rank
        self._control = control
        self._owner_update = owner_update
        self._store = store
        self._flusher = flusher
        self._feed = lookahead_feed
        self._streams = streams
        self._worker = worker
        self._recorder = recorder
        self._guard = guard
        # The exchange worker's last hand-off the next step's gate waits for: the previous step's
        # update, or the step's own publish when begin_step announces it.
        self.ticket = 0
        self._serving = 0  # the exchange worker's ticket of the latest serve_gate
        self._served = False  # whether it found work (then the gate asks again at once)
        self.last_metrics: Optional[StepMetrics] = None  # of the newest step whose update is done
        self._finished: Deque[StepMetrics] = deque(maxlen=4096)  # since the last take_metrics()

    def hand_over(self, s: int, iteration: int, rows: torch.Tensor, grads: torch.Tensor, reads_done: Marker, divide_by: int) -> None:
        """Launch the copy of step ``s``'s gradients to host and hand its update to the exchange
        worker. ``divide_by``: on an accelerator before the copy, else where the update runs, the
        same division either way."""
        if grads.requires_grad:
            grads = grads.detach()
        if divide_by != 1 and grads.device.type != "cpu":
            grads, divide_by = grads / divide_by, 1
        host_grads, copied = self._staging.to_host(grads)
        self.ticket = self._worker.submit(lambda: self._handed_over(s, iteration, rows, host_grads, copied, reads_done, divide_by))

    def _handed_over(
        self, s: int, iteration: int, rows: torch.Tensor, grads: torch.Tensor, copied: Marker, reads_done: Marker,
        divide_by: int,
    ) -> None:
        """Step ``s``'s update on the exchange worker, once its gradients are on the host."""
        copied.synchronize()
        self._guard(lambda: self.run(s, iteration, rows, grads, reads_done, divide_by))

    def wait_gate(self, s: int) -> float:
        """Wait until step ``s`` may read: every owner applied step s - 1 and has no pending host
        write read at s; returns the seconds waited.

        The training thread only waits: its own update, then the owners. What this owner still
        has to do for the gate runs on the threads that own it: ingesting the peers' publishes
        and flushing the rows step ``s`` reads on the exchange worker where no lookahead worker or
        flusher does (:meth:`serve_gate`, handed over while the gate waits), else on those workers.
        """
        worker, feed = self._worker, self._feed

        def idle() -> bool:
            feed.check_failed()
            ticket = self.ticket  # this rank's own update of step s - 1 (and its flush)
            if not worker.done_through(ticket):
                return worker.wait_done(2e-3, ticket)
            feed.wake_ingester()
            if not feed.ingests_on_exchange and self._flusher.workers:
                return False  # the lookahead worker and the flushers do what the gate waits for
            if worker.done_through(self._serving):
                self._serving = worker.submit(lambda: self._guard(lambda: self.serve_gate(s)))
            return worker.wait_done(2e-3, self._serving) and self._served

        return self._control.wait(WAIT_GATE, lambda: lagging_owners(self._control, s), f"the gate of step {s}", idle)

    def serve_gate(self, s: int) -> None:
        """On the exchange worker, for a gate of step ``s`` that waits: ingest what the peers
        published (where no lookahead worker does) and flush the rows step ``s`` reads (where no
        flusher does)."""
        found = bool(self._feed.ingests_on_exchange and self._feed.ingest_available())
        if not self._flusher.workers and self._control.get(FLUSHED)[self._rank] < s:
            while self._flusher.flush_once(max_priority=s, wait=False):
                found = True
        self._served = found

    def run(
        self, s: int, iteration: int, rows: torch.Tensor, grads: torch.Tensor, reads_done: Marker, divide_by: int
    ) -> None:
        """Step ``s``'s update on the exchange worker; its phases are timed into the step's metrics
        (exchange: staging and the sum, not the wait; update: the optimizer; bookkeeping: the
        window, the queue and the counters; flush: the rows the next step reads)."""
        flusher, feed, rec = self._flusher, self._feed, self._recorder
        start = time.perf_counter()
        self._exchange.stage(s, rows, grads, reads_done, divide_by)
        staged = time.perf_counter()
        rec.exchange_wait_s = self._exchange.wait_staged(
            s, idle=lambda: flusher.flush_once(max_priority=flusher.background_bound(), wait=False)
        )
        all_staged = time.perf_counter()
        owned, summed = self._exchange.sum_owned()
        summed_at = time.perf_counter()
        rec.add("exchange", (staged - start) + (summed_at - all_staged))

        feed.ingest_through(s)
        with flusher.lock:
            feed.retire(s)
            flusher.queue.advance(s + 1)
            update_start = time.perf_counter()
            held = self._owner_update.apply(iteration, owned, summed)
            updated = self._streams.mark()
            update_end = time.perf_counter()
            flusher.queue_writes(held, feed.priorities(held, s), updated)
            self._control.set(UPDATED, s)
        queued = time.perf_counter()
        rec.add("update", update_end - update_start)
        rec.add("bookkeeping", (update_start - summed_at) + (queued - update_end))
        flusher.flush_due(s)
        rec.add("flush", time.perf_counter() - queued)
        self.last_metrics = rec.finish(s, flusher.take_counts(), self._store.dynamic_in_use, self._control.take_waited())
        self._finished.append(self.last_metrics)

    def take_metrics(self) -> List[StepMetrics]:
        """The metrics of every step whose update finished since the last call, oldest first."""
        out = []
        while self._finished:
            out.append(self._finished.popleft())
        return out
