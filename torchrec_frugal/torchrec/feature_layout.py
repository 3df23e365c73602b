"""Where a lookup's features lie: each KJT feature's group, its ids and bags, and its output.

A frugal lookup serves its features through table groups (one engine each,
:class:`~.embedding_kernel.FrugalTableGroup`); :class:`FeatureLayout` maps the KJT's features
onto those groups and back: the ids of each group as its fused rows, each group's share of a
batch (inverse, bag lengths, pooling weights, bags sample by sample), the backward's transposed
bags from the rows' sort, and the lookup's pooled ([B, sum dims]) or sequence ([values, dim])
output assembled from the groups' rows. What depends on the features' order only, not on steps.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torchrec.modules.embedding_configs import PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..errors import FrugalInputError
from ..int_sort import SortedUnique
from .bounds_check import RowZero, row_zero
from .embedding_kernel import FrugalTableGroup, GroupBatch
from .row_pooling import TransposedBags, gather_rows, pool_rows, transpose_sorted_bags
from .types import FrugalTable


def sample_major(lengths: torch.Tensor, num_features: int, stride: int, num_values: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(order, lengths) of a group's bags sample by sample: ``values[order]`` lists bag (b, f) at
    position b * F + f, as TorchRec's pooled output [B, F d] lays them out, where a KJT lists
    them feature by feature (``lengths``: F * B, feature-major). Pooling in this order writes the
    output in place: no transpose of [F B, d] and none of its gradient."""
    lengths = lengths.to(torch.int64)
    if one_value_a_bag(lengths, num_values):  # criteo's and avazu's features: a transpose of [F, B]
        return torch.from_numpy(np.arange(num_values).reshape(num_features, stride).T.reshape(-1)), lengths
    starts = torch.zeros_like(lengths)
    torch.cumsum(lengths[:-1], 0, out=starts[1:])
    by_sample = lengths.view(num_features, stride).t().reshape(-1)
    sample_starts = torch.zeros_like(by_sample)
    torch.cumsum(by_sample[:-1], 0, out=sample_starts[1:])
    shift = starts.view(num_features, stride).t().reshape(-1) - sample_starts
    order = torch.repeat_interleave(shift, by_sample, output_size=num_values) + torch.arange(num_values, device=lengths.device)
    return order, by_sample


def one_value_a_bag(lengths: torch.Tensor, num_values: int) -> bool:
    """Whether every bag of CPU ``lengths`` holds one value (numpy: a tenth of PyTorch's time to
    compare 100k lengths); False on a device, whose lengths the host does not read."""
    return lengths.device.type == "cpu" and num_values == lengths.numel() and bool(np.all(lengths.numpy() == 1))


