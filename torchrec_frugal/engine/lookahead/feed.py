"""The lookahead of one rank, end to end: its future steps announced, published and ingested.

Words used throughout (one action each):

* announce: the rank declares the rows of one of its future steps (``push_lookahead``, or
  ``begin_step`` for a step that was not pushed). Steps are announced in order, at most L ahead.
* publish: an announced step's rows are written into the rank's ring slot for their owners and
  its PUBLISHED counter raised (``LookaheadRing.publish``): by the lookahead worker on an
  accelerator, else handed over to the exchange worker (in announce order among the updates).
* ingest: an owner takes a step every rank has published into its window (the next host read of
  each row it owns) and gives the deferred rows that step reads a finite priority in the queue.

An owner's window must run ahead of the steps its peers start: with deferred rows pending, its
FLUSHED counter says "current through the newest ingested step". Each job has one thread: publish
and ingest run on the lookahead worker where there is one (an accelerator), which keeps the window
ahead in the background; without one (a CPU device) both run on the exchange worker, which ingests
at each update and whenever the training thread's gate asks it to (:meth:`StepUpdate.wait_gate`).
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Deque, List, Optional, Tuple, Union

import numpy as np
import torch

from ...host.control_record import INGESTED, PUBLISHED, Control
from ...errors import FrugalError, FrugalInputError
from ...worker import Worker
from ..flush.flusher import Flusher
from .window import LookaheadWindow
from .ring import LookaheadRing
from .lookahead_worker import LookaheadWorker
from ...metrics import WAIT_PUBLISHED


class LookaheadFeed:
    """This rank's announced steps (in order, checked against the batches trained), their
    publishing, and, as an owner, the ingestion of every rank's published steps."""

    def __init__(
        self,
        lookahead: int,
        ring: LookaheadRing,
        window: Optional[LookaheadWindow],
        flusher: Flusher,
        control: Control,
        thread: bool,
        exchange: Worker,
        guard: Callable[[Callable[[], object]], object],
        check_failed: Callable[[], None],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.lookahead = lookahead
        self.ring = ring
        self.window = window
        self.flusher = flusher
        self.control = control
        # Without a lookahead worker: the exchange worker a publish is handed to (in order among
        # the updates, with a ticket).
        self._exchange = exchange
        self._guard = guard  # a failing publish fails the rank, as any step would
        self.check_failed = check_failed  # raises if this rank failed (its peers may be waiting for it)
        self._next = 0  # the next step to announce
        # Announced by push, not begun: (step, rows, the exchange worker's ticket of its publish, if handed over)
        self._pushed: Deque[Tuple[int, torch.Tensor, Optional[int]]] = deque()
        self.worker = (
            LookaheadWorker(f"frugal-lookahead-{control.rank}", ring.publish, self.ingest_available, on_failure)
            if lookahead > 0 and thread
            else None
        )

    # ------------------------------------------------------------------ this rank's steps
    @property
    def steps_ahead(self) -> int:
        """Steps announced by push and not begun yet."""
        return len(self._pushed)

    def room(self, step_now: int) -> int:
        """The step the next push announces; raises if the window is full (steps through step_now + L)."""
        t = self._next
        if t > step_now + self.lookahead:
            raise FrugalInputError(
                f"lookahead window full: step {t} pushed while step {step_now} runs with lookahead={self.lookahead}"
            )
        return t

    def push(self, rows: torch.Tensor) -> None:
        """Announce ``rows`` (checked, owned by the feed from now on) as step :meth:`room` returned."""
        t = self._next
        self._next = t + 1
        # Handed over without a wake: it runs with the next update's hand-off, or at the latest
        # when step t begins (begin wakes the worker for it).
        self._pushed.append((t, rows, self._announce(t, rows, wake=False)))

    def pushed(self, step: int) -> Optional[torch.Tensor]:
        """The rows pushed for ``step`` (checked when they were), where step ``step`` is the next to begin."""
        if self._pushed and self._pushed[0][0] == step:
            return self._pushed[0][1]
        return None

    def begin(self, step: int, rows: torch.Tensor, owned: bool = False) -> Optional[int]:
        """Step ``step`` starts with ``rows``: they must be the ones pushed for it, if any were.

        ``owned``: nobody changes ``rows`` later (a plan's), so they need no copy; the very
        tensor pushed for the step needs no comparison either. Returns the exchange worker's
        ticket of the step's publish if it was handed over now (the step's gate waits for it).
        """
        if self._pushed:
            t, expected, ticket = self._pushed[0]
            if t != step:
                raise FrugalError(f"rank {self.control.rank}: lookahead holds step {t} while step {step} starts")
            if expected is not rows and not torch.equal(expected, rows):
                raise FrugalInputError(
                    f"step {step}: the batch trained differs from the lookahead batch pushed for it "
                    f"({rows.numel()} rows trained, {expected.numel()} pushed)"
                )
            self._pushed.popleft()
            if ticket is not None:
                # Its publish runs before this step's gate: every rank's gate of step t waits for
                # the owners to ingest step t, which needs each rank's publish of it.
                self._exchange.wake_through(ticket)
            return None
        self._next = step + 1
        return self._announce(step, rows if owned else rows.clone())

    def _announce(self, t: int, rows: torch.Tensor, wake: bool = True) -> Optional[int]:
        """Publish step t's rows to their owners: through the lookahead worker, or handed over to
        the exchange worker (returns its ticket; ``wake=False``: the worker need not wake for it,
        see ``Worker.submit``)."""
        if self.worker is not None:
            self.worker.announce(t, rows.numpy())
        elif self.lookahead > 0:
            return self._exchange.submit(lambda: self._guard(lambda: self.ring.publish(t, rows.numpy(), self.ingest_available)), wake)
        return None

    # ------------------------------------------------------------------ this rank as an owner
    def ingest_available(self, through: Optional[int] = None) -> bool:
        """Ingest every step all ranks have published (at least through ``through``); True if any.

        Only the ingester calls it (the lookahead worker, else the exchange worker), so steps
        arrive in order without a lock of their own."""
        if self.window is None:
            return False
        flusher = self.flusher
        did = False
        while True:
            t = self.window.last_step + 1  # only the ingester moves it
            with flusher.lock:
                room = t <= flusher.queue.base + self.lookahead + 1
            if not room:
                return did
            if self.ring.published_through() < t:
                if through is not None and t <= through:
                    raise FrugalError(f"rank {self.control.rank}: step {t} must be ingested but is not published")
                return did
            rows_t = self.ring.collect(t)
            with flusher.lock:
                newly = self.window.add_step(t, rows_t)
                if newly.size:
                    flusher.queue.undefer(newly, t)  # deferred rows read at t are due then; a step's rows are unique
                self.control.set(INGESTED, t)
                flusher.publish_progress()
                flusher.wake_all()
            did = True

    @property
    def ingests_on_exchange(self) -> bool:
        """Whether this rank's ingester is the exchange worker (no lookahead worker, a window to fill)."""
        return self.window is not None and self.worker is None

    def wake_ingester(self) -> None:
        """A wait depends on this owner's ingestion: the lookahead worker, if any, looks now."""
        if self.worker is not None:
            self.worker.wake()

    def ingest_through(self, step: int) -> None:
        """On the exchange worker, before step ``step``'s update: the window holds step ``step``,
        which every rank announced. The exchange worker ingests it (and all there is) where it
        is the ingester, else waits for the lookahead worker to."""
        if self.window is None:
            return
        if self.worker is None:
            if self.window.last_step < step:
                self.control.wait(
                    WAIT_PUBLISHED, lambda: self.control.behind(PUBLISHED, step),
                    f"the lookahead of step {step} to be published", self._ingest_meanwhile,
                )  # fmt: skip
            self.ingest_available(through=step)
        elif self.window.last_step < step:
            self.control.wait(WAIT_PUBLISHED, lambda: self._not_ingested(step), f"the lookahead of step {step}", self._wake_worker)

    def _ingest_meanwhile(self) -> bool:
        """The ingester's wait for peers' publishes: fail if this rank failed, else ingest."""
        self.check_failed()
        return self.ingest_available()

    def _not_ingested(self, step: int) -> List[int]:
        """The ranks whose publish of ``step`` is missing; this rank while its worker has not ingested it."""
        behind = self.control.behind(PUBLISHED, step)
        return behind or ([] if self.window.last_step >= step else [self.control.rank])  # type: ignore[union-attr]

    def _wake_worker(self) -> bool:
        self.check_failed()
        self.wake_ingester()
        return False

    def retire(self, step: int) -> None:
        """Forget the reads of steps through ``step`` (flusher lock held)."""
        if self.window is not None:
            self.window.retire(step)

    def priorities(self, rows: np.ndarray, step: int) -> Union[int, np.ndarray]:
        """Flush priorities of ``rows`` updated at ``step``: their next host read (flusher lock held).

        Without a lookahead every update is due at the next step (write-through).
        """
        return step + 1 if self.window is None else self.window.priorities(rows)

    def stop(self, timeout_s: float) -> None:
        if self.worker is not None:
            self.worker.stop(timeout_s)
