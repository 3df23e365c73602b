"""The one pattern of every background thread that does a step's work: an ordered worker.

The planner (batches copied and planned ahead), the exchange worker (a step's update), the
lookahead worker (publish and ingest) and the flushers (host writes) each run on one
:class:`Worker`. A worker runs the jobs handed to it one at a time, in the order they were handed
over, each with a ticket a caller can wait for; between jobs it runs its ``idle`` task (planning
a copied batch, ingesting what peers published, flushing a chunk) for as long as that finds work,
then sleeps until a job, a :meth:`Worker.wake` or its poll interval. One owner per hand-off: a job
handed over belongs to the worker until it is done. A job or idle task that raises stops the
worker and is handed to ``on_failure`` (the engine raises it, with its cause, at the training
thread's next call), even where the job stopped the worker itself on its way out (a rank
aborting); the worker then runs nothing more. A drain waits for every job handed over; ``stop``
drops the jobs not started, and a long job polls :attr:`Worker.stopped` to leave early.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Deque, Optional, Tuple

from .errors import FrugalError


class Worker:
    """Runs jobs (callables) one at a time, in order, on a thread of its own; ``idle`` between.

    ``idle``: called while no job waits; returns whether it found work (then it is called again at
    once). ``poll_s``: (first, longest) sleep between idle calls that found nothing, doubling from
    the first; None: sleep until a job or :meth:`wake` (the idle task's work always comes with one).
    """

    def __init__(
        self,
        name: str,
        on_failure: Callable[[BaseException], None],
        idle: Optional[Callable[[], bool]] = None,
        poll_s: Optional[Tuple[float, float]] = None,
    ) -> None:
        self._on_failure = on_failure
        self._idle = idle
        self._poll_s = poll_s
        self._todo: Deque[Callable[[], None]] = deque()
        self._cv = threading.Condition()
        self._busy = False
        self._nudged = False  # woken for the idle task since it last found nothing
        self._submitted = 0  # tickets handed out: the n-th hand-off has ticket n
        self._woken = 0  # the worker was woken for the hand-offs through this ticket
        self._done = 0  # hand-offs finished (they finish in ticket order)
        self._stopped = False
        self._failed = False
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ hand-offs
    def submit(self, job: Callable[[], None], wake: bool = True) -> int:
        """Hand a job over (jobs run in the order they are handed over); returns its ticket.

        ``wake=False``: an idle worker is not woken for this job (a wake costs the caller a
        switch of threads); it runs with the next job handed over with ``wake``, at
        :meth:`wake_through`, once anyone waits for the worker, or at the worker's next poll."""
        with self._cv:
            if self._stopped:
                raise FrugalError(f"{self.thread.name}: stopped, cannot take another job")
            self._todo.append(job)
            self._submitted += 1
            if wake:
                self._wake()
            return self._submitted

    def wake(self) -> None:
        """Wake the worker for its idle task: there may be work for it."""
        with self._cv:
            self._nudged = True
            self._cv.notify_all()

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

    # ------------------------------------------------------------------ waiting for it
    @property
    def pending(self) -> int:
        """Jobs handed over and not finished."""
        with self._cv:
            return len(self._todo) + self._busy

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (a long job polls this to leave early)."""
        return self._stopped

    def wait_done(self, timeout_s: float, ticket: Optional[int] = None) -> bool:
        """Wait (at most ``timeout_s``) until the hand-off of ``ticket`` (default: every one) is
        done; True if it is. A caller waiting for one job wakes the moment the worker has done
        it, not a poll later, and does not wait for what was handed over after it."""
        with self._cv:
            if self._todo:  # jobs handed over without a wake are waited for now
                self._wake()
            return self._cv.wait_for(lambda: not self._unfinished(ticket), timeout_s)

    def done_through(self, ticket: int) -> bool:
        """Whether the hand-offs through ``ticket`` are done (or will never run: failed, stopped)."""
        with self._cv:
            return not self._unfinished(ticket)

    def _unfinished(self, ticket: Optional[int] = None) -> bool:
        """A job (through ``ticket``) is running (it always ends, reported), or waits for a worker
        that still runs (lock held)."""
        if ticket is not None:
            return self._done < ticket and (self._busy or not (self._failed or self._stopped))
        return self._busy or (bool(self._todo) and not self._failed and not self._stopped)

    def drain(self, timeout_s: float) -> None:
        """Wait until every job handed over is done (or the worker failed or stopped)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            if self._todo:  # jobs handed over without a wake are waited for now
                self._wake()
            while self._unfinished():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FrugalError(
                        f"{self.thread.name}: {len(self._todo) + self._busy} job(s) not done after {timeout_s:g} s"
                    )
                self._cv.wait(left)

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        first, longest = self._poll_s if self._poll_s else (None, None)
        sleep = first
        while True:
            with self._cv:
                if self._stopped or self._failed:
                    return
                job = self._todo.popleft() if self._todo else None
                self._busy = job is not None
                if job is None:
                    self._nudged = False
            if job is not None:
                self._run(job)
            elif self._idle is None or not self._run(self._idle):
                with self._cv:
                    if not (self._todo or self._nudged or self._stopped or self._failed):
                        self._cv.wait(sleep)
                if sleep is not None:
                    sleep = min(2 * sleep, longest)  # type: ignore[type-var]
                continue
            sleep = first  # work was found: the next idle poll comes soon again

    def _run(self, task: Callable[[], object]) -> bool:
        """Run a job (``self._busy``) or the idle task; a failure stops the worker, reported."""
        is_job = self._busy
        found = False
        try:
            found = bool(task())
        except BaseException as e:  # surfaced on the training thread at its next call
            with self._cv:
                self._failed = True
                self._todo.clear()
            self._on_failure(e)
        finally:
            if is_job:
                with self._cv:
                    self._busy = False
                    self._done += 1
                    self._cv.notify_all()
        return found

    def stop(self, timeout_s: Optional[float]) -> None:
        """Take no further job; wait (up to ``timeout_s``; None: as long as it takes) for the one running."""
        with self._cv:
            self._stopped = True
            self._todo.clear()
            self._cv.notify_all()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=timeout_s)