class FeatureLayout:
    """The features of a lookup (``tables``' features, in order) laid onto its ``groups``."""

    def __init__(self, tables: List[FrugalTable], groups: List[FrugalTableGroup], pooled: bool, device: torch.device) -> None:
        self.pooled = pooled
        self._device = device
        self._groups = groups
        self.feature_names: List[str] = [f for t in tables for f in t.feature_names]
        # Position of each KJT feature this lookup receives -> (group, table index in group).
        where = {t.name: (gi, g.table_index[t.name]) for gi, g in enumerate(groups) for t in g.tables}
        self.positions: List[List[int]] = [[] for _ in groups]
        self._position_table: List[int] = []
        for p, (table, feature) in enumerate((t, f) for t in tables for f in t.feature_names):
            gi, ti = where[table.name]
            self.positions[gi].append(p)
            self._position_table.append(ti)
        # Per group, the table index of each of its features (in its order), for one batched check,
        # and its features' span of positions when they lie side by side (one slice of the KJT).
        self._group_tables = [[self._position_table[p] for p in ps] for ps in self.positions]
        self._spans: List[Optional[Tuple[int, int]]] = [
            (ps[0], ps[-1] + 1) if ps[-1] - ps[0] + 1 == len(ps) else None for ps in self.positions
        ]
        self.features_of_table: List[Dict[int, List[str]]] = [
            {ti: [self.feature_names[p] for p in ps if self._position_table[p] == ti] for ti in range(len(g.tables))}
            for g, ps in zip(groups, self.positions)
        ]
        # Per group, whether each of its tables is read by one feature of this lookup: a row's
        # values then lie in one feature (the planner reuses the rows' sort for the backward).
        self.one_feature_per_table = [all(len(fs) <= 1 for fs in by_table.values()) for by_table in self.features_of_table]
        # The group that serves every feature, in order, if one does: its bags are the output, no copy.
        whole = [gi for gi, ps in enumerate(self.positions) if len(ps) == len(self.feature_names)]
        self._whole: Optional[int] = whole[0] if whole else None
        self._mean_positions = torch.tensor(
            [t.pooling == PoolingType.MEAN for t in tables for _ in t.feature_names], dtype=torch.bool
        )

    # ------------------------------------------------------------------ ids of a batch
    def check(self, features: KeyedJaggedTensor) -> None:
        """Raise unless ``features`` lists this lookup's features, in order, at one batch size."""
        keys = features.keys()
        if keys != self.feature_names:
            raise FrugalInputError(f"frugal lookup expects features {self.feature_names}, got {keys}")
        if features.variable_stride_per_key():
            raise FrugalInputError("frugal sharding does not support variable batch size per feature")

    def fused_ids(self, features: KeyedJaggedTensor, repairs: List[RowZero]) -> List[torch.Tensor]:
        """Per group, the ids of checked ``features`` as its fused rows, in the batch's order; ids
        read as row 0 are appended to ``repairs``."""
        values, opk = features.values(), features.offset_per_key()
        out = []
        for g, positions, tables, span in zip(self._groups, self.positions, self._group_tables, self._spans):
            if span is not None:
                ids = values[opk[span[0]] : opk[span[1]]]
            else:
                ids = torch.cat([values[opk[p] : opk[p + 1]] for p in positions])
            fused = g.fused_rows_of_tables(tables, [opk[p + 1] - opk[p] for p in positions], ids)
            if fused is None:  # a wrong id or dtype: feature by feature, read as row 0 or named
                fused = self._fused_by_feature(g, positions, features, repairs)
            out.append(fused)
        return out

    def _fused_by_feature(
        self, g: FrugalTableGroup, positions: List[int], features: KeyedJaggedTensor, repairs: List[RowZero]
    ) -> torch.Tensor:
        """Group ``g``'s fused rows of a batch whose batched check failed: feature by feature, ids
        out of range set to row 0 (appended to ``repairs``) or refused, as each table's mode says."""
        values, keys, opk = features.values(), features.keys(), features.offset_per_key()
        parts = []
        for p in positions:
            ti = self._position_table[p]
            table, ids = g.tables[ti], values[opk[p] : opk[p + 1]]
            try:
                if ids.dtype in (torch.int64, torch.int32):
                    ids, repair = row_zero(ids, table.num_embeddings, table.name, keys[p], table.bounds_check)
                    if repair is not None:
                        repairs.append(repair)
                parts.append(g.fused_rows(ti, ids))
            except FrugalInputError as e:
                raise FrugalInputError(f"feature {keys[p]!r}: {e}; nothing was changed") from None
        return torch.cat(parts)

    # ------------------------------------------------------------------ bags of a batch
    def group_batches(
        self, features: KeyedJaggedTensor, group_rows: List[Tuple[torch.Tensor, torch.Tensor]], device: Optional[torch.device] = None
    ) -> List[GroupBatch]:
        """Each group's share of ``features`` (inverse on ``device``, default the lookup's)."""
        return [b for b, _ in self.laid_out(features, group_rows, device)]

    def laid_out(
        self, features: KeyedJaggedTensor, group_rows: List[Tuple[torch.Tensor, torch.Tensor]], device: Optional[torch.device] = None
    ) -> List[Tuple[GroupBatch, Optional[torch.Tensor]]]:
        """Each group's share of ``features``, and where its bags were laid out sample by sample
        the permutation that did it (value i of the batch is the KJT's value ``order[i]``)."""
        device = self._device if device is None else device
        lengths = features.lengths()
        stride = features.stride()
        opk = features.offset_per_key()
        kjt_weights = features.weights_or_none() if self.pooled else None
        batches: List[Tuple[GroupBatch, Optional[torch.Tensor]]] = []
        for (rows, inverse), positions, span in zip(group_rows, self.positions, self._spans):
            if span is not None:
                g_lengths = lengths[span[0] * stride : span[1] * stride]
            else:
                g_lengths = torch.cat([lengths[p * stride : (p + 1) * stride] for p in positions])
            weights = None
            if self.pooled:
                if kjt_weights is not None:
                    weights = (
                        kjt_weights[opk[span[0]] : opk[span[1]]]
                        if span is not None
                        else torch.cat([kjt_weights[opk[p] : opk[p + 1]] for p in positions])
                    )
                mean = self._mean_positions[positions]
                if bool(mean.any()):
                    bag_mean = mean.repeat_interleave(stride).to(g_lengths.device)
                    scale = torch.where(bag_mean, 1.0 / g_lengths.clamp(min=1).to(torch.float32), 1.0)
                    per_value = scale.repeat_interleave(g_lengths, output_size=inverse.numel())
                    weights = per_value if weights is None else weights * per_value
            inverse = inverse.to(device)
            order = None
            if self.pooled and len(positions) > 1:  # pooled bags sample by sample: [B, F d] is a view
                order, g_lengths = sample_major(g_lengths, len(positions), stride, inverse.numel())
                order = order.to(inverse.device)
                inverse = inverse.index_select(0, order)  # index_select: faster than [order] on CPU
                weights = None if weights is None else weights.index_select(0, order.to(weights.device))
            batches.append((GroupBatch(rows, inverse, g_lengths, weights), order))
        return batches

    def transposed_by_sort(
        self, b: GroupBatch, u: SortedUnique, order: Optional[torch.Tensor], weights: Optional[torch.Tensor]
    ) -> TransposedBags:
        """The transposition of ``b``'s bags from the sort that deduplicated its rows (``u``: the
        KJT's values grouped by row), where the values laid out sample by sample (``order``)
        keep each row's values in the same order: each row is read by one feature, whose values
        both layouts list sample by sample. The same tensors as :func:`transpose_bags` makes."""
        by_row = u.order.numpy()
        if order is not None:  # the KJT's positions -> the layout's
            layout_position = np.empty_like(by_row)
            layout_position[order.numpy()] = np.arange(order.numel())
            by_row = np.take(layout_position, by_row)
        bag_of_value = None
        if self.pooled and not one_value_a_bag(b.lengths, b.inverse.numel()):
            bag_of_value = torch.from_numpy(np.repeat(np.arange(b.lengths.numel()), b.lengths.numpy()))
        return transpose_sorted_bags(torch.from_numpy(by_row), u.starts, bag_of_value, weights)

    # ------------------------------------------------------------------ output
    def output(self, features: KeyedJaggedTensor, batches: List[GroupBatch], weights: Sequence[torch.Tensor]) -> torch.Tensor:
        """The lookup's output from each group's rows (``weights``): pooled or sequence."""
        if self.pooled:
            return self._pool(features, batches, weights)
        return self._sequence(features, batches, weights)

    def _pool(self, features: KeyedJaggedTensor, batches: List[GroupBatch], weights: Sequence[torch.Tensor]) -> torch.Tensor:
        pooled: List[torch.Tensor] = []
        for b, w in zip(batches, weights):
            offsets = b.offsets
            if offsets is None:
                offsets = torch.zeros(b.lengths.numel() + 1, dtype=torch.int64, device=self._device)
                torch.cumsum(b.lengths.to(self._device), 0, out=offsets[1:])
            per_sample_weights = None if b.weights is None else b.weights.to(self._device, w.dtype)
            pooled.append(pool_rows(w, b.inverse, b.lengths, offsets, per_sample_weights, b.transposed))
        return self.pooled_output(features.stride(), pooled)

    def pooled_output(self, stride: int, pooled: Sequence[torch.Tensor]) -> torch.Tensor:
        """The pooled output [B, sum dims] from each group's bags ([B F_g, d]: sample by sample,
        ``sample_major``)."""
        if self._whole is not None:  # [B, F d]
            return pooled[self._whole].view(stride, -1)
        out: List[Optional[torch.Tensor]] = [None] * len(self.feature_names)
        for positions, bags in zip(self.positions, pooled):
            per_feature = bags.view(stride, len(positions), -1)
            for j, p in enumerate(positions):
                out[p] = per_feature[:, j]
        return torch.cat(out, dim=1)  # type: ignore[arg-type]

    def _sequence(self, features: KeyedJaggedTensor, batches: List[GroupBatch], weights: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(batches) == 1:
            return gather_rows(weights[0], batches[0].inverse, batches[0].transposed)
        lpk = features.length_per_key() if any(b.splits is None for b in batches) else []
        out: List[Optional[torch.Tensor]] = [None] * len(self.feature_names)
        for positions, b, w in zip(self.positions, batches, weights):
            splits = b.splits if b.splits is not None else [lpk[p] for p in positions]
            for p, chunk in zip(positions, gather_rows(w, b.inverse, b.transposed).split(splits)):
                out[p] = chunk
        return torch.cat(out)  # type: ignore[arg-type]
