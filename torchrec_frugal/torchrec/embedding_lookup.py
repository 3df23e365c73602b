"""The lookup of a frugal sharding: a batch's rows read through the engines, pooled locally.

The counterpart of TorchRec's ``embedding_lookup.py``: it groups the sharding's tables by engine
(:class:`~.embedding_kernel.FrugalTableGroup`), maps the KJT onto each group's unique rows, and
returns pooled ([B, sum dims]) or sequence ([values, dim]) embeddings; where each feature lies in
the groups, its bags and the output assembled from them are :mod:`.feature_layout`'s. Announced
batches (the lookahead) keep their rows for their own forward.

A batch can also be planned ahead (:meth:`FrugalEmbeddingLookup.plan`, on a planner thread): its
unique rows, the engines' step plans, the inverse, bag offsets and pooling weights, and the bags
transposed for the backward (``row_pooling``), moved to the device before the step. The train
pipeline then hands the plan to the batch's forward (:meth:`FrugalEmbeddingLookup.use_plan`), which
trusts it without reading the batch's tensors.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_sharding import BaseEmbeddingLookup
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..config import FrugalConfig
from ..errors import FrugalError, FrugalInputError
from ..int_sort import sorted_unique, unique_inverse
from ..engine.streams import REACHED, CopyStream, Marker
from .bounds_check import OutOfRangeLog, RowZero
from .embedding_kernel import FrugalPooledFunction, FrugalRowsFunction, FrugalStep, FrugalTableGroup, GroupBatch
from .feature_layout import FeatureLayout, sample_major
from .row_pooling import TransposedBags, transpose_bags
from .types import FrugalTable

__all__ = ["AnnounceDist", "BatchPlan", "FrugalEmbeddingLookup", "sample_major"]


@dataclass
class _AnnouncedBatch:
    """A future batch as announced: its ids (CPU) and the (rows, inverse) of each group."""

    values: torch.Tensor
    lengths: torch.Tensor
    group_rows: List[Tuple[torch.Tensor, torch.Tensor]]


@dataclass
class BatchPlan:
    """One lookup's share of a batch, planned before its step: per group, the engine's step plan
    and the pooling indices, on the device once ``ready`` is reached (indices, never values)."""

    batches: List[GroupBatch]
    ready: Marker
    num_values: int  # ids of the batch in this lookup's features: a forward's cheap consistency check
    stride: int


class AnnounceDist(Protocol):
    """Where a future batch's ids go before they reach the lookup (frugal_row_wise: the owning
    nodes, a collective), kept for its step once every module took the batch."""

    def send(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor: ...

    def commit(self, sent: bool) -> None: ...


class FrugalEmbeddingLookup(BaseEmbeddingLookup[KeyedJaggedTensor, torch.Tensor]):
    """Lookup of a frugal sharding: pooled ([B, sum dims]) or sequence ([values, dim]) output."""

    def __init__(
        self,
        tables: List[FrugalTable],
        pooled: bool,
        config: FrugalConfig,
        pg: Optional[dist.ProcessGroup],
        device: torch.device,
        checkpoint_pg: Optional[dist.ProcessGroup] = None,
        announce_dist: Optional[AnnounceDist] = None,
    ) -> None:
        super().__init__()
        # What a future batch's ids go through before they reach this lookup (frugal_row_wise:
        # the input dist to the owning nodes, a collective); None: they reach it as they are.
        self._announce_dist = announce_dist
        self._device = device
        keyed: Dict[Tuple[Any, ...], List[FrugalTable]] = {}
        for t in tables:
            o = t.optimizer
            key = (t.embedding_dim, o.kind, o.lr, o.eps, t.cache_ratio)
            keyed.setdefault(key, []).append(t)
        self.groups = nn.ModuleList(FrugalTableGroup(ts, config, pg, device, checkpoint_pg) for ts in keyed.values())
        # The same groups as a plain list: a step's calls go through them without nn.Module's lookup.
        self._group_list: List[FrugalTableGroup] = list(self.groups)
        # Where each KJT feature lies in the groups, its bags, and the output assembled from them.
        self._layout = FeatureLayout(tables, self._group_list, pooled, device)
        # Leaf that makes the lookup's output require grad, so backward reaches the engines.
        self._anchor = torch.zeros(0, requires_grad=True)
        # Per announced future batch (aligned with each group's announced rows): its ids and the
        # (rows, inverse) computed when it was announced, reused by its forward if the ids match.
        self._announced_batches: Deque[Optional[_AnnouncedBatch]] = deque()
        self._last_lookahead: Optional[_AnnouncedBatch] = None
        self._copies = CopyStream(device)  # plans' index tensors, moved ahead of their step
        # The plan of the next forward's batch (use_plan), in a list: set twice a step, without
        # nn.Module's __setattr__.
        self._next_plan: List[Optional[BatchPlan]] = [None]
        self.out_of_range = OutOfRangeLog()  # ids read as row 0 (bounds_check_mode WARNING, IGNORE)

    @property
    def feature_names(self) -> List[str]:
        return self._layout.feature_names

    # ------------------------------------------------------------------ rows of a batch
    def group_rows(self, features: KeyedJaggedTensor) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per group, the batch's unique fused rows (ids validated) and each value's index into them.

        The costly part of a batch's lookup (validation and unique), computed once per batch: when
        the batch was announced, or else by its forward.
        """
        return [unique_inverse(fused) for fused in self.fused_ids(features)]

    def fused_ids(self, features: KeyedJaggedTensor, log: bool = True) -> List[torch.Tensor]:
        """Per group, the batch's ids as the group's fused rows, in the batch's order. An id out of
        range is read as row 0 of its table or refuses the batch, by the table's bounds_check_mode
        (:mod:`.bounds_check`); raises, naming the feature, on a refused id or a wrong dtype.
        ``log``: report the ids read as row 0 (False: a check whose batch is looked up again later)."""
        self._layout.check(features)
        repairs: List[RowZero] = []
        out = self._layout.fused_ids(features, repairs)
        if repairs and log:  # the whole batch accepted: report what was read as row 0
            self.out_of_range.report(repairs)
        return out

    def _rows_for_forward(self, features: KeyedJaggedTensor) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """The rows of the batch announced for this step if ``features`` are that batch's ids (no
        second validation and unique), else computed afresh (and then checked against it)."""
        ahead = self._announced_batches[0] if self._announced_batches else None
        if (
            ahead is not None
            and torch.equal(ahead.lengths, features.lengths().cpu())
            and torch.equal(ahead.values, features.values().cpu())
        ):
            self._layout.check(features)
            return ahead.group_rows
        return self.group_rows(features)

    def lookahead_rows(self, features: KeyedJaggedTensor) -> List[torch.Tensor]:
        """Each group's rows for ``features`` (validated), as the forward of that batch steps on.

        ``features`` is the batch as the sharded module receives it; with an announce dist
        (frugal_row_wise) it first goes where the step's input dist will send it: a collective,
        which every rank runs for the same batches in the same order (the train pipeline does)."""
        if self._announce_dist is not None:
            features = self._announce_dist.send(features)
        group_rows = self.group_rows(features)
        # Copies: a loader may refill its buffers before the announced step runs.
        self._last_lookahead = _AnnouncedBatch(
            features.values().to("cpu", copy=True), features.lengths().to("cpu", copy=True), group_rows
        )
        return [rows for rows, _ in group_rows]

    def announce(self, rows: List[torch.Tensor]) -> None:
        for g, r in zip(self.groups, rows):
            g.announce(r)
        last, self._last_lookahead = self._last_lookahead, None
        same = last is not None and all(a is b for (a, _), b in zip(last.group_rows, rows))
        self._announced_batches.append(last if same else None)
        if self._announce_dist is not None:
            self._announce_dist.commit(same)

    # ------------------------------------------------------------------ planning ahead
    @property
    def plans_anywhere(self) -> bool:
        """Whether :meth:`plan` may run on any thread: not with an announce dist (a collective,
        which must run in the same order as the step's own collectives)."""
        return self._announce_dist is None

    def plan(self, features: KeyedJaggedTensor) -> BatchPlan:
        """Plan a future batch's forward from its CPU ``features`` (a copy nobody changes): rows
        checked and deduplicated, the engines' step plans, and the inverse, bag offsets, pooling
        weights and the bags' transposition (the backward's pooling) moved to the device. Any
        thread (:attr:`plans_anywhere`); raises, changing nothing, on a bad id."""
        if not self.plans_anywhere:
            raise FrugalError("a lookup with an announce dist plans its batches through lookahead_rows")
        sorts = [sorted_unique(fused) for fused in self.fused_ids(features)]
        laid_out = self._layout.laid_out(features, [(u.values, u.inverse) for u in sorts], torch.device("cpu"))
        batches = [b for b, _ in laid_out]
        pin = self._device.type == "cuda"
        opk = features.offset_per_key()
        moves: List[Optional[torch.Tensor]] = []
        for (b, order), u, positions, one_each in zip(laid_out, sorts, self._layout.positions, self._layout.one_feature_per_table):
            b.splits = [opk[p + 1] - opk[p] for p in positions]
            offsets = torch.zeros(b.lengths.numel() + 1, dtype=torch.int64)
            torch.cumsum(b.lengths, 0, out=offsets[1:])
            b.offsets = offsets
            weights = None if b.weights is None else b.weights.to(torch.float32)
            if order is None or one_each:
                t = self._layout.transposed_by_sort(b, u, order, weights)
            else:  # a row read by two features: its values' order differs once laid out by sample
                t = transpose_bags(b.inverse, b.lengths if self._layout.pooled else None, b.rows.numel(), weights)
            parts = [b.inverse, b.lengths, b.offsets, weights, t.indices, t.offsets, t.weights]
            moves.extend(p.pin_memory() if pin and p is not None else p for p in parts)
        for g, b in zip(self.groups, batches):
            b.plan = g.engine.plan_step(b.rows)
            b.rows = b.plan.rows  # the very tensor announced: its step needs no comparison
        moved, ready = self._copies.to_device(moves)
        for i, b in enumerate(batches):
            inverse, lengths, offsets, weights, t_indices, t_offsets, t_weights = moved[7 * i : 7 * i + 7]
            assert inverse is not None and lengths is not None and t_indices is not None and t_offsets is not None
            b.inverse, b.lengths, b.offsets, b.weights = inverse, lengths, offsets, weights
            b.transposed = TransposedBags(t_indices, t_offsets, t_weights)
        return BatchPlan(batches, ready, int(features.values().numel()), features.stride())

    def announce_plan(self, plan: BatchPlan) -> None:
        """Push a planned batch's rows to the engines' lookahead windows (its step plans: checked
        and owned, neither checked nor copied again)."""
        for g, b in zip(self._group_list, plan.batches):
            g.announce(b.plan)
        self._announced_batches.append(None)  # its forward gets the plan itself, from use_plan

    def use_plan(self, plan: Optional[BatchPlan]) -> None:
        """The next forward is of the batch ``plan`` was made of (the pipeline knows); None: forget it."""
        self._next_plan[0] = plan

    def _planned_batches(self, features: KeyedJaggedTensor, plan: BatchPlan) -> List[GroupBatch]:
        """``plan``'s batches, for ``features`` that the pipeline says are that batch."""
        self._layout.check(features)
        if features.values().numel() != plan.num_values or features.stride() != plan.stride:
            raise FrugalError(
                f"the batch trained ({features.values().numel()} ids, batch size {features.stride()}) is not the "
                f"one planned for this step ({plan.num_values} ids, batch size {plan.stride})"
            )
        if plan.ready is not REACHED:
            parts = (t for b in plan.batches for t in (b.inverse, b.lengths, b.offsets, b.weights, *b.transposed_parts))
            self._copies.use(list(parts), plan.ready)
        return plan.batches

    def lookahead_capacity(self) -> int:
        """How many more future steps the engines accept now."""
        return min(g.lookahead_capacity() for g in self._group_list)

    def lookahead(self) -> int:
        return min(g.engine.lookahead for g in self.groups)

    # ------------------------------------------------------------------ forward
    def forward(self, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        plan = self._next_plan[0]
        if plan is not None:  # the batch of the step announced next: the pipeline planned it
            self._next_plan[0] = None
            batches = self._planned_batches(sparse_features, plan)
            if self._layout.pooled and torch.is_grad_enabled():  # the rows and their pooling: one autograd node
                self._begin(batches)
                pooled = FrugalPooledFunction.apply(self._anchor, FrugalStep(self._group_list, batches))
                return self._layout.pooled_output(plan.stride, pooled)
            weights = self._step(batches)
        else:
            batches = self._layout.group_batches(sparse_features, self._rows_for_forward(sparse_features))
            pairs = list(zip(self._group_list, batches))
            if any(g.engine.in_step for g in self._group_list) and not all(g.announced_next(b.rows) for g, b in pairs):
                weights = self._read_within_step(batches)
            elif torch.is_grad_enabled():
                weights = self._step(batches)
            elif all(g.fits_announced(b.rows) for g, b in pairs):  # compared once: the step need not again
                weights = self._step(batches, checked=True)
            else:
                weights = self._read_between_steps(batches)
        return self._layout.output(sparse_features, batches, weights)

    def _step(self, batches: List[GroupBatch], checked: bool = False) -> Sequence[torch.Tensor]:
        """The rows of the engines' next step, begun with ``batches`` (ended by the backward, or now
        without gradients); ``checked``: the rows are known to be those announced for it."""
        self._begin(batches, checked)
        groups = self._group_list
        if torch.is_grad_enabled():
            return FrugalRowsFunction.apply(self._anchor, FrugalStep(groups, batches))
        weights = [g.engine.lookup(b.engine_rows) for g, b in zip(groups, batches)]
        for g in groups:
            g.end_without_update()
        return weights

    def _begin(self, batches: List[GroupBatch], checked: bool = False) -> None:
        """Begin the engines' next step with ``batches``; raises, changing nothing, if their rows
        differ from those announced for it (``checked``: known to be those)."""
        groups = self._group_list
        for g in groups:  # a forward whose backward never ran (its loss dropped: an eval in train mode)
            g.close_open_step()
        if not checked:
            for g, b, feats in zip(groups, batches, self._layout.features_of_table):
                g.check_announced(b.rows, feats)
        for g, b in zip(groups, batches):
            g.begin(b.engine_rows)
        if self._announced_batches:  # the step took its announced batch off every group
            self._announced_batches.popleft()

    def _read_within_step(self, batches: List[GroupBatch]) -> Sequence[torch.Tensor]:
        """Rows read while the engines' step is open, after a forward whose backward has not run:
        the same collection called twice before backward (two towers sharing it), as stock allows.
        Every pending host write is applied first (collective: every rank makes the same calls),
        so the rows are current although the step's gate did not cover them; the gradients come
        back through their own backward and are applied as an update of their own."""
        if self._announce_dist is not None:
            raise FrugalInputError(
                "a frugal_row_wise collection called again before the backward of its previous call: "
                "not supported (call it once, on the features of both calls)"
            )
        for g in self.groups:
            g.engine.flush(within_step=True)
        if torch.is_grad_enabled():
            return FrugalRowsFunction.apply(self._anchor, FrugalStep(list(self.groups), batches))
        return [g.engine.lookup(b.engine_rows) for g, b in zip(self.groups, batches)]

    def _read_between_steps(self, batches: List[GroupBatch]) -> Sequence[torch.Tensor]:
        """Rows read outside the engines' steps: a forward without gradients of a batch that is
        not the one announced next (an evaluation between pipelined training steps, as stock
        TorchRec allows). Every pending write is flushed first (collective, as stock's eval
        forward is), so the values are current; the announced steps stay as they were."""
        for g in self.groups:
            g.ensure_flushed()
            g.refresh_caches()
        return [g.engine.lookup(b.engine_rows) for g, b in zip(self.groups, batches)]

    # ------------------------------------------------------------------ TorchRec lookup protocol
    def flush(self) -> None:
        """Apply every pending host write (collective): host tables then equal the caches."""
        for g in self.groups:
            g.ensure_flushed()

    def purge(self) -> None:
        """Nothing to drop before a load: the engines refresh their caches in ``write``."""

    def named_parameters_by_table(self) -> Iterator[Tuple[str, nn.Parameter]]:
        for g in self.groups:
            yield from g.placeholders.items()

    def group_of(self, table: str) -> FrugalTableGroup:
        for g in self.groups:
            if table in g.table_index:
                return g
        raise KeyError(table)

    def table_names(self) -> List[str]:
        return [t.name for g in self.groups for t in g.tables]

    def close(self) -> None:
        """Stop the engines' flushers (pending writes are kept only if flush() ran)."""
        for g in self.groups:
            g.engine.close()
