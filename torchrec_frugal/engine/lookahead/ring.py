"""The rows each rank announces for its future steps, in a ring of slots in its shared mailbox.

A rank publishes step t by writing the rows it will read from host at t whose host copy can
wait for a write (``announced``: the rows it does not cache itself or, where owners update
uncached rows in place in host memory, only the rows other ranks cache), unique and grouped by
owner, into slot ``t % ring`` of its
mailbox's ring record (grown first if the step needs more rows), then raising its PUBLISHED
counter. An owner collects step t from every rank's
slot: its own group of each, merged into one set of rows. A slot is reused only once
every owner has ingested the step it held (the INGESTED counters), so ``ring`` = L + 2 slots
let a rank run L steps ahead of the slowest owner's ingestion.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np

from ...host.control_record import INGESTED, PUBLISHED, Control
from ...errors import FrugalError
from ...kernels.announce import AnnounceScratch
from ...host.mailbox import Record
from ...metrics import WAIT_RING


class LookaheadRing:
    """One rank's view of every rank's announcement ring (its own to write, all to read)."""

    def __init__(
        self,
        record: Record,
        ring: int,
        control: Control,
        owner: np.ndarray,
        announced: np.ndarray,
    ) -> None:
        self.record = record
        self.rank = control.rank
        self.world_size = control.world_size
        self.ring = ring
        self.control = control
        # One record per row, so that a row a publish keeps costs one cache miss, not two; both
        # fields are views of it (a test may clear ``announced`` in place).
        per_row = np.empty(owner.shape[0], dtype=np.dtype([("owner", owner.dtype), ("announced", np.bool_)]))
        per_row["owner"] = owner
        per_row["announced"] = announced
        self.owner = per_row["owner"]
        self.announced = per_row["announced"]  # per row: are this rank's host reads of it announced
        self._publishing = AnnounceScratch(owner.shape[0])  # the publisher's (one thread)
        self._collecting = AnnounceScratch(owner.shape[0])  # the ingester's (one thread)
        self._counts = np.empty(self.world_size, dtype=np.int64)  # the publisher's: rows per owner

    def publish(self, t: int, rows: np.ndarray, idle: Optional[Callable[[], bool]] = None) -> None:
        """Announce the rows this rank reads from host at step t that a pending write can hold, grouped by owner.

        Compiled passes dedupe, filter and group the rows; the slot is written through the
        record's numpy views (a torch op costs more than these copies)."""
        grouped = self._publishing.announce(rows, self.announced, self.owner, self._counts)
        slot = t % self.ring
        # The slot held step t - ring; every owner must have ingested it before we overwrite.
        self.control.wait(
            WAIT_RING, lambda: self.control.behind(INGESTED, t - self.ring), f"owners to ingest lookahead step {t - self.ring}", idle
        )
        box = self.record.own(grouped.shape[0])
        box.array("la_rows")[slot, : grouped.shape[0]] = grouped
        box.array("la_counts")[slot] = self._counts
        box.array("la_step")[slot] = t
        self.control.set(PUBLISHED, t)

    def published_through(self) -> int:
        """The newest step every rank has published."""
        return int(self.control.get(PUBLISHED).min())

    def collect(self, t: int) -> np.ndarray:
        """The unique rows of this owner that some rank reads from host at step t (in no order).

        Read through the record's numpy views: no torch op, so a training thread that ingests
        while it waits at a gate runs none."""
        slot = t % self.ring
        parts: List[np.ndarray] = []
        for r in range(self.world_size):
            box = self.record.segment(r)
            held = int(box.array("la_step")[slot])
            if held != t:
                raise FrugalError(f"rank {r}'s lookahead slot holds step {held}, not {t}")
            counts = box.array("la_counts")[slot]
            lo = int(counts[: self.rank].sum())
            parts.append(box.array("la_rows")[slot, lo : lo + int(counts[self.rank])])
        return self._collecting.unique(parts)
