"""The kernel of frugal tables: a group of tables behind one engine, with its fused optimizer.

The counterpart of TorchRec's ``batched_embedding_kernel.py``: where a fused FBGEMM kernel serves
a batch of tables and applies the optimizer inside backward, a :class:`FrugalTableGroup` serves
its tables through a :class:`~torchrec_frugal.engine.frugal_engine.FrugalEngine`, and :class:`FrugalStep`
hands the step's row gradients to that engine, which sums them over ranks and updates each row
at its owner.
"""
from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.optim.fused import EmptyFusedOptimizer, FusedOptimizerModule

from ..config import FrugalConfig, OptimizerSpec, TableSpec
from ..engine.frugal_engine import FrugalEngine, Rows
from ..errors import FrugalError, FrugalInputError
from .optim import FrugalFusedOptimizer
from .row_pooling import TransposedBags, row_gradients, sum_bags
from .checkpoint import row_layout
from ..engine.step_plan import StepPlan
from .types import OPTIMIZER_KINDS, FrugalTable

# FBGEMM TBE defaults (SplitTableBatchedEmbeddingBagsCodegen's arguments), used when fused_params omit them.
_FBGEMM_DEFAULTS = {"learning_rate": 0.01, "eps": 1.0e-8, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.0}
_SPEC_FIELDS = {"learning_rate": "lr"}  # OptimizerSpec's name of a fused_params key, where they differ

# The optimizers whose FBGEMM kernel applies weight_decay (decoupled, inside Adam's step). EXACT_ADAGRAD's
# kernel takes none (stock ignores the key); EXACT_SGD's takes none either, and EXACT_ROWWISE_ADAGRAD's
# applies it only with a weight_decay_mode: frugal refuses those two non-zero (kept as it was).
_WEIGHT_DECAY_IGNORED = (EmbOptimType.EXACT_ADAGRAD,)


def optimizer_spec(fused_params: Dict[str, Any], table: str) -> OptimizerSpec:
    """The engine optimizer for ``fused_params`` as TorchRec passes them to a fused kernel."""
    opt = fused_params.get("optimizer", EmbOptimType.EXACT_SGD)
    if isinstance(opt, str):
        opt = EmbOptimType(opt)
    if opt not in OPTIMIZER_KINDS:
        supported = ", ".join(f"EmbOptimType.{o.name}" for o in OPTIMIZER_KINDS)
        raise ValueError(f"table {table!r}: frugal sharding supports the fused optimizers {supported}, got {opt}")
    values = {key: fused_params.get(key, default) for key, default in _FBGEMM_DEFAULTS.items()}
    if opt != EmbOptimType.ADAM:  # only Adam's kernel reads the betas (any value is accepted otherwise)
        del values["beta1"], values["beta2"]
    if opt in _WEIGHT_DECAY_IGNORED:
        values["weight_decay"] = 0.0  # FBGEMM's kernel does not read it
    elif values["weight_decay"] and opt != EmbOptimType.ADAM:
        raise ValueError(f"table {table!r}: frugal sharding does not apply weight_decay with {opt}")
    try:
        hyper = {_SPEC_FIELDS.get(key, key): float(value) for key, value in values.items()}
        return OptimizerSpec(kind=OPTIMIZER_KINDS[opt], **hyper)
    except (TypeError, ValueError) as e:
        raise ValueError(f"table {table!r}: fused_params of {opt}: {e}") from None


@dataclass
class GroupBatch:
    """One engine's share of a batch: its unique fused rows and how the values map onto them.

    A batch planned ahead also carries its engine's step plan, its bag offsets and its values
    per feature, so that its forward reads nothing from the batch itself.
    """

    rows: torch.Tensor  # unique fused rows, sorted, CPU int64: what the engine steps on
    inverse: torch.Tensor  # per value (group order), index into rows, on the compute device
    lengths: torch.Tensor  # per bag, the group's features concatenated
    weights: Optional[torch.Tensor]  # per value pooling weight (KJT weights and MEAN scaling)
    plan: Optional[StepPlan] = None  # the engine's plan of the step (a batch planned ahead)
    offsets: Optional[torch.Tensor] = None  # bag offsets on the device (pooled, planned ahead)
    splits: Optional[List[int]] = None  # values per feature of the group (planned ahead)
    transposed: Optional[TransposedBags] = None  # the bags seen from the rows, for the backward (planned ahead)

    @property
    def transposed_parts(self) -> Tuple[Optional[torch.Tensor], ...]:
        t = self.transposed
        return () if t is None else (t.indices, t.offsets, t.weights)

    @property
    def engine_rows(self) -> Rows:
        """What the engine's calls take: the step plan where there is one, else the rows."""
        return self.plan if self.plan is not None else self.rows


