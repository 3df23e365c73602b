"""The host tables as checkpoints read and write them: rows by index, blocks by view, loads in place.

Host memory holds every row once, shared by the ranks: after a flush it equals the owners'
caches, so a checkpoint reads it (or saves views of it without a copy) and a load writes it in
place. The engine brackets these with the flush and barriers that make them safe.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from ..errors import FrugalInputError
from ..fused_rows import FusedRows
from .shm import SharedSegment

RowsPart = Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]
"""(rows, weights or None, optimizer state or None); None keeps the current values."""


class HostRows:
    """Reads and writes of host rows (weights and optimizer state) between steps."""

    def __init__(self, segment: SharedSegment, fused: FusedRows) -> None:
        self.segment = segment
        self.fused = fused
        self.weights, self.state = segment["weights"], segment["state"]

    def read(self, rows: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(weights, optimizer state) of ``rows`` (all rows if None): copies."""
        if rows is None:
            return self.weights.clone(), self.state.clone()
        rows = self.fused.check(rows, "read_rows")
        return self.weights[rows], self.state[rows]

    def block(self, lo: int, hi: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views (no copy) of rows [lo, hi): weights and optimizer state."""
        if not 0 <= lo <= hi <= self.fused.num_rows:
            raise FrugalInputError(f"host_block: rows [{lo}, {hi}) outside the fused tables [0, {self.fused.num_rows})")
        return self.segment.rows("weights", lo, hi), self.segment.rows("state", lo, hi)

    def check(self, parts: Sequence[RowsPart]) -> List[RowsPart]:
        """The parts of a load with their rows checked, or an error before anything is written."""
        dim, width = self.weights.shape[1], self.state.shape[1]
        checked: List[RowsPart] = []
        for rows, weights, state in parts:
            rows = self.fused.check(rows, "write_rows")
            if weights is not None and weights.shape != (rows.shape[0], dim):
                raise FrugalInputError(f"write_rows: weights of shape {tuple(weights.shape)} for {rows.shape[0]} rows of dim {dim}")
            if state is not None and state.shape != (rows.shape[0], width):
                raise FrugalInputError(f"write_rows: state of shape {tuple(state.shape)}, expected {(rows.shape[0], width)}")
            checked.append((rows, weights, state))
        return checked

    def write(self, parts: Sequence[RowsPart]) -> None:
        """Write checked parts in place; a part whose values already are those host rows (a
        checkpoint loaded into the views :meth:`block` handed out) is not copied onto itself."""
        for rows, weights, state in parts:
            for host, values in ((self.weights, weights), (self.state, state)):
                if values is not None and values.numel() and not aliases(host, rows, values):
                    host.index_copy_(0, rows, values.to("cpu", torch.float32))


def aliases(host: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether ``values`` is the very memory of host rows ``rows`` (consecutive, in order)."""
    first = int(rows[0])
    return (
        values.is_contiguous()
        and values.data_ptr() == host[first].data_ptr()
        and bool(torch.equal(rows, torch.arange(first, first + rows.shape[0])))
    )
