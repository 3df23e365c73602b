"""Each rank's shared mailbox: what it hands the other ranks of its machine, sized by a step.

A rank's mailbox holds two records, each in a segment of its own: ``ring`` (the rows it announces
for its next L + 2 steps, see lookahead_ring) and ``grads`` (its gradients of one step, grouped
by owner). Both are sized by the rows of a step, not by the tables: a record starts at
``initial_rows`` and its writer grows it (doubling, at most to the tables' rows) when a step
needs more, copying what readers may still read, then raises its generation counter in the
control block. A reader maps a peer's record anew when that counter moved; since it reads the
counter after the progress counter that let it read (the writer raises them in the other
order), the record it maps holds what it came for.
"""
from __future__ import annotations

import threading
from typing import Callable, List, Optional

import torch

from ..errors import FrugalError
from .control_record import Control
from .shm import Field, Layout, SharedMemoryFullError, SharedSegment


def ring_layout(ring: int, world_size: int, rows: int) -> Layout:
    """Slot ``t % ring`` holds step t, its rows grouped by owner, and each owner's count."""
    return Layout(
        [
            Field("la_step", torch.int64, (ring,)),
            Field("la_counts", torch.int64, (ring, world_size)),
            Field("la_rows", torch.int64, (ring, rows)),
        ]
    )


def grads_layout(world_size: int, rows: int, dim: int) -> Layout:
    """One step's rows and summed gradients, grouped by owner, and each owner's count."""
    return Layout(
        [
            Field("g_counts", torch.int64, (world_size,)),
            Field("g_rows", torch.int64, (rows,)),
            Field("g_grads", torch.float32, (rows, dim)),
        ]
    )


def keep_ring(old: SharedSegment, new: SharedSegment) -> None:
    """Carry the announced steps over: owners may not have ingested them yet."""
    new["la_step"].copy_(old["la_step"])
    new["la_counts"].copy_(old["la_counts"])
    new["la_rows"][:, : old["la_rows"].shape[1]].copy_(old["la_rows"])


class Record:
    """One kind of record of every local rank: this rank's to write (and grow), the others' to read.

    ``layout_of(rows)`` lays out a record of ``rows`` rows; ``keep(old, new)`` copies what must
    survive a growth (None: nothing, the next write replaces it all). The control block's field
    ``rows_field`` holds each rank's record size, which only grows: it names the record too.
    ``own`` is called by one thread at a time (the record's writer), ``segment`` by any.
    """

    def __init__(
        self,
        kind: str,
        layout_of: Callable[[int], Layout],
        keep: Optional[Callable[[SharedSegment, SharedSegment], None]],
        rows_field: int,
        directory: str,
        initial_rows: int,
        max_rows: int,
        rank: int,
        world_size: int,
    ) -> None:
        self.kind = kind
        self._layout_of = layout_of
        self._keep = keep
        self._control: Optional[Control] = None
        self._field = rows_field
        self._prefix = ""  # the run's, given at create_own
        self._dir = directory
        self.rank = rank
        self.max_rows = max_rows
        self.rows = min(initial_rows, max_rows)
        self._rows = [self.rows] * world_size  # of the record mapped, per rank
        self._segs: List[Optional[SharedSegment]] = [None] * world_size
        self._attach_lock = threading.Lock()

    def segment_name(self, rank: int, rows: int) -> str:
        """The name of rank ``rank``'s record of ``rows`` rows (the size names the record)."""
        return f"{self._prefix}{self.kind}{rank}n{rows}"

    def nbytes(self) -> int:
        """Bytes of this rank's record now (at first: of ``initial_rows`` rows)."""
        return self._layout_of(self.rows).nbytes

    # ------------------------------------------------------------------ set-up (collective steps)
    def create_own(self, control: Control, name_prefix: str) -> SharedSegment:
        """Create this rank's first record, its name starting ``name_prefix`` (the engine then
        barriers and attaches the others')."""
        self._prefix = name_prefix
        seg = SharedSegment.create(self.segment_name(self.rank, self.rows), self._layout_of(self.rows), self._dir)
        self._segs[self.rank] = seg
        self._control = control
        control.set(self._field, self.rows)
        return seg

    def attach_peers(self) -> None:
        """Map the first record of every other rank (all ranks start at the same size)."""
        for r, seg in enumerate(self._segs):
            if seg is None:
                self._segs[r] = SharedSegment.attach(self.segment_name(r, self.rows), self._layout_of(self.rows), self._dir)

    def unlink_own(self) -> None:
        """Drop this rank's record name once every rank has mapped it (the mapping stays)."""
        seg = self._segs[self.rank]
        if seg is not None:
            seg.unlink()

    # ------------------------------------------------------------------ use
    def own(self, rows: int) -> SharedSegment:
        """This rank's record, grown first if a step of ``rows`` rows does not fit."""
        if rows > self.rows:
            self._grow(rows)
        seg = self._segs[self.rank]
        assert seg is not None
        return seg

    def _grow(self, rows: int) -> None:
        if rows > self.max_rows:
            raise FrugalError(f"rank {self.rank}: a step of {rows} {self.kind} rows exceeds the tables' {self.max_rows} rows")
        new_rows = min(self.max_rows, max(rows, 2 * self.rows))
        try:
            seg = SharedSegment.create(self.segment_name(self.rank, new_rows), self._layout_of(new_rows), self._dir)
        except SharedMemoryFullError as e:
            raise SharedMemoryFullError(
                f"rank {self.rank}: growing its {self.kind} mailbox to {new_rows} rows for a step of {rows} rows: {e}"
            ) from e
        old = self._segs[self.rank]
        assert old is not None
        if self._keep is not None:
            self._keep(old, seg)
        self._segs[self.rank] = seg
        self._rows[self.rank] = self.rows = new_rows
        assert self._control is not None
        self._control.set(self._field, new_rows)  # a reader that sees it finds the new record complete
        old.unlink()  # the first record's name went at set-up; a grown one's goes now

    def segment(self, rank: int) -> SharedSegment:
        """Rank ``rank``'s record as of its size counter now."""
        if rank != self.rank:
            assert self._control is not None
            with self._attach_lock:
                while True:
                    rows = int(self._control.block[rank, self._field])
                    if rows == self._rows[rank]:
                        break
                    try:
                        self._segs[rank] = SharedSegment.attach(self.segment_name(rank, rows), self._layout_of(rows), self._dir)
                        self._rows[rank] = rows
                    except FileNotFoundError:
                        if int(self._control.block[rank, self._field]) == rows:
                            raise FrugalError(f"rank {rank}'s {self.kind} mailbox of {rows} rows is gone") from None
                        # it grew again meanwhile and dropped that name: map the newer record
        seg = self._segs[rank]
        assert seg is not None
        return seg
