"""Cross-rank agreement on each batch read ahead: does every rank's batch plan, or is the step dropped?

A synchronous step needs every rank. When one rank's batch is refused (an id out of range under
bounds_check_mode FATAL, a missing feature), the others must learn it before any of them starts that step's collectives, or
the refused rank leaves its peers inside an all-to-all. So each rank's planner, having planned
batch i of its stream, tells the others whether it could, and every rank drops batch i if any
rank could not: the streams stay aligned, and the run goes on as if the batch had never been read.

Where every rank runs on one machine the verdicts travel through named pipes
(:class:`~torchrec_frugal.host.node_agreement.NodeBatchAgreement`); across machines over a gloo
group of their own (:class:`BatchAgreement`): the planner's thread sends them while the training
thread runs the model's collectives, and a group may not interleave two threads' calls. They are control traffic,
4 bytes per rank and batch: :func:`is_agreement_group` tells a counter of the embedding
collectives' bytes to leave them out.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from ...errors import FrugalError, FrugalInputError
from ...host.node_agreement import NodeBatchAgreement, one_machine

Agree = Callable[[int, bool], List[int]]
"""Given a batch's index and whether this rank refused it, the ranks that refused it (a collective)."""


_GROUPS: List[dist.ProcessGroup] = []  # every agreement's group (a process group cannot be weakly referenced)


def is_agreement_group(group: object) -> bool:
    """Whether ``group`` carries the per-batch agreement (no embedding data)."""
    return any(group is g for g in _GROUPS)


def batch_agreement(pg: dist.ProcessGroup, timeout_s: float, shm_dir: Optional[str] = None) -> Agree:
    """The agreement of ``pg``'s ranks (collective): through named pipes where they all run on
    this machine, else over gloo."""
    if one_machine(pg):
        return NodeBatchAgreement(pg, timeout_s, shm_dir).refused_by
    return BatchAgreement(pg, timeout_s).refused_by


class BatchAgreement:
    """The ranks of ``pg`` agree, batch after batch in read order, on which ranks could not plan it.

    Created by every rank of ``pg`` together (it makes a process group); each call is a
    collective, made by every rank for the same batch, in the same order.
    """

    def __init__(self, pg: dist.ProcessGroup, timeout_s: float) -> None:
        self.world_size = dist.get_world_size(pg)
        self.timeout_s = timeout_s
        self._group = dist.new_group(
            ranks=dist.get_process_group_ranks(pg), backend="gloo", timeout=timedelta(seconds=timeout_s)
        )
        _GROUPS.append(self._group)

    def refused_by(self, index: int, refused: bool) -> List[int]:
        """The ranks (of ``pg``) that could not plan batch ``index``; ``refused``: this rank could not."""
        out = [torch.zeros(1, dtype=torch.int32) for _ in range(self.world_size)]
        try:
            dist.all_gather(out, torch.tensor([int(refused)], dtype=torch.int32), group=self._group)
        except RuntimeError as e:  # a peer that died or stopped reading batches
            raise FrugalError(
                f"FrugalTrainPipeline: the ranks could not agree on batch {index} (a rank failed or stopped, "
                f"or read fewer batches than the others; the wait times out after {self.timeout_s:g} s)"
            ) from e
        return [r for r in range(self.world_size) if int(out[r])]


def agreed_refusal(index: int, error: Optional[BaseException], agree: Optional[Agree]) -> Optional[BaseException]:
    """What batch ``index`` fails with on this rank once the ranks agreed on it (``agree``: None
    with one rank): this rank's own error (a refusal named as the batch dropped), another rank's
    refusal, or None if every rank can train it."""
    if isinstance(error, FrugalInputError):
        error = _dropped(index, str(error), error)
    if agree is not None:
        try:
            refused = agree(index, error is not None)
            if error is None and refused:
                error = _dropped(index, f"rank(s) {refused} refused theirs (their error names the feature and the id)")
        except BaseException as e:
            error = error or e
    return error


def _dropped(index: int, why: str, cause: Optional[BaseException] = None) -> FrugalInputError:
    """The error of a batch refused on some rank, naming it and what becomes of it."""
    error = FrugalInputError(f"batch {index} read by FrugalTrainPipeline is dropped on every rank: {why}")
    error.__cause__ = cause
    return error
