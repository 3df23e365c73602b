"""Per-step measurements of the Frugal mechanism."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepMetrics:
    """What one rank saw during one training step.

    queue_depth: pending rows of this owner per priority bucket after the step's updates,
        for priorities base, base + 1, ..., base + L + 1, then the INF bucket.
    exchange_wait_s: time apply_gradients waited for the other ranks' gradients (the step's
        barrier; it includes waiting for slower ranks, not only for flushes).
    rows_flushed / bytes_flushed: host writes this rank's flushers (and its gate) applied
        since the previous step's metrics.
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

    @property
    def cache_hit_ratio(self) -> float:
        return self.cache_hits / self.lookups if self.lookups else 0.0

    @property
    def gate_stall_fraction(self) -> float:
        return self.gate_wait_s / self.step_time_s if self.step_time_s > 0 else 0.0
