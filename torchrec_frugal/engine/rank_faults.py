"""How a rank fails: a failure anywhere marks it in the control block, so that peers stop waiting.

A background thread's failure (flusher, lookahead or exchange worker) is kept and raised on the
training thread at its next call; a failure of the training thread's own protocol aborts the rank
at once: its background threads stop and the run's shared segments are removed.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Protocol

from ..host import shm
from ..host.control_record import Control
from ..errors import FrugalError, FrugalInputError, RankLostError


class Stoppable(Protocol):
    """A background part of the engine (exchange worker, flusher, lookahead feed)."""

    def stop(self, timeout_s: float) -> None: ...


class RankFaults:
    """The failure state of one rank's engine, and the background parts a failure stops."""

    def __init__(self, rank: int, control: Control, run_id: str, shm_dir: str, timeout_s: float) -> None:
        self._rank = rank
        self._control = control
        self._run_id = run_id
        self._shm_dir = shm_dir
        self._timeout_s = timeout_s
        self._background: List[Stoppable] = []  # stopped in this order
        self.failure: Optional[BaseException] = None  # a background thread's, raised at the next call
        self.closed = False

    def stopping(self, *background: Stoppable) -> None:
        """Stop ``background`` (in order) at :meth:`stop_background`."""
        self._background.extend(background)

    def stop_background(self) -> None:
        for part in self._background:
            part.stop(self._timeout_s)

    def raise_if_failed(self) -> None:
        failure = self.failure
        if failure is not None:
            message = f"rank {self._rank}: a background thread (flusher, lookahead or exchange) failed: {failure!r}"
            if isinstance(failure, RankLostError):  # a peer was lost: say so, as the training thread would
                raise RankLostError(message, failure.lost_rank) from failure
            raise FrugalError(message) from failure
        if self.closed:
            raise FrugalError(f"rank {self._rank}: the engine is closed")

    def guard(self, fn: Callable[[], object]) -> object:
        """Run a step of the protocol; any failure marks this rank failed so peers stop waiting."""
        try:
            return fn()
        except FrugalInputError:
            raise
        except RankLostError as e:
            self.abort(e.lost_rank)
            raise
        except BaseException:
            self.abort(self._rank)
            raise

    def fail_from_thread(self, e: BaseException) -> None:
        """A background thread failed: the training thread raises it at its next call."""
        self.failure = e
        self._control.fail(self._rank)

    def abort(self, cause_rank: int) -> None:
        self._control.fail(cause_rank)
        self.stop_background()
        shm.remove_run_segments(self._run_id, self._shm_dir)
