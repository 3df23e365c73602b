"""The "frugal" sharding type: data-parallel in structure, tables served by Frugal engines.

Each rank keeps its own batch (no input all-to-all, as in TorchRec's data-parallel sharding),
reads its rows through its :class:`~torchrec_frugal.engine.FrugalEngine` (own cache, or the table
in shared host memory), and pools them locally (no output all-to-all). Backward hands the
gradient of the step's unique rows to the engine, which sums it over ranks and applies the fused
optimizer at each row's owner: the update FBGEMM's fused kernels apply to a sharded table.
"""
from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.embedding_sharding import (
    BaseEmbeddingDist,
    BaseEmbeddingLookup,
    BaseSparseFeaturesDist,
    EmbeddingSharding,
    EmbeddingShardingContext,
    EmbeddingShardingInfo,
)
from torchrec.distributed.embedding_types import (
    BaseGroupedFeatureProcessor,
    EmbeddingComputeKernel,
    ShardedEmbeddingTable,
)
from torchrec.distributed.sharding.dp_sequence_sharding import DpSequenceEmbeddingDist
from torchrec.distributed.sharding.dp_sharding import DpPooledEmbeddingDist, DpSparseFeaturesDist
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext
from torchrec.distributed.types import ShardingEnv, ShardMetadata
from torchrec.modules.embedding_configs import DataType, PoolingType
from torchrec.optim.fused import EmptyFusedOptimizer, FusedOptimizerModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..config import FrugalConfig, OptimizerSpec, TableSpec
from ..engine import FrugalEngine
from ..errors import FrugalError, FrugalInputError
from .optim import FrugalFusedOptimizer

FRUGAL = "frugal"
"""The sharding-type string of ``ParameterSharding.sharding_type`` for Frugal tables."""

C = TypeVar("C", EmbeddingShardingContext, SequenceShardingContext)

# FBGEMM TBE defaults (split_table_batched_embeddings_ops_training), used when fused_params omit them.
_FBGEMM_LEARNING_RATE = 0.01
_FBGEMM_EPS = 1.0e-8
_OPTIMIZER_KINDS: Dict[EmbOptimType, str] = {
    EmbOptimType.EXACT_SGD: "sgd",
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: "rowwise_adagrad",
}


def optimizer_spec(fused_params: Dict[str, Any], table: str) -> OptimizerSpec:
    """The engine optimizer for ``fused_params`` as TorchRec passes them to a fused kernel."""
    opt = fused_params.get("optimizer", EmbOptimType.EXACT_SGD)
    if isinstance(opt, str):
        opt = EmbOptimType(opt)
    if opt not in _OPTIMIZER_KINDS:
        supported = ", ".join(f"EmbOptimType.{o.name}" for o in _OPTIMIZER_KINDS)
        raise ValueError(f"table {table!r}: frugal sharding supports the fused optimizers {supported}, got {opt}")
    if fused_params.get("weight_decay", 0.0):
        raise ValueError(f"table {table!r}: frugal sharding does not apply weight_decay with {opt}")
    return OptimizerSpec(
        kind=_OPTIMIZER_KINDS[opt],
        lr=float(fused_params.get("learning_rate", _FBGEMM_LEARNING_RATE)),
        eps=float(fused_params.get("eps", _FBGEMM_EPS)),
    )


@dataclass
class FrugalTable:
    """One table of a frugal sharding, as its lookup needs it."""

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: List[str]
    pooling: PoolingType
    init_fn: Callable[[torch.Tensor], Any]
    optimizer: OptimizerSpec
    cache_ratio: float
    presample_counts: Optional[torch.Tensor]


@dataclass
class _AnnouncedBatch:
    """A future batch as announced: its ids (CPU) and the (rows, inverse) of each group."""

    values: torch.Tensor
    lengths: torch.Tensor
    group_rows: List[Tuple[torch.Tensor, torch.Tensor]]


@dataclass
class _GroupBatch:
    """One engine's share of a batch: its unique fused rows and how the values map onto them."""

    rows: torch.Tensor  # unique fused rows, sorted, CPU int64: what the engine steps on
    inverse: torch.Tensor  # per value (group order), index into rows, on the compute device
    lengths: torch.Tensor  # per bag, the group's features concatenated
    weights: Optional[torch.Tensor]  # per value pooling weight (KJT weights and MEAN scaling)


