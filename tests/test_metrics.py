"""StepRecorder: a step's phases, lookups, waits and flushes become its StepMetrics, then start over."""
from __future__ import annotations

import numpy as np

from torchrec_frugal.engine.flush.flusher import FlushCounts
from torchrec_frugal.metrics import PHASES, WAIT_KINDS, StepRecorder


def test_a_step_is_recorded_once_then_the_counts_start_over() -> None:
    rec = StepRecorder()
    rec.add("lookup", 0.25)
    rec.add("lookup", 0.25)
    rec.lookups, rec.cache_hits = 8, 6
    rec.gate_wait_s, rec.exchange_wait_s = 0.1, 0.2
    flushed = FlushCounts(rows=3, bytes=60, exchange_thread_s=0.01, flusher_thread_s=0.02,
                          queue_depth=np.array([1, 0, 2]), pending_rows=3)  # fmt: skip
    waits = dict.fromkeys(WAIT_KINDS, 0.0) | {"gate": 0.1}
    m = rec.finish(7, flushed, dynamic_rows=4, wait_s=waits)
    assert (m.step, m.rows_flushed, m.bytes_flushed, m.pending_rows, m.dynamic_rows) == (7, 3, 60, 3, 4)
    assert m.phase_s["lookup"] == 0.5 and m.cache_hit_ratio == 0.75 and m.wait_s["gate"] == 0.1
    assert (m.exchange_flush_s, m.flusher_flush_s) == (0.01, 0.02)
    assert m.queue_depth.tolist() == [1, 0, 2] and m.step_time_s > 0.0
    assert rec.phase_s == dict.fromkeys(PHASES, 0.0) and rec.lookups == rec.cache_hits == 0
