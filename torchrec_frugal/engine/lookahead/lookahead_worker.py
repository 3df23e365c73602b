"""The thread that keeps the lookahead bookkeeping off the training thread.

Per rank, one worker (a :class:`~torchrec_frugal.worker.Worker`) does, in order and in the
background, what the lookahead costs:

* its jobs: publish each announced step of this rank (the unique rows it reads from host that may
  have a pending write, grouped by owner, written into its ring slot; this may wait for the owners
  to free the slot, and ingests meanwhile), and
* its idle task: ingest every step all ranks have published into the owner's window and queue
  (merge, next reads, re-prioritised deferred rows), polled, since peers' publishes come unannounced.

The training thread only hands over a copy of the ids. Exactness does not depend on how far
the worker has got: an owner publishes its flush progress only through the newest step it has
ingested, so a gate simply waits (and ingests itself) if the worker lags. A failure in the
worker is handed to ``on_failure``; the engine raises it at its next call.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from ...worker import Worker

POLL_S = (20e-6, 1e-3)  # ingest poll back-off while peers have published nothing new


class _Stopped(Exception):
    """Raised inside a publish's wait for a ring slot when the engine closes, to leave it at once."""


class LookaheadWorker:
    """Publishes this rank's announced steps in order and ingests published steps.

    ``publish`` and ``ingest`` are the callables it runs, public so that a test can wrap
    ``publish`` to make the worker lag behind the training thread.
    """

    def __init__(
        self,
        name: str,
        publish: Callable[[int, np.ndarray, Callable[[], bool]], None],
        ingest: Callable[[], bool],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.publish = publish
        self.ingest = ingest
        self._worker = Worker(name, on_failure, idle=lambda: self.ingest(), poll_s=POLL_S)

    @property
    def thread(self) -> threading.Thread:
        return self._worker.thread

    def announce(self, step: int, rows: np.ndarray) -> None:
        """Queue step ``step``'s rows for publishing (steps arrive in order)."""
        self._worker.submit(lambda: self._publish(step, rows))

    def wake(self) -> None:
        """Ingest now: a wait depends on it."""
        self._worker.wake()

    def _publish(self, step: int, rows: np.ndarray) -> None:
        try:
            self.publish(step, rows, self._while_waiting)
        except _Stopped:  # the engine closes: the publish is dropped, as the steps not started are
            pass

    def _while_waiting(self) -> bool:
        """What a publish does while it waits for a ring slot: ingest; leave if stopped."""
        if self._worker.stopped:
            raise _Stopped()
        return self.ingest()

    def stop(self, timeout_s: float) -> None:
        self._worker.stop(timeout_s)
