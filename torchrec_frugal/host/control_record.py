"""The control block: each rank's progress counters in shared memory, and waits on them.

There is no central controller: each rank publishes how far it has got (grads staged, updates
applied, host flushed through step t, lookahead published and ingested), its status and pid, and
the size of its mailbox records, in one row of a shared int64 block that every rank maps with the
host tables. A wait polls those counters until a condition holds; it watches the peers' pids and
status and gives up after a timeout, naming the rank at fault. Each wait names its kind, and the
seconds waited add up per kind (what StepMetrics.wait_s reports). What the counters mean for the
training step (the gate, the barriers) is ``gate``'s.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from ..errors import RankLostError
from ..metrics import WAIT_KINDS
from .shm import Field, pid_alive

PID, STATUS, STAGED, UPDATED, FLUSHED, PUBLISHED, INGESTED, SYNC, CAUSE, RING_ROWS, GRAD_ROWS = range(11)
NUM_FIELDS = 11  # CAUSE: 1 + the rank whose loss made this rank fail (its own rank otherwise)
# RING_ROWS, GRAD_ROWS: the size of each rank's mailbox records (see mailbox.py)
RUNNING, CLOSED, FAILED = 0, 1, 2


def control_field(world_size: int) -> Field:
    """The block in the host segment's layout: a row of NUM_FIELDS counters per rank."""
    return Field("control", torch.int64, (world_size, NUM_FIELDS))


class Control:
    """Typed access to the shared counters; ``block[r, FIELD]``."""

    def __init__(self, block: torch.Tensor, rank: int, timeout_s: float) -> None:
        self.block = block.numpy()
        self.rank = rank
        self.world_size = self.block.shape[0]
        self.timeout_s = timeout_s
        self._waited = dict.fromkeys(WAIT_KINDS, 0.0)
        self._waited_lock = threading.Lock()  # the training thread and the lookahead worker wait

    def set(self, field: int, value: int) -> None:
        self.block[self.rank, field] = value

    def get(self, field: int) -> np.ndarray:
        return self.block[:, field].copy()

    def behind(self, field: int, step: int) -> List[int]:
        """The ranks whose counter ``field`` is below ``step``."""
        return [r for r, v in enumerate(self.get(field)) if v < step]

    def wait(
        self, kind: str, lagging: Callable[[], List[int]], what: str, idle: Optional[Callable[[], bool]] = None
    ) -> float:
        """Block until ``lagging()`` is empty; returns seconds waited, also added to ``kind``'s total.

        ``idle`` is called between polls and returns True if it did useful work (then we poll
        again at once). Raises RankLostError if a rank we wait for died, failed or closed, or if
        nothing changed for ``timeout_s``.
        """
        waited = self._wait(lagging, what, idle)
        with self._waited_lock:
            self._waited[kind] += waited
        return waited

    def take_waited(self) -> Dict[str, float]:
        """Seconds waited per kind (WAIT_KINDS) since the previous call."""
        with self._waited_lock:
            waited, self._waited = self._waited, dict.fromkeys(WAIT_KINDS, 0.0)
        return waited

    def _wait(self, lagging: Callable[[], List[int]], what: str, idle: Optional[Callable[[], bool]]) -> float:
        t0 = time.perf_counter()
        waiting = lagging()
        if not waiting:
            return 0.0
        sleep = 20e-6
        last_check = t0
        deadline = t0 + self.timeout_s
        while waiting:
            if idle is not None and idle():
                sleep = 20e-6
            else:
                time.sleep(sleep)
                sleep = min(sleep * 2, 1e-3)
            now = time.perf_counter()
            if now - last_check > 0.1:
                last_check = now
                self._check_peers(waiting, what)
                if now > deadline:
                    raise RankLostError(
                        f"rank {self.rank} waited {self.timeout_s:.0f} s for {what}; "
                        f"rank(s) {waiting} made no progress (timeout_s={self.timeout_s})",
                        lost_rank=waiting[0],
                    )
            waiting = lagging()
        return time.perf_counter() - t0

    def fail(self, cause_rank: int) -> None:
        """Mark this rank failed, recording which rank's loss caused it (for the peers' messages)."""
        self.block[self.rank, CAUSE] = cause_rank + 1
        self.block[self.rank, STATUS] = FAILED

    def _check_peers(self, waiting: List[int], what: str) -> None:
        status = self.get(STATUS)
        pids = self.get(PID)
        others = [r for r in range(self.world_size) if r != self.rank]
        # A dead process is the root cause; report it before the ranks that failed because of it.
        for r in others:
            if status[r] != CLOSED and not pid_alive(int(pids[r])):
                raise RankLostError(
                    f"rank {r} (pid {pids[r]}) is gone (killed or exited) while rank {self.rank} waited for {what}",
                    lost_rank=r,
                )
        for r in others:
            if status[r] == FAILED:
                cause = int(self.block[r, CAUSE]) - 1
                if 0 <= cause != r:
                    raise RankLostError(
                        f"rank {cause} (pid {pids[cause]}) was lost (reported by rank {r}) while rank {self.rank} "
                        f"waited for {what}",
                        lost_rank=cause,
                    )
                raise RankLostError(f"rank {r} (pid {pids[r]}) failed while rank {self.rank} waited for {what}", lost_rank=r)
            if r in waiting and status[r] == CLOSED:
                raise RankLostError(
                    f"rank {r} (pid {pids[r]}) closed its engine while rank {self.rank} waited for {what}", lost_rank=r
                )
