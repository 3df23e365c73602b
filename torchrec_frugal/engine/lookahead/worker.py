"""The thread that keeps the lookahead bookkeeping off the training thread.

Per rank, one worker does, in order and in the background, what the lookahead costs:

* publish each announced step of this rank (the unique rows it reads from host that may have a
  pending write, grouped by owner, written into its ring slot; this may wait for the owners to free the slot, and
  ingests meanwhile), and
* ingest every step all ranks have published into the owner's window and queue (merge, next
  reads, re-prioritised deferred rows).

The training thread only hands over a copy of the ids. Exactness does not depend on how far
the worker has got: an owner publishes its flush progress only through the newest step it has
ingested, so a gate simply waits (and ingests itself) if the worker lags. A failure in the
worker is handed to ``on_failure``; the engine raises it at its next call.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Deque, Tuple

import numpy as np


class _Stopped(Exception):
    """Raised inside a wait of the worker when the engine closes, to leave it at once."""


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
        self._on_failure = on_failure
        self._todo: Deque[Tuple[int, np.ndarray]] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._idle_s = (20e-6, 1e-3)  # poll back-off while peers have published nothing new
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def announce(self, step: int, rows: np.ndarray) -> None:
        """Queue step ``step``'s rows for publishing (steps arrive in order)."""
        self._todo.append((step, rows))
        self._wake.set()

    def _loop(self) -> None:
        sleep = self._idle_s[0]
        try:
            while not self._stop:
                did = False
                if self._todo:
                    t, rows = self._todo[0]
                    self.publish(t, rows, self._idle)
                    self._todo.popleft()
                    did = True
                if self.ingest():
                    did = True
                if did:
                    sleep = self._idle_s[0]
                    continue
                self._wake.wait(sleep)
                self._wake.clear()
                sleep = min(2 * sleep, self._idle_s[1])
        except _Stopped:
            return
        except BaseException as e:  # surfaced to the training thread at its next call
            if not self._stop:
                self._on_failure(e)

    def _idle(self) -> bool:
        """What the worker does while its publish waits for a slot: ingest; leave if stopped."""
        if self._stop:
            raise _Stopped()
        return self.ingest()

    def stop(self, timeout_s: float) -> None:
        self._stop = True
        self._wake.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=timeout_s)
