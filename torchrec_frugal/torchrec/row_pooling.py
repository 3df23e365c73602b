"""A lookup's rows pooled into bags (or gathered per value), with the backward as a transposed pooling.

The gradient of a unique row is the sum, over the batch's values that read it, of the gradient of
the bag each value is pooled into (times its pooling weight): the same sum-pooling, transposed:
each row's values are its "bag", the bags' gradients its "table". PyTorch's own backward of
``embedding_bag`` (and of indexing, for sequence embeddings) sorts the values and scatters them one
by one on CPU, slower than stock TorchRec's fused TBE backward with its optimizer (docs/performance.md,
"The pooling's backward as a transposed pooling"). The transposition depends only on the batch, so
a batch planned ahead carries it (:func:`transpose_bags`, on the planner thread) and its backward
is one pooling call; a batch not planned transposes in its backward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from ..int_sort import stable_argsort

SUM = 0  # embedding_bag's mode "sum", as the ATen op takes it


@dataclass
class TransposedBags:
    """A batch's bags seen from its unique rows: row r's values are ``indices[offsets[r]:offsets[r+1]]``
    (the bag, or output row, each is pooled into), in the batch's order, with their ``weights``."""

    indices: torch.Tensor
    offsets: torch.Tensor
    weights: Optional[torch.Tensor]


def transpose_bags(
    inverse: torch.Tensor, lengths: Optional[torch.Tensor], num_rows: int, weights: Optional[torch.Tensor]
) -> TransposedBags:
    """The transposition of bags ``lengths`` over values ``inverse`` (indices into ``num_rows``
    rows); ``lengths`` None: each value is its own output row (sequence embeddings). Reads no
    device tensor on the host, so it runs on CUDA without a sync."""
    by_row = stable_argsort(inverse)  # a row's values in the batch's order: one summation order
    counts = torch.zeros(num_rows, dtype=torch.int64, device=inverse.device)
    counts.scatter_add_(0, inverse, torch.ones_like(inverse))
    row_offsets = torch.zeros(num_rows + 1, dtype=torch.int64, device=inverse.device)
    torch.cumsum(counts, 0, out=row_offsets[1:])
    bag_of_value = None
    if lengths is not None:
        all_bags = torch.arange(lengths.numel(), device=inverse.device)
        bag_of_value = all_bags.repeat_interleave(lengths.to(inverse.device), output_size=inverse.numel())
    return transpose_sorted_bags(by_row, row_offsets, bag_of_value, weights)


def transpose_sorted_bags(
    by_row: torch.Tensor, row_offsets: torch.Tensor, bag_of_value: Optional[torch.Tensor], weights: Optional[torch.Tensor]
) -> TransposedBags:
    """The transposition of bags whose values are already grouped by row: ``by_row`` lists the
    values' positions row by row, each row's in the batch's order (a stable sort by row), row r's
    at ``by_row[row_offsets[r]:row_offsets[r + 1]]``; ``bag_of_value`` None: each value is its own
    bag (sequence embeddings, or bags of one id each)."""
    indices = by_row if bag_of_value is None else bag_of_value.index_select(0, by_row)
    return TransposedBags(indices, row_offsets, None if weights is None else weights.detach().index_select(0, by_row))


def sum_bags(rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor, weights: Optional[torch.Tensor]) -> torch.Tensor:
    """Bags of ``rows`` summed, as the forward of every pooling here computes them (``offsets``:
    the bags' cumulative lengths from 0, on the device)."""
    return F.embedding_bag(inverse, rows, offsets, mode="sum", per_sample_weights=weights, include_last_offset=True)


def row_gradients(grad: torch.Tensor, t: TransposedBags) -> torch.Tensor:
    """Each row's gradient: its values' bag gradients summed (the ATen op: the indices are ours,
    built valid, so none of ``F.embedding_bag``'s checks in Python)."""
    weights = None if t.weights is None else t.weights.to(grad.dtype)
    pooled = torch.embedding_bag(grad, t.indices, t.offsets, mode=SUM, per_sample_weights=weights, include_last_offset=True)
    return pooled[0]


class PooledRowsFunction(torch.autograd.Function):
    """``embedding_bag(inverse, rows, offsets, mode="sum", per_sample_weights=weights)``, with the
    rows' gradient pooled through ``transposed`` (computed now if not given)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        rows: torch.Tensor,
        weights: Optional[torch.Tensor],
        inverse: torch.Tensor,
        lengths: torch.Tensor,
        offsets: torch.Tensor,
        transposed: Optional[TransposedBags],
    ) -> torch.Tensor:
        ctx.save_for_backward(rows, weights)
        ctx.bags = (inverse, lengths, offsets, transposed)
        return sum_bags(rows, inverse, offsets, weights)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:  # type: ignore[override]
        rows, weights = ctx.saved_tensors
        inverse, lengths, offsets, transposed = ctx.bags
        grad = grad.contiguous()
        grad_rows = grad_weights = None
        if ctx.needs_input_grad[0]:
            t = transposed if transposed is not None else transpose_bags(inverse, lengths, rows.shape[0], weights)
            grad_rows = row_gradients(grad, t)
        if ctx.needs_input_grad[1]:  # learned weights (position-weighted features): <bag grad, row>
            bag_of_value = torch.arange(lengths.numel(), device=grad.device).repeat_interleave(
                lengths.to(grad.device), output_size=inverse.numel()
            )
            grad_weights = (grad.index_select(0, bag_of_value) * rows.detach().index_select(0, inverse)).sum(1)
        return grad_rows, grad_weights, None, None, None, None


class GatheredRowsFunction(torch.autograd.Function):
    """``rows[inverse]`` (one embedding per value), with the rows' gradient pooled through
    ``transposed`` (computed now if not given)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, rows: torch.Tensor, inverse: torch.Tensor, transposed: Optional[TransposedBags]
    ) -> torch.Tensor:
        ctx.bags = (rows.shape[0], inverse, transposed)
        return rows.index_select(0, inverse)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:  # type: ignore[override]
        num_rows, inverse, transposed = ctx.bags
        t = transposed if transposed is not None else transpose_bags(inverse, None, num_rows, None)
        return row_gradients(grad.contiguous(), t), None, None


def pool_rows(
    rows: torch.Tensor,
    inverse: torch.Tensor,
    lengths: torch.Tensor,
    offsets: torch.Tensor,
    weights: Optional[torch.Tensor],
    transposed: Optional[TransposedBags] = None,
) -> torch.Tensor:
    """Bags of ``rows`` summed (``offsets``: ``lengths``' cumulative sum from 0, on the device)."""
    if not (rows.requires_grad or (weights is not None and weights.requires_grad)):
        return sum_bags(rows, inverse, offsets, weights)
    return PooledRowsFunction.apply(rows, weights, inverse, lengths, offsets, transposed)


def gather_rows(rows: torch.Tensor, inverse: torch.Tensor, transposed: Optional[TransposedBags] = None) -> torch.Tensor:
    """``rows[inverse]``, its backward a transposed pooling (the copy by ``index_select``: several
    times faster than indexing on CPU, docs/performance.md)."""
    if not rows.requires_grad:
        return rows.index_select(0, inverse)
    return GatheredRowsFunction.apply(rows, inverse, transposed)
