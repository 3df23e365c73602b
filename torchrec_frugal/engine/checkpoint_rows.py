"""The host rows as a checkpoint reads and loads them, between steps.

Host memory is shared and, once flushed, holds every row's current value: a checkpoint reads it
(a copy or live views), and a load writes it in place (each rank its own rows, never a row from
two ranks), after which every rank refreshes the rows its owner store holds from host.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch

from ..host.control_record import Control
from .gate import sync
from ..host.rows import HostRows, RowsPart
from .owner_update import OwnerUpdate


class CheckpointRows:
    """Reads and loads of one engine's host rows; ``flush`` is the engine's (collective)."""

    def __init__(
        self, host_rows: HostRows, owner_update: OwnerUpdate, control: Control, flush: Callable[[], None],
        guard: Callable[[Callable[[], object]], object],
    ) -> None:  # fmt: skip
        self._host_rows = host_rows
        self._owner_update = owner_update
        self._control = control
        self._flush = flush
        self._guard = guard

    def read(self, rows: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(weights, optimizer state) of ``rows`` (all rows if None) from host; call after flush()."""
        return self._host_rows.read(rows)

    def block(self, lo: int, hi: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views (no copy) of host rows [lo, hi): weights and optimizer state; call after flush().

        Live memory, like a parameter: the next step's updates show in it, and what is written into
        it between steps reaches the caches at :meth:`reload`.
        """
        return self._host_rows.block(lo, hi)

    def reload(self) -> None:
        """Collective, between steps, with no step since the last flush: every rank re-reads the rows
        its store holds from host once all ranks got here, so that host rows written in place
        through the views :meth:`block` handed out (a checkpoint loaded into a state_dict)
        reach the caches. Costs a read of the rank's cached rows and a barrier."""
        self._flush()  # the barrier: every rank has written its rows (nothing is pending)
        self._owner_update.reload()

    def write(self, parts: Sequence[RowsPart]) -> None:
        """Collective load of this rank's (rows, weights or None, state or None) parts: each rank
        writes its own rows (no row from two ranks) to host, then every rank refreshes the rows its
        store holds. None keeps the current values.

        Host memory is shared: once flushed, any rank may write any row in place, so a load never
        moves a row between ranks (a rank loads its block of a checkpoint, nothing more). A part
        whose values already are those host rows (a checkpoint loaded into the views that
        :meth:`block` handed out) is not copied onto itself.
        """
        checked = self._host_rows.check(parts)
        self._flush()  # nothing pending, no flusher writing: host is free to write
        self._host_rows.write(checked)
        self._guard(lambda: sync(self._control, "write_rows"))
        self._owner_update.reload()
        self._guard(lambda: sync(self._control, "write_rows refresh"))