class FrugalTableGroup(nn.Module, FusedOptimizerModule):
    """The tables of one lookup that share an engine (same dim, optimizer and cache ratio)."""

    def __init__(
        self,
        tables: List[FrugalTable],
        config: FrugalConfig,
        pg: Optional[dist.ProcessGroup],
        device: torch.device,
        checkpoint_pg: Optional[dist.ProcessGroup] = None,
    ) -> None:
        super().__init__()
        self.tables = tables
        self.pg = pg  # the engine's ranks (frugal_row_wise: one node's)
        # The ranks a checkpoint's ShardedTensors span (frugal_row_wise: every node's).
        self.checkpoint_pg = checkpoint_pg if checkpoint_pg is not None else pg
        self.engine = FrugalEngine(
            tables=[TableSpec(t.name, t.num_embeddings, t.embedding_dim) for t in tables],
            optimizer=tables[0].optimizer,
            config=replace(config, cache_ratio=tables[0].cache_ratio),
            pg=pg,
            device=device,
            init_weights=lambda t, view: tables[t].init_fn(view),
            # Always passed (zeros where a rank has none): the engine sums them over ranks.
            presample_counts=[
                t.presample_counts if t.presample_counts is not None else torch.zeros(t.num_embeddings)
                for t in tables
            ],
        )
        self._finalizer = weakref.finalize(self, self.engine.close)
        self.table_index: Dict[str, int] = {t.name: i for i, t in enumerate(tables)}
        # Stand-ins for TorchRec's per-table weight parameters: the weights live in the engine.
        # _in_backward_optimizers keeps them out of dense optimizers, as for fused TBE slices.
        self.placeholders: Dict[str, nn.Parameter] = {}
        for t in tables:
            p = nn.Parameter(torch.empty(0, device=device))
            p._in_backward_optimizers = [EmptyFusedOptimizer()]  # type: ignore[attr-defined]
            self.placeholders[t.name] = p
        self._announced: Deque[torch.Tensor] = deque()  # rows pushed to the lookahead, per future step
        self._flushed_step: Optional[int] = None  # engine step at which host last equalled the caches
        # block() handed out writable views of host rows since the caches were last read: they are
        # re-read from host before the next read (refresh_caches), so what was written into the
        # views (dcp.load into a state_dict) is what trains on.
        self._views_out = False
        # (host view, copy) of the optimizer state columns state_block() could only copy, the latest
        # per (table, first column): written back into host whenever host is read (a state_dict, a
        # load, a forward), as a view's would be there already; dropped at the next forward.
        self._copies_out: Dict[Tuple[str, int], Tuple[torch.Tensor, torch.Tensor]] = {}
        self._optim = FrugalFusedOptimizer(self)

    @property
    def fused_optimizer(self) -> FrugalFusedOptimizer:
        return self._optim

    def fused_rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        return self.engine.rows(table, ids)

    def fused_rows_of_tables(self, tables: Sequence[int], counts: Sequence[int], ids: torch.Tensor) -> Optional[torch.Tensor]:
        return self.engine.rows_of_tables(tables, counts, ids)

    def announce(self, rows: Rows) -> None:
        """Push the rows (or the step plan) of a future step to the engine's lookahead window."""
        self.engine.push_lookahead(rows)
        self._announced.append(rows.rows if isinstance(rows, StepPlan) else rows)

    def lookahead_capacity(self) -> int:
        """Future steps the engine's window takes now: steps s..s+L, less those begun or announced."""
        return self.engine.lookahead + 1 - self.engine.in_step - len(self._announced)

    def announced_next(self, rows: torch.Tensor) -> bool:
        """Whether ``rows`` are the rows announced for the next step (some are announced)."""
        return bool(self._announced) and self.fits_announced(rows)

    def fits_announced(self, rows: torch.Tensor) -> bool:
        """Whether a step of ``rows`` may begin now: they are the rows announced next, or none are."""
        if not self._announced:
            return True
        expected = self._announced[0]
        return expected is rows or torch.equal(expected, rows)

    def check_announced(self, rows: torch.Tensor, feature_of_table: Dict[int, List[str]]) -> None:
        """Raise, changing nothing, if this step's rows differ from the ones announced for it."""
        if self.fits_announced(rows):
            return
        both = torch.cat([self._announced[0], rows])
        u, counts = torch.unique(both, return_counts=True)
        differing = u[counts == 1]
        t_idx = torch.searchsorted(self.engine.table_offsets, differing, right=True) - 1
        bad = sorted({int(t) for t in t_idx.tolist()})
        names = ", ".join(
            f"table {self.tables[t].name!r} (features {feature_of_table.get(t, [])})" for t in bad
        )
        raise FrugalInputError(
            f"step {self.engine.step}: the batch trained differs from the lookahead batch announced "
            f"for it in {names}; nothing was changed"
        )

    def begin(self, rows: Rows) -> None:
        self.refresh_caches()
        self.engine.begin_step(rows)
        if self._announced:
            self._announced.popleft()

    def end_without_update(self) -> None:
        """End the engine's step with no gradients (a forward whose backward never ran)."""
        empty = torch.empty(0, dtype=torch.int64)
        self.engine.apply_gradients(empty, torch.empty(0, self.engine.dim))

    def close_open_step(self) -> None:
        """End, with no update, the step of a forward whose backward has not run (if any); the
        backward, if it comes later, updates in a step of its own (:meth:`apply_gradients`)."""
        if self.engine.in_step:
            self.end_without_update()

    def apply_gradients(self, rows: Rows, grads: torch.Tensor) -> None:
        """One forward's gradients, as one update: of the open step, or, when that step was ended
        (by the backward of another forward of the same step: a collection called twice before
        backward; or by a state_dict in between), of a step of its own that reads nothing. Stock's
        fused optimizer applies each call's gradients in turn, in backward's order: so does this."""
        if not self.engine.in_step:
            if self._announced:
                raise FrugalError(
                    f"step {self.engine.step}: the backward of a forward whose step already ended, while batches "
                    "are announced ahead (FrugalTrainPipeline, push_lookahead): run backward before the next forward"
                )
            self.engine.begin_step(torch.empty(0, dtype=torch.int64))
        # TorchRec's sharded backward divides embedding gradients by the world size
        # (comm_ops.GRADIENT_DIVISION), matching DDP's averaging of dense gradients; the
        # engine divides off the training thread.
        self.engine.apply_gradients(rows, grads, self.engine.world_size if get_gradient_division() else 1)

    def ensure_flushed(self) -> None:
        """Collective: make host equal the caches, unless no step ran since the last flush."""
        self._write_back_copies()
        self.close_open_step()
        if self._flushed_step != self.engine.step:
            self.engine.flush()
            self._flushed_step = self.engine.step

    def refresh_caches(self) -> None:
        """Collective, between steps, before the caches are read: if :meth:`block` handed out views
        since the last step, re-read the caches from host, so that what was written into them (a
        checkpoint loaded in place) is what is read and updated next."""
        if self._views_out:
            self._views_out = False
            self._write_back_copies()
            self._copies_out.clear()
            self.engine.reload_from_host()

    def _write_back_copies(self) -> None:
        """Write what :meth:`state_block` handed out as copies back into host (no step ran since)."""
        for view, copy in self._copies_out.values():
            view.copy_(copy)

    # ------------------------------------------------------------------ checkpoint rows
    def checkpoint_blocks(self, table: str) -> List[Tuple[int, int]]:
        """Each rank's (first row, rows) of the whole ``table`` in a checkpoint, by rank of
        ``checkpoint_pg``: row_wise's blocks, per node and then per rank of the node."""
        t = self.tables[self.table_index[table]]
        return row_layout(t.table_rows, dist.get_world_size(self.checkpoint_pg), dist.get_world_size(self.pg))

    def own_block(self, table: str) -> Tuple[int, int]:
        """(first row of the whole table, rows) of this rank's block in a checkpoint."""
        return self.checkpoint_blocks(table)[dist.get_rank(self.checkpoint_pg)]

    def engine_ids(self, table: str, first: int, count: int, what: str) -> torch.Tensor:
        """Ids in this engine's table of rows [first, first + count) of the whole table; raises if
        they lie outside the rows this engine holds (another node's block)."""
        t = self.tables[self.table_index[table]]
        lo = first - t.row_offset
        if lo < 0 or lo + count > t.num_embeddings:
            raise ValueError(
                f"{what}: rows {first}..{first + count - 1} of table {table!r} lie outside the rows "
                f"{t.row_offset}..{t.row_offset + t.num_embeddings - 1} this rank's node holds"
            )
        return torch.arange(lo, lo + count)

    def table_rows(self, table: str, ids: torch.Tensor) -> torch.Tensor:
        i = self.table_index[table]
        return ids.to(torch.int64) + self.engine.table_offsets[i]

    def read(self, table: str, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(weights, optimizer state) of ``ids`` of ``table`` from host; the engine must be flushed."""
        return self.engine.read_rows(self.table_rows(table, ids))

    def block(self, table: str, first: int, count: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views of (weights, optimizer state) of rows [first, first + count) of ``table`` in host
        memory; the engine must be flushed. A checkpoint saves them without a copy, and loads into
        them in place (``dcp.load`` into a state_dict): what is written before the next step is what
        that step and the ones after train on, as with stock TorchRec's live tables."""
        lo = int(self.engine.table_offsets[self.table_index[table]]) + first
        self._views_out = True
        return self.engine.host_block(lo, lo + count)

    def state_block(self, table: str, first: int, count: int, columns: slice) -> torch.Tensor:
        """Optimizer state ``columns`` of rows [first, first + count) of ``table`` as :meth:`block`
        hands them out: a view of host memory where those columns are contiguous (every state but
        Adam's two moments, which interleave per row), else a copy written back into host before
        host is next read, so that a checkpoint loaded into it in place is restored all the same."""
        _, state = self.block(table, first, count)
        part = state[:, columns]
        if part.is_contiguous():
            return part
        copy = part.clone()
        self._copies_out[(table, columns.start)] = (part, copy)
        return copy

    def write(self, parts: Sequence[Tuple[str, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]]) -> None:
        """Collective load of (table, ids, weights or None, state or None) parts held by this rank.

        Each rank writes only its own parts (its block of a checkpoint) into the shared host
        tables: no rank gathers another's rows. Values not given keep their current host copy.
        """
        self.ensure_flushed()
        self._copies_out.clear()  # older than what is written now
        d, sw = self.engine.dim, self.engine.state_width
        self.engine.write_rows(
            [
                (
                    self.table_rows(table, ids),
                    None if w is None else w.reshape(ids.shape[0], d),
                    None if s is None else s.reshape(ids.shape[0], sw),
                )
                for table, ids, w, s in parts
            ]
        )
        self._flushed_step = self.engine.step


class FrugalStep:
    """One forward's rows of each group; its backward applies their gradients (one update per group)."""

    def __init__(self, groups: List[FrugalTableGroup], batches: List[GroupBatch]) -> None:
        self.groups = groups
        self.batches = batches

    def apply(self, grads: Sequence[torch.Tensor]) -> None:
        for g, b, grad in zip(self.groups, self.batches, grads):
            g.apply_gradients(b.engine_rows, grad)


class FrugalRowsFunction(torch.autograd.Function):
    """Current values of each group's unique rows; backward is the fused optimizer update."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, step: FrugalStep) -> Tuple[torch.Tensor, ...]:  # type: ignore[override]
        ctx.step = step
        return tuple(g.engine.lookup(b.engine_rows) for g, b in zip(step.groups, step.batches))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[None, None]:  # type: ignore[override]
        ctx.step.apply(grads)
        return None, None


class FrugalPooledFunction(torch.autograd.Function):
    """Each group's rows pooled into its bags ([bags, dim] per group): :class:`FrugalRowsFunction`
    and the pooling (``row_pooling.pool_rows``) as one autograd node, for a batch planned ahead
    (bag offsets and the backward's transposition made, pooling weights that learn nothing): the
    same numbers, one node's cost on the training thread where two were paid."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, step: FrugalStep) -> Tuple[torch.Tensor, ...]:  # type: ignore[override]
        pooled: List[torch.Tensor] = []
        transposed: List[TransposedBags] = []
        for g, b in zip(step.groups, step.batches):
            assert b.offsets is not None and b.transposed is not None
            rows = g.engine.lookup(b.engine_rows)
            weights = None if b.weights is None else b.weights.to(rows.device, rows.dtype)
            pooled.append(sum_bags(rows, b.inverse, b.offsets, weights))
            transposed.append(b.transposed)
        ctx.step, ctx.transposed = step, transposed
        return tuple(pooled)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[None, None]:  # type: ignore[override]
        ctx.step.apply([row_gradients(grad.contiguous(), t) for grad, t in zip(grads, ctx.transposed)])
        return None, None