class FrugalTableGroup(nn.Module, FusedOptimizerModule):
    """The tables of one lookup that share an engine (same dim, optimizer and cache ratio)."""

    def __init__(
        self,
        tables: List[FrugalTable],
        config: FrugalConfig,
        pg: Optional[dist.ProcessGroup],
        device: torch.device,
    ) -> None:
        super().__init__()
        self.tables = tables
        self.pg = pg
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
        self._open: Optional["_FrugalStep"] = None
        self._flushed_step: Optional[int] = None  # engine step at which host last equalled the caches
        self._optim = FrugalFusedOptimizer(self)

    @property
    def fused_optimizer(self) -> FrugalFusedOptimizer:
        return self._optim

    def fused_rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        return self.engine.rows(table, ids)

    def announce(self, rows: torch.Tensor) -> None:
        """Push the rows of a future step to the engine's lookahead window."""
        self.engine.push_lookahead(rows)
        self._announced.append(rows)

    def lookahead_capacity(self) -> int:
        """Future steps the engine's window takes now: steps s..s+L, less those begun or announced."""
        return self.engine.lookahead + 1 - (self._open is not None) - len(self._announced)

    def check_announced(self, rows: torch.Tensor, feature_of_table: Dict[int, List[str]]) -> None:
        """Raise, changing nothing, if this step's rows differ from the ones announced for it."""
        if not self._announced:
            return
        expected = self._announced[0]
        if torch.equal(expected, rows):
            return
        both = torch.cat([expected, rows])
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

    def begin(self, rows: torch.Tensor) -> None:
        self.engine.begin_step(rows)
        if self._announced:
            self._announced.popleft()

    def end_without_update(self) -> None:
        """End the engine's step with no gradients (a forward whose backward never ran)."""
        empty = torch.empty(0, dtype=torch.int64)
        self.engine.apply_gradients(empty, torch.empty(0, self.engine.dim))

    def ensure_flushed(self) -> None:
        """Collective: make host equal the caches, unless no step ran since the last flush."""
        if self._open is not None:
            self._open.close_without_update()
        if self._flushed_step != self.engine.step:
            self.engine.flush()
            self._flushed_step = self.engine.step

    # ------------------------------------------------------------------ checkpoint rows
    def table_rows(self, table: str, ids: torch.Tensor) -> torch.Tensor:
        i = self.table_index[table]
        return ids.to(torch.int64) + self.engine.table_offsets[i]

    def read(self, table: str, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(weights, optimizer state) of ``ids`` of ``table`` from host; the engine must be flushed."""
        return self.engine.read_rows(self.table_rows(table, ids))

    def block(self, table: str, first: int, count: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views of (weights, optimizer state) of rows [first, first + count) of ``table`` in host
        memory; the engine must be flushed. A checkpoint saves them without a copy."""
        lo = int(self.engine.table_offsets[self.table_index[table]]) + first
        return self.engine.host_block(lo, lo + count)

    def write(self, parts: Sequence[Tuple[str, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]]) -> None:
        """Collective load of (table, ids, weights or None, state or None) parts held by this rank.

        Each rank writes only its own parts (its block of a checkpoint) into the shared host
        tables: no rank gathers another's rows. Values not given keep their current host copy.
        """
        self.ensure_flushed()
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


class _FrugalStep:
    """One forward's engine steps; backward (or the next forward) ends them."""

    def __init__(self, groups: List[FrugalTableGroup], batches: List[_GroupBatch]) -> None:
        self.groups = groups
        self.batches = batches
        for g in groups:
            g._open = self

    def _check_open(self) -> None:
        if any(g._open is not self for g in self.groups):
            raise FrugalError(
                "backward of a frugal lookup whose step was already ended: run backward before the "
                "next forward (or state_dict) of the model"
            )

    def apply(self, grads: Sequence[torch.Tensor]) -> None:
        self._check_open()
        for g, b, grad in zip(self.groups, self.batches, grads):
            g._open = None
            if get_gradient_division():
                # TorchRec's sharded backward divides embedding gradients by the world size
                # (comm_ops.GRADIENT_DIVISION), matching DDP's averaging of dense gradients.
                grad = grad / g.engine.world_size
            g.engine.apply_gradients(b.rows, grad)

    def close_without_update(self) -> None:
        self._check_open()
        for g in self.groups:
            g._open = None
            g.end_without_update()


class _FrugalRowsFunction(torch.autograd.Function):
    """Current values of each group's unique rows; backward is the fused optimizer update."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, step: _FrugalStep) -> Tuple[torch.Tensor, ...]:  # type: ignore[override]
        ctx.step = step
        return tuple(g.engine.lookup(b.rows) for g, b in zip(step.groups, step.batches))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[None, None]:  # type: ignore[override]
        ctx.step.apply(grads)
        return None, None


class FrugalEmbeddingLookup(BaseEmbeddingLookup[KeyedJaggedTensor, torch.Tensor]):
    """Lookup of a frugal sharding: pooled ([B, sum dims]) or sequence ([values, dim]) output."""

    def __init__(
        self,
        tables: List[FrugalTable],
        pooled: bool,
        config: FrugalConfig,
        pg: Optional[dist.ProcessGroup],
        device: torch.device,
    ) -> None:
        super().__init__()
        self._pooled = pooled
        self._device = device
        # Position of each KJT feature this lookup receives -> (group, table index in group).
        self._feature_names: List[str] = [f for t in tables for f in t.feature_names]
        keyed: Dict[Tuple[Any, ...], List[FrugalTable]] = {}
        for t in tables:
            o = t.optimizer
            key = (t.embedding_dim, o.kind, o.lr, o.eps, t.cache_ratio)
            keyed.setdefault(key, []).append(t)
        self.groups = nn.ModuleList(FrugalTableGroup(ts, config, pg, device) for ts in keyed.values())
        where = {t.name: (gi, g.table_index[t.name]) for gi, g in enumerate(self.groups) for t in g.tables}
        self._positions: List[List[int]] = [[] for _ in self.groups]
        self._position_table: List[int] = []
        for p, (table, feature) in enumerate((t, f) for t in tables for f in t.feature_names):
            gi, ti = where[table.name]
            self._positions[gi].append(p)
            self._position_table.append(ti)
        self._features_of_table: List[Dict[int, List[str]]] = [
            {ti: [self._feature_names[p] for p in ps if self._position_table[p] == ti] for ti in range(len(g.tables))}
            for g, ps in zip(self.groups, self._positions)
        ]
        self._mean_positions = torch.tensor(
            [t.pooling == PoolingType.MEAN for t in tables for _ in t.feature_names], dtype=torch.bool
        )
        # Leaf that makes the lookup's output require grad, so backward reaches the engines.
        self._anchor = torch.zeros(0, requires_grad=True)
        # Per announced future batch (aligned with each group's announced rows): its ids and the
        # (rows, inverse) computed when it was announced, reused by its forward if the ids match.
        self._announced_batches: Deque[Optional[_AnnouncedBatch]] = deque()
        self._last_lookahead: Optional[_AnnouncedBatch] = None

    @property
    def feature_names(self) -> List[str]:
        return self._feature_names

    # ------------------------------------------------------------------ rows of a batch
    def _check_layout(self, features: KeyedJaggedTensor) -> None:
        keys = features.keys()
        if keys != self._feature_names:
            raise FrugalInputError(f"frugal lookup expects features {self._feature_names}, got {keys}")
        if features.variable_stride_per_key():
            raise FrugalInputError("frugal sharding does not support variable batch size per feature")

    def _group_rows(self, features: KeyedJaggedTensor) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per group, the batch's unique fused rows (ids validated) and each value's index into them."""
        self._check_layout(features)
        values, keys, opk = features.values(), features.keys(), features.offset_per_key()
        out = []
        for g, positions in zip(self.groups, self._positions):
            parts = []
            for p in positions:
                try:
                    parts.append(g.fused_rows(self._position_table[p], values[opk[p] : opk[p + 1]]))
                except FrugalInputError as e:
                    raise FrugalInputError(f"feature {keys[p]!r}: {e}; nothing was changed") from None
            rows, inverse = torch.unique(torch.cat(parts), return_inverse=True)
            out.append((rows, inverse))
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
            self._check_layout(features)
            return ahead.group_rows
        return self._group_rows(features)

    def _group_batches(self, features: KeyedJaggedTensor, group_rows: List[Tuple[torch.Tensor, torch.Tensor]]) -> List[_GroupBatch]:
        lengths = features.lengths()
        stride = features.stride()
        opk = features.offset_per_key()
        kjt_weights = features.weights_or_none() if self._pooled else None
        batches = []
        for (rows, inverse), positions in zip(group_rows, self._positions):
            g_lengths = torch.cat([lengths[p * stride : (p + 1) * stride] for p in positions])
            weights = None
            if self._pooled:
                if kjt_weights is not None:
                    weights = torch.cat([kjt_weights[opk[p] : opk[p + 1]] for p in positions])
                mean = self._mean_positions[positions]
                if bool(mean.any()):
                    bag_mean = mean.repeat_interleave(stride).to(g_lengths.device)
                    scale = torch.where(bag_mean, 1.0 / g_lengths.clamp(min=1).to(torch.float32), 1.0)
                    per_value = scale.repeat_interleave(g_lengths)
                    weights = per_value if weights is None else weights * per_value
            batches.append(_GroupBatch(rows, inverse.to(self._device), g_lengths, weights))
        return batches

    def lookahead_rows(self, features: KeyedJaggedTensor) -> List[torch.Tensor]:
        """Each group's rows for ``features`` (validated), as the forward of that batch steps on."""
        group_rows = self._group_rows(features)
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

    def lookahead_capacity(self) -> int:
        """How many more future steps the engines accept now."""
        return min(g.lookahead_capacity() for g in self.groups)

    def lookahead(self) -> int:
        return min(g.engine.lookahead for g in self.groups)

    # ------------------------------------------------------------------ forward
    def forward(self, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        batches = self._group_batches(sparse_features, self._rows_for_forward(sparse_features))
        groups = list(self.groups)
        for g in groups:
            if g._open is not None:
                g._open.close_without_update()
        for g, b, feats in zip(groups, batches, self._features_of_table):
            g.check_announced(b.rows, feats)
        for g, b in zip(groups, batches):
            g.begin(b.rows)
        if self._announced_batches:  # the step took its announced batch off every group
            self._announced_batches.popleft()
        if torch.is_grad_enabled():
            weights = _FrugalRowsFunction.apply(self._anchor, _FrugalStep(groups, batches))
        else:
            weights = [g.engine.lookup(b.rows) for g, b in zip(groups, batches)]
            for g in groups:
                g.end_without_update()
        if self._pooled:
            return self._pool(sparse_features, batches, weights)
        return self._sequence(sparse_features, batches, weights)

    def _pool(self, features: KeyedJaggedTensor, batches: List[_GroupBatch], weights: Sequence[torch.Tensor]) -> torch.Tensor:
        stride = features.stride()
        out: List[Optional[torch.Tensor]] = [None] * len(self._feature_names)
        for positions, b, w in zip(self._positions, batches, weights):
            offsets = torch.zeros(b.lengths.numel() + 1, dtype=torch.int64, device=self._device)
            torch.cumsum(b.lengths.to(self._device), 0, out=offsets[1:])
            pooled = F.embedding_bag(
                b.inverse,
                w,
                offsets,
                mode="sum",
                per_sample_weights=None if b.weights is None else b.weights.to(self._device, w.dtype),
                include_last_offset=True,
            )
            for p, chunk in zip(positions, pooled.split(stride)):
                out[p] = chunk
        return torch.cat(out, dim=1)  # type: ignore[arg-type]

    def _sequence(self, features: KeyedJaggedTensor, batches: List[_GroupBatch], weights: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(batches) == 1:
            return weights[0][batches[0].inverse]
        lpk = features.length_per_key()
        out: List[Optional[torch.Tensor]] = [None] * len(self._feature_names)
        for positions, b, w in zip(self._positions, batches, weights):
            for p, chunk in zip(positions, w[b.inverse].split([lpk[p] for p in positions])):
                out[p] = chunk
        return torch.cat(out)  # type: ignore[arg-type]

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


class FrugalEmbeddingSharding(EmbeddingSharding[C, KeyedJaggedTensor, torch.Tensor, torch.Tensor]):
    """Frugal sharding of the tables of one sharded module.

    Like data-parallel sharding, every rank serves all of these tables for its own batch; unlike
    it, no rank holds a replica: the tables live once in host memory, behind the engines.
    """

    def __init__(
        self,
        sharding_infos: List[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        config: Optional[FrugalConfig] = None,
        presample_counts: Optional[Dict[str, torch.Tensor]] = None,
        init_fns: Optional[Dict[str, Callable[[torch.Tensor], Any]]] = None,
    ) -> None:
        super().__init__()
        if env.output_dtensor:
            raise NotImplementedError("frugal sharding writes ShardedTensor state, not DTensor")
        self._env = env
        self._device = device if device is not None else torch.device("cpu")
        self._config = config or FrugalConfig()
        counts = presample_counts or {}
        self._infos = sharding_infos
        self._tables: List[FrugalTable] = []
        self._embedding_names: List[str] = []
        self._embedding_dims: List[int] = []
        for info in sharding_infos:
            cfg = info.embedding_config
            if cfg.data_type != DataType.FP32:
                raise ValueError(f"table {cfg.name!r}: frugal sharding stores FP32 tables, got {cfg.data_type}")
            cache = info.param_sharding.cache_params
            self._tables.append(
                FrugalTable(
                    name=cfg.name,
                    num_embeddings=cfg.num_embeddings,
                    embedding_dim=cfg.embedding_dim,
                    feature_names=list(cfg.feature_names),
                    pooling=cfg.pooling,
                    init_fn=(init_fns or {}).get(cfg.name, cfg.init_fn),  # type: ignore[arg-type]
                    optimizer=optimizer_spec(info.fused_params or {}, cfg.name),
                    cache_ratio=(
                        cache.load_factor
                        if cache is not None and cache.load_factor is not None
                        else self._config.cache_ratio
                    ),
                    presample_counts=counts.get(cfg.name),
                )
            )
            self._embedding_names.extend(cfg.embedding_names)
            self._embedding_dims.extend([cfg.embedding_dim] * len(cfg.feature_names))

    def create_input_dist(self, device: Optional[torch.device] = None) -> BaseSparseFeaturesDist[KeyedJaggedTensor]:
        return DpSparseFeaturesDist()

    def create_lookup(
        self,
        device: Optional[torch.device] = None,
        fused_params: Optional[Dict[str, Any]] = None,
        feature_processor: Optional[BaseGroupedFeatureProcessor] = None,
    ) -> BaseEmbeddingLookup:
        if feature_processor is not None:
            raise NotImplementedError("frugal sharding does not support feature processors")
        return FrugalEmbeddingLookup(
            self._tables,
            pooled=self._pooled,
            config=self._config,
            pg=self._env.process_group,
            device=device if device is not None else self._device,
        )

    _pooled: bool = True

    def feature_names(self) -> List[str]:
        return [f for t in self._tables for f in t.feature_names]

    def embedding_names(self) -> List[str]:
        return list(self._embedding_names)

    def embedding_dims(self) -> List[int]:
        return list(self._embedding_dims)

    def embedding_names_per_rank(self) -> List[List[str]]:
        return [self.embedding_names() for _ in range(self._env.world_size)]

    def embedding_shard_metadata(self) -> List[Optional[ShardMetadata]]:
        return [None] * len(self._embedding_names)

    def embedding_tables(self) -> List[ShardedEmbeddingTable]:
        """The tables, whole on every rank (what TorchRec's index dedup reads)."""
        return [
            ShardedEmbeddingTable(
                num_embeddings=i.embedding_config.num_embeddings,
                embedding_dim=i.embedding_config.embedding_dim,
                name=i.embedding_config.name,
                embedding_names=i.embedding_config.embedding_names,
                data_type=i.embedding_config.data_type,
                feature_names=i.embedding_config.feature_names,
                pooling=i.embedding_config.pooling,
                is_weighted=i.embedding_config.is_weighted,
                local_rows=i.embedding_config.num_embeddings,
                local_cols=i.embedding_config.embedding_dim,
                compute_kernel=EmbeddingComputeKernel.CUSTOMIZED_KERNEL,
            )
            for i in self._infos
        ]


class FrugalPooledEmbeddingSharding(FrugalEmbeddingSharding[EmbeddingShardingContext]):
    """Frugal sharding of EmbeddingBagCollection tables (pooled output, local)."""

    _pooled = True

    def create_output_dist(
        self, device: Optional[torch.device] = None
    ) -> BaseEmbeddingDist[EmbeddingShardingContext, torch.Tensor, torch.Tensor]:
        return DpPooledEmbeddingDist()


class FrugalSequenceEmbeddingSharding(FrugalEmbeddingSharding[SequenceShardingContext]):
    """Frugal sharding of EmbeddingCollection tables (one embedding per id, local)."""

    _pooled = False

    def create_output_dist(
        self, device: Optional[torch.device] = None
    ) -> BaseEmbeddingDist[SequenceShardingContext, torch.Tensor, torch.Tensor]:
        return DpSequenceEmbeddingDist()
