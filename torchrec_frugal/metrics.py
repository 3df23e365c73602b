"""Per-step measurements of the Frugal mechanism, and the names they are kept under.

Every layer records into these (the control block's waits, the flushers' counts, the engine's
phases), so this module imports none of them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, Protocol

import numpy as np

PHASES = ("announce", "lookup", "exchange", "update", "bookkeeping", "flush")
"""Where a rank's training thread spends its engine time in one step (see StepMetrics.phase_s)."""

# Kinds of wait (Control.wait's ``kind``; the keys of StepMetrics.wait_s).
WAIT_GATE = "gate"  # the gate of a step: owners applied the previous step and flushed what it reads
WAIT_EXCHANGE = "exchange"  # every rank staged its gradients of the step
WAIT_PUBLISHED = "published"  # every rank published the lookahead of the step being updated
WAIT_RING = "ring"  # the owners ingested the step a ring slot held, before it is reused
WAIT_SYNC = "sync"  # a barrier of flush() and of checkpoint loads
WAIT_KINDS = (WAIT_GATE, WAIT_EXCHANGE, WAIT_PUBLISHED, WAIT_RING, WAIT_SYNC)


class FlushedSince(Protocol):
    """What a step's metrics read of an owner's flushes since the previous step (flusher.FlushCounts)."""

    rows: int
    bytes: int
    exchange_thread_s: float
    flusher_thread_s: float
    queue_depth: np.ndarray
    pending_rows: int


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
    wait_s: seconds waited on other ranks since the previous step's metrics, by kind
        (WAIT_KINDS): gate, exchange (gradients staged), published (the lookahead of the
        step being updated), ring (a lookahead slot freed; on the lookahead worker's thread when
        there is one), sync (barriers of flush() and checkpoint loads).
    exchange_flush_s / flusher_flush_s: seconds spent copying chunks to host since the
        previous step's metrics, by the exchange worker (the rows the next step reads, what a
        wait of it or of the gate had time for, flush()) and by the background flusher threads.
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
    wait_s: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(WAIT_KINDS, 0.0))
    exchange_flush_s: float = 0.0
    flusher_flush_s: float = 0.0

    @property
    def cache_hit_ratio(self) -> float:
        return self.cache_hits / self.lookups if self.lookups else 0.0

    @property
    def gate_stall_fraction(self) -> float:
        return self.gate_wait_s / self.step_time_s if self.step_time_s > 0 else 0.0


class StepRecorder:
    """What the training thread measures during a step, turned into its StepMetrics at the end."""

    def __init__(self) -> None:
        self.phase_s: Dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.lookups = 0
        self.cache_hits = 0
        self.step_t0 = 0.0  # when the step's gate wait began
        self.gate_wait_s = 0.0
        self.exchange_wait_s = 0.0

    def add(self, phase: str, seconds: float) -> None:
        self.phase_s[phase] += seconds

    def finish(self, step: int, flushed: FlushedSince, dynamic_rows: int, wait_s: Dict[str, float]) -> StepMetrics:
        """The step's metrics; phases and lookups start again from zero."""
        m = StepMetrics(
            step=step,
            gate_wait_s=self.gate_wait_s,
            exchange_wait_s=self.exchange_wait_s,
            step_time_s=time.perf_counter() - self.step_t0,
            queue_depth=flushed.queue_depth,
            pending_rows=flushed.pending_rows,
            rows_flushed=flushed.rows,
            bytes_flushed=flushed.bytes,
            lookups=self.lookups,
            cache_hits=self.cache_hits,
            dynamic_rows=dynamic_rows,
            phase_s=self.phase_s,
            wait_s=wait_s,
            exchange_flush_s=flushed.exchange_thread_s,
            flusher_flush_s=flushed.flusher_thread_s,
        )
        self.phase_s = dict.fromkeys(PHASES, 0.0)
        self.lookups = self.cache_hits = 0
        return m
