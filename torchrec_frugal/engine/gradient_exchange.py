"""The gradient exchange of a step: every owner gets the summed gradient of each row it owns.

Each rank stages its coalesced gradients of step s in its mailbox's ``grads`` record, grouped by
owner (with the count per owner), each group in increasing row order, and raises its STAGED
counter. Once every rank staged, each owner merges its group of every rank's record and sums the
gradients per row over ranks, in rank order (deterministic); both are compiled passes
(:mod:`~torchrec_frugal.kernels.owner_groups`, :mod:`~torchrec_frugal.kernels.gradient_sum`). No all-to-all and no central rank: every record lives in shared
memory of the machine.
"""
from __future__ import annotations

from typing import Callable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..host.control_record import STAGED, Control
from ..host.mailbox import Record
from ..host.shm import SharedSegment
from ..int_sort import stable_argsort_np
from ..kernels.gradient_sum import SumScratch
from ..kernels.owner_groups import group_by_owner
from ..metrics import WAIT_EXCHANGE
from .streams import Marker


def sum_owned(
    boxes: Sequence[Union[SharedSegment, Mapping[str, torch.Tensor]]],
    owner: int,
    dim: int,
    scratch: Optional[SumScratch] = None,
) -> Tuple[np.ndarray, torch.Tensor]:
    """The rows of ``owner`` in every rank's staged record, unique and sorted, and their gradients
    summed over ranks (rank order, from zero: as ``index_add_`` of each rank's in turn).

    ``boxes[r]``: rank r's record (``g_counts`` per owner, ``g_rows`` and ``g_grads`` grouped by
    owner in rank order, each group's rows strictly increasing, as :meth:`GradientExchange.stage`
    writes them). The sum is a view of ``scratch`` where one is given (valid until its next use).
    """
    parts_r: List[np.ndarray] = []
    parts_g: List[np.ndarray] = []
    for box in boxes:
        counts = box["g_counts"].numpy()
        lo = int(counts[:owner].sum())
        hi = lo + int(counts[owner])
        parts_r.append(box["g_rows"][lo:hi].numpy())
        parts_g.append(box["g_grads"][lo:hi].numpy())
    rows, sums = (scratch or SumScratch(dim)).sum(parts_r, parts_g)
    return rows, torch.from_numpy(sums)


class GradientExchange:
    """Staging this rank's gradients for their owners, and summing the ones this rank owns."""

    def __init__(self, record: Record, control: Control, owner: np.ndarray, dim: int) -> None:
        self.record = record
        self.control = control
        self.owner = owner
        self.dim = dim
        self._scratch = SumScratch(dim)

    def stage(self, step: int, rows: torch.Tensor, grads: torch.Tensor, reads_done: Marker, divide_by: int = 1) -> None:
        """Stage ``grads`` [n, dim] (CPU float32) of the unique ``rows`` [n] for their owners,
        divided by ``divide_by`` where they are staged (no copy of them divided first).

        Each owner's group is staged in increasing row order (what :func:`sum_owned` merges):
        one compiled pass where ``rows`` increase already (sorted rows, as the TorchRec glue
        passes), else after a sort. Owners write this step's updates to host once every rank
        staged, so this rank's host reads of the step must be over by then: ``reads_done`` is a
        device marker reached once they are (synchronized before STAGED is raised).
        """
        r_np, g_np = rows.numpy(), grads.numpy()
        k = r_np.shape[0]
        box = self.record.own(k)
        out = (box["g_rows"][:k].numpy(), box["g_grads"][:k].numpy(), box["g_counts"].numpy())
        if not group_by_owner(r_np, g_np, self.owner, divide_by, *out):
            order = stable_argsort_np(r_np)
            group_by_owner(r_np[order], g_np[order], self.owner, divide_by, *out)
        reads_done.synchronize()
        self.control.set(STAGED, step)

    def wait_staged(self, step: int, idle: Optional[Callable[[], bool]] = None) -> float:
        """Wait until every rank staged step ``step``; returns the seconds waited."""
        return self.control.wait(WAIT_EXCHANGE, lambda: self.control.behind(STAGED, step), f"gradients of step {step}", idle)

    def sum_owned(self) -> Tuple[np.ndarray, torch.Tensor]:
        """This rank's owned rows of the staged step, and their gradients summed over ranks (as
        :func:`sum_owned`); the sum is a buffer of this exchange, valid until the next call."""
        boxes = [self.record.segment(r) for r in range(self.control.world_size)]
        return sum_owned(boxes, self.control.rank, self.dim, self._scratch)
