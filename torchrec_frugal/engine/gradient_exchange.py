"""The gradient exchange of a step: every owner gets the summed gradient of each row it owns.

Each rank stages its coalesced gradients of step s in its mailbox's ``grads`` record, sorted by
owner (with the count per owner), and raises its STAGED counter. Once every rank staged, each
owner reads its own group from every rank's record and sums the gradients per row over ranks,
in rank order (deterministic). No all-to-all and no central rank: every record lives in shared
memory of the machine.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..host.control_record import STAGED, Control
from ..int_sort import merge_unique
from ..host.mailbox import Record
from ..metrics import WAIT_EXCHANGE
from ..host.shm import SharedSegment
from .streams import Marker


def sum_owned(
    boxes: Sequence[Union[SharedSegment, Mapping[str, torch.Tensor]]],
    owner: int,
    dim: int,
    first: Optional[Callable[[np.ndarray], np.ndarray]] = None,
) -> Tuple[np.ndarray, torch.Tensor]:
    """The rows of ``owner`` in every rank's staged record, unique and sorted, and their gradients
    summed over ranks (rank order).

    ``boxes[r]``: rank r's record (``g_counts`` per owner, ``g_rows`` and ``g_grads`` grouped by
    owner in rank order). Sorted runs (one per rank) when the callers pass sorted rows, as the
    TorchRec glue does: then the merge is cheap. ``first``: a mask of the sorted rows to put
    first (each part stays sorted), so that a caller that treats them apart takes slices of the
    sum instead of copies.
    """
    parts_r, parts_g = [], []
    for box in boxes:
        counts = box["g_counts"].numpy()
        lo = int(counts[:owner].sum())
        hi = lo + int(counts[owner])
        parts_r.append(box["g_rows"][lo:hi].numpy())
        parts_g.append(box["g_grads"][lo:hi])
    rows, inverse = merge_unique(parts_r)
    if first is not None:
        front = first(rows)
        order = np.concatenate([np.flatnonzero(front), np.flatnonzero(~front)])
        position = np.empty_like(order)
        position[order] = np.arange(order.shape[0])
        rows, inverse = rows[order], position[inverse]
    summed = torch.zeros(rows.shape[0], dim, dtype=torch.float32)
    # rank by rank into the sum, in rank order: the sums of one index_add_ over the parts
    # concatenated, without copying them into one tensor first
    at = 0
    for g in parts_g:
        summed.index_add_(0, torch.from_numpy(inverse[at : at + g.shape[0]]), g)
        at += g.shape[0]
    return rows, summed


class GradientExchange:
    """Staging this rank's gradients for their owners, and summing the ones this rank owns."""

    def __init__(self, record: Record, control: Control, owner: np.ndarray, dim: int) -> None:
        self.record = record
        self.control = control
        self.owner = owner
        self.dim = dim

    def stage(self, step: int, rows: torch.Tensor, grads: torch.Tensor, reads_done: Marker, divide_by: int = 1) -> None:
        """Stage ``grads`` [n, dim] (CPU float32) of the unique ``rows`` [n] for their owners,
        divided by ``divide_by`` where they are staged (no copy of them divided first).

        Owners write this step's updates to host once every rank staged, so this rank's host
        reads of the step must be over by then: ``reads_done`` is a device marker reached once
        they are (synchronized before STAGED is raised).
        """
        r_np = rows.numpy()
        own = self.owner[r_np]
        order = torch.from_numpy(np.argsort(own, kind="stable"))
        k = r_np.shape[0]
        box = self.record.own(k)
        torch.index_select(rows, 0, order, out=box["g_rows"][:k])
        staged = torch.index_select(grads, 0, order, out=box["g_grads"][:k])
        if divide_by != 1:
            staged.div_(divide_by)
        box["g_counts"].copy_(torch.from_numpy(np.bincount(own, minlength=self.control.world_size)))
        reads_done.synchronize()
        self.control.set(STAGED, step)

    def wait_staged(self, step: int, idle: Optional[Callable[[], bool]] = None) -> float:
        """Wait until every rank staged step ``step``; returns the seconds waited."""
        return self.control.wait(WAIT_EXCHANGE, lambda: self.control.behind(STAGED, step), f"gradients of step {step}", idle)

    def sum_owned(self, first: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> Tuple[np.ndarray, torch.Tensor]:
        """This rank's owned rows of the staged step, and their gradients summed over ranks
        (``first``: as :func:`sum_owned`)."""
        boxes = [self.record.segment(r) for r in range(self.control.world_size)]
        return sum_owned(boxes, self.control.rank, self.dim, first)
