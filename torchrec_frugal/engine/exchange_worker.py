"""The thread that takes a step's gradients off the training thread and does the rest of the step.

Per rank, one worker runs, step after step and in order, what an owner does once a step's
gradients are on the host: stage them for their owners, wait for the peers, sum the owned rows
over ranks, ingest the lookahead, update the owned rows, queue their host writes with their
priorities and flush what the next step reads. The training thread only launches the gradients'
copy to host and hands the step over. It waits for the worker where synchronous training needs
it: at the next step's gate (which waits for every owner's update, this rank's own included),
and at a drain (before a flush, a checkpoint or close).

Where the lookahead has no thread of its own, the worker also publishes this rank's announced
steps, in the order they are announced among the updates (what the training thread would do at
those points): each hand-off gets a ticket, and a gate waits only for the tickets its step needs.

One owner per hand-off: a step handed over belongs to the worker until it is done. A failure on
the worker is handed to ``on_failure``, which makes the engine raise it, with its cause, at the
training thread's next call; the worker then takes no further step.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Deque, Optional

from ..errors import FrugalError


class ExchangeWorker:
    """Runs the steps handed over (callables) one at a time, in order, on a thread of its own."""

    def __init__(self, name: str, on_failure: Callable[[BaseException], None]) -> None:
        self._on_failure = on_failure
        self._todo: Deque[Callable[[], None]] = deque()
        self._cv = threading.Condition()
        self._busy = False
        self._submitted = 0  # tickets handed out: the n-th hand-off has ticket n
        self._woken = 0  # the worker was woken for the hand-offs through this ticket
        self._done = 0  # hand-offs finished (they finish in ticket order)
        self._stopped = False
        self._failed = False
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def submit(self, step: Callable[[], None], wake: bool = True) -> int:
        """Hand a step over (steps run in the order they are handed over); returns its ticket.

        ``wake=False``: an idle worker is not woken for this step (a wake costs the caller a
        switch of threads); it runs with the next step handed over with ``wake``, or at
        :meth:`wake_through`, or once anyone waits for the worker, whichever comes first."""
        with self._cv:
            if self._stopped:
                raise FrugalError(f"{self.thread.name}: stopped, cannot take another step")
            self._todo.append(step)
            self._submitted += 1
            if wake:
                self._wake()
            return self._submitted

    def wake_through(self, ticket: int) -> None:
        """Make sure the hand-off of ``ticket`` runs now (a no-op if a wake came after it): the
        caller is about to depend on it."""
        with self._cv:
            if self._woken < ticket:
                self._wake()

    def _wake(self) -> None:
        """Wake the worker for every hand-off so far (lock held)."""
        self._woken = self._submitted
        self._cv.notify_all()

    @property
    def pending(self) -> int:
        """Steps handed over and not finished."""
        with self._cv:
            return len(self._todo) + self._busy

    def wait_done(self, timeout_s: float, ticket: Optional[int] = None) -> bool:
        """Wait (at most ``timeout_s``) until the hand-off of ``ticket`` (default: every one) is
        done; True if it is. A gate waiting for this rank's own update wakes here the moment the
        worker has done it, not a poll later, and does not wait for what was handed over after it."""
        with self._cv:
            if self._todo:  # steps handed over without a wake are waited for now
                self._wake()
            return self._cv.wait_for(lambda: not self._unfinished(ticket), timeout_s)

    def done_through(self, ticket: int) -> bool:
        """Whether the hand-offs through ``ticket`` are done (or will never run: failed, stopped)."""
        with self._cv:
            return not self._unfinished(ticket)

    def _unfinished(self, ticket: Optional[int] = None) -> bool:
        """A step (through ``ticket``) is running (it always ends, reported), or waits for a worker
        that still runs (lock held)."""
        if ticket is not None:
            return self._done < ticket and (self._busy or not (self._failed or self._stopped))
        return self._busy or (bool(self._todo) and not self._failed and not self._stopped)

    def drain(self, timeout_s: float) -> None:
        """Wait until every step handed over is done (or the worker failed or stopped)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            if self._todo:  # steps handed over without a wake are waited for now
                self._wake()
            while self._unfinished():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FrugalError(
                        f"{self.thread.name}: {len(self._todo) + self._busy} step(s) not done after {timeout_s:g} s"
                    )
                self._cv.wait(left)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._todo and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
                step = self._todo.popleft()
                self._busy = True
            try:
                step()
            except BaseException as e:  # surfaced on the training thread at its next call
                with self._cv:
                    self._failed = True
                    self._todo.clear()
                self._on_failure(e)
            finally:
                with self._cv:
                    self._busy = False
                    self._done += 1
                    self._cv.notify_all()
            if self._failed:
                return

    def stop(self, timeout_s: float) -> None:
        """Take no further step; wait (up to ``timeout_s``) for the one running."""
        with self._cv:
            self._stopped = True
            self._todo.clear()
            self._cv.notify_all()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=timeout_s)
