"""Per-step measurements of the Frugal mechanism."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

import numpy as np

PHASES = ("announce", "lookup", "exchange", "update", "bookkeeping", "flush")
"""Where a rank's training thread spends its engine time in one step (see StepMetrics.phase_s)."""


@dataclass
class StepMetrics:
    """What one rank saw during one training step.

    queue_depth: pending rows of this owner per priority bucket after the step's updates,
        for priorities base, base + 1, ..., base + L + 1, then the INF bucket.
    exchange_wait_s: time apply_gradients waited for the other ranks' gradients (the step's
        barrier; it includes waiting for slower ranks, not only for flushes).
    rows_flushed / bytes_flushed: host writes this rank's flushers (and its gate) applied
        since the previous step's metrics.
    phase_s: seconds of the training thread in the engine since the previous step's metrics,
        by phase (waits excluded; on CUDA, launch time of the device work):
        announce (checking and handing over lookahead and step batches), lookup, exchange
        (staging this rank's gradients and summing the owned rows' gradients of all ranks),
        update (the optimizer on the owner's rows), bookkeeping (ingesting the lookahead on
        this thread if the background has not, retiring the step, queueing the host writes
        with their priorities), flush (writing the rows the next step reads from host).
    """

    step: int
    gate_wait_s: float
    exchange_wait_s: float
    step_time_s: float
    queue_depth: np.ndarray = field(repr=False)
    pending_rows: int
    rows_flushed: int
    bytes_flushed: int
    lookups: int
    cache_hits: int
    dynamic_rows: int
    phase_s: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @property
    def cache_hit_ratio(self) -> float:
        return self.cache_hits / self.lookups if self.lookups else 0.0

    @property
    def gate_stall_fraction(self) -> float:
        return self.gate_wait_s / self.step_time_s if self.step_time_s > 0 else 0.0
