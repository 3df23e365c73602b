"""The gate and the barriers, built on the progress counters of the control block.

The gate of step s is a wait on the owners' counters (``control_record``): it passes when every
owner has applied the updates of step s - 1 and has no pending host write that step s reads, which
an owner's FLUSHED counter says (:func:`flushed_through`). The local ranks' barrier is a wait on
their SYNC counters.
"""
from __future__ import annotations

from typing import List, Optional

from ..host.control_record import FLUSHED, SYNC, UPDATED, Control
from ..metrics import WAIT_SYNC
from ..priorities import INF


def flushed_through(min_priority: Optional[int], last_ingested: int, inflight: Optional[int]) -> int:
    """The step through which an owner's host rows are current: what its FLUSHED counter says.

    ``min_priority``: the lowest priority pending (None when nothing is, INF when only
    deferred rows are). A finite priority p is the next step that reads the row, so host is
    current through p - 1; p comes from an ingested read, so p - 1 < ``last_ingested`` and the
    deferred rows (read at no ingested step) are covered too. With only deferred rows pending,
    host is current through the newest ingested step. ``inflight``: the bound of a chunk being
    copied (its rows are still stale on host). Nothing pending: INF, current for ever.
    """
    bound = INF
    if min_priority is not None:
        bound = last_ingested if min_priority == INF else min_priority - 1
    if inflight is not None:
        bound = min(bound, inflight)
    return bound


def lagging_owners(control: Control, step: int) -> List[int]:
    """The owners that keep the gate of ``step`` shut: not yet updated through step - 1, or with a
    pending host write that ``step`` reads (flushed through less than ``step``)."""
    updated = control.get(UPDATED)
    flushed = control.get(FLUSHED)
    return [o for o in range(control.world_size) if updated[o] < step - 1 or flushed[o] < step]


def sync(control: Control, what: str) -> None:
    """Barrier of the local ranks through their SYNC counters (each call raises this rank's by one)."""
    mine = int(control.get(SYNC)[control.rank]) + 1
    control.set(SYNC, mine)
    control.wait(WAIT_SYNC, lambda: control.behind(SYNC, mine), what)
