"""What the frugal sharders and sharded modules add to TorchRec's, shared by both collections.

The counterpart of TorchRec's ``embedding_types.py`` (``BaseEmbeddingSharder``,
``ShardedEmbeddingModule``): :class:`FrugalSharderMixin` offers the "frugal" type and carries the
engines' config; :class:`FrugalShardedModuleMixin` builds the frugal sharding, checks the input's
features, hosts frugal tables in state_dict and feeds the lookahead. :mod:`.embeddingbag` and
:mod:`.embedding` put them on EmbeddingBagCollection and EmbeddingCollection.
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Optional, Tuple, Type

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import Awaitable, ParameterSharding, ShardingEnv
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..config import FrugalConfig
from ..engine.frugal_engine import FrugalEngine
from ..errors import FrugalInputError
from .bounds_check import ROW_ZERO, OutOfRangeLog, RowZero, row_zero
from .checkpoint import held_rows, rows_sharded_tensor
from .embedding_lookup import BatchPlan, FrugalEmbeddingLookup
from .sharding.frugal_sharding import FrugalEmbeddingSharding
from .fused_params import frugal_fused_params
from .sharding.node_groups import local_world_size
from .plan_report import engine_caches, log_plan_report, plan_report
from .types import FRUGAL, FRUGAL_ROW_WISE, FRUGAL_TYPES


class FrugalSharderMixin:
    """What the frugal sharders add to TorchRec's: the frugal types, their kernel, the engines' config.

    Put before TorchRec's sharder class; ``_stock_sharding_types`` are the other types offered.
    """

    _stock_sharding_types: ClassVar[List[str]]

    def _set_frugal(self, config: Optional[FrugalConfig], presample_counts: Optional[Dict[str, torch.Tensor]]) -> None:
        self._config = config or FrugalConfig()
        self._presample_counts = presample_counts

    @property
    def config(self) -> FrugalConfig:
        return self._config

    def with_config(self, config: FrugalConfig) -> "FrugalSharderMixin":
        """A copy of this sharder with ``config`` (this one and its config are left as they are)."""
        out = copy.copy(self)
        out._config = config
        return out

    def _frugal_kwargs(self) -> Dict[str, Any]:
        """What the sharded module takes beyond TorchRec's arguments."""
        return {"config": self._config, "presample_counts": self._presample_counts}

    def sharding_types(self, compute_device_type: str) -> List[str]:
        """"frugal", then "frugal_row_wise" when the job spans nodes (LOCAL_WORLD_SIZE below the
        world size: one node's shared memory cannot serve a frugal table to all), then the stock types."""
        spans_nodes = dist.is_initialized() and local_world_size(dist.get_world_size()) < dist.get_world_size()
        return [FRUGAL] + ([FRUGAL_ROW_WISE] if spans_nodes else []) + self._stock_sharding_types

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        if sharding_type in FRUGAL_TYPES:
            return [EmbeddingComputeKernel.FUSED.value]
        return super().compute_kernels(sharding_type, compute_device_type)  # type: ignore[misc]


def customized_kernel_for_frugal(params: Dict[str, ParameterSharding]) -> Dict[str, ParameterSharding]:
    """Frugal tables run TorchRec's CUSTOMIZED_KERNEL path: the sharded module owns their state."""
    return {
        name: replace(ps, compute_kernel=EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value)
        if ps.sharding_type in FRUGAL_TYPES
        else ps
        for name, ps in params.items()
    }


def check_features(features: KeyedJaggedTensor, served: Iterable[str], module: str) -> None:
    """Raise if the KJT lacks a feature the module's tables serve, or has a batch size per feature
    (VBE). Features no table serves are ignored, as stock TorchRec's input dist ignores them (it
    selects the features it serves)."""
    if features.variable_stride_per_key():
        raise FrugalInputError(
            f"{module}: variable batch size per feature (VBE: a KJT with stride_per_key_per_rank, batch sizes "
            f"{features.stride_per_key()} for {features.keys()}) is not supported by frugal tables; give every "
            "feature the batch's size, or shard these tables with a stock type"
        )
    served_set = set(served)
    keys = features.keys()
    missing = sorted(served_set - set(keys))
    if missing:
        raise FrugalInputError(f"{module}: the input lacks feature(s) {missing} that its tables serve")


def row_wise_ids_in_range(
    features: KeyedJaggedTensor, limits: Dict[str, Tuple[str, int, str]], log: Optional[OutOfRangeLog]
) -> KeyedJaggedTensor:
    """``features`` with each id of a frugal_row_wise feature out of range read as row 0 of its table
    (a new KJT; bounds_check_mode WARNING, IGNORE: row 0 as table_wise reads it, reported to ``log``
    unless None) or refused, raising, naming the feature, its table and the id (FATAL, NONE): done
    here, before the input dist would send the id to another node's engine. ``limits``: feature ->
    (table, rows, mode). A batch whose ids are in range costs a min and a max per feature."""
    if not limits:
        return features
    values, opk, keys = features.values(), features.offset_per_key(), features.keys()
    fixed: Optional[torch.Tensor] = None
    repairs: List[RowZero] = []
    for i, key in enumerate(keys):
        if key not in limits:
            continue
        ids = values[opk[i] : opk[i + 1]]
        table, rows, mode = limits[key]
        if not ids.numel() or (int(ids.min()) >= 0 and int(ids.max()) < rows):
            continue
        if mode not in ROW_ZERO:
            bad = int(ids[(ids < 0) | (ids >= rows)][0])
            raise FrugalInputError(
                f"feature {key!r} (table {table!r}, frugal_row_wise): id {bad} is out of range [0, {rows}); "
                "nothing was changed"
            )
        try:
            in_range, repair = row_zero(ids, rows, table, key, mode)
        except FrugalInputError as e:
            raise FrugalInputError(f"feature {key!r} (frugal_row_wise): {e}; nothing was changed") from None
        if fixed is None:
            fixed = values.clone()
        fixed[opk[i] : opk[i + 1]] = in_range.to(fixed.device, fixed.dtype)
        if repair is not None:
            repairs.append(repair)
    if fixed is None:
        return features
    if log is not None:
        log.report(repairs)
    return KeyedJaggedTensor(
        keys=keys,
        values=fixed,
        weights=features.weights_or_none(),
        lengths=features.lengths(),
        stride=features.stride(),
        length_per_key=features.length_per_key(),
        offset_per_key=opk,
        inverse_indices=features.inverse_indices_or_none(),
    )


class FrugalShardedModuleMixin:
    """What frugal tables add to a sharded embedding module: their sharding, checkpoints, lookahead.

    Host a frugal table's weights in state_dict as a row-block ShardedTensor (see
    :mod:`.checkpoint`); load them back through the engines (collective: every rank loads).
    """

    _frugal_weight_prefix: ClassVar[str]  # "embedding_bags." or "embeddings."
    _frugal_sharding_type: ClassVar[Type[FrugalEmbeddingSharding[Any]]]  # pooled or sequence
    _frugal_row_wise_sharding_type: ClassVar[Optional[Type[FrugalEmbeddingSharding[Any]]]] = None
    _frugal_features: List[str]  # every feature the module's tables serve
    _lookups: List[nn.Module]

    def _frugal_setup(
        self,
        configs: Iterable[Any],
        config: Optional[FrugalConfig],
        presample_counts: Optional[Dict[str, torch.Tensor]],
    ) -> None:
        """Fields ``create_embedding(_bag)_sharding`` reads; set before the parent's __init__ calls it."""
        configs = list(configs)
        self._frugal_config = config or FrugalConfig()
        self._frugal_presample_counts = presample_counts
        self._frugal_init_fns: Dict[str, Callable[[torch.Tensor], Any]] = {
            c.name: c.init_fn for c in configs if c.init_fn is not None
        }
        self._frugal_features = [f for c in configs for f in c.feature_names]
        self._complete_keys: Optional[List[str]] = None  # the keys of the last input found complete
        # frugal_row_wise features -> (table, rows, bounds_check_mode): checked before the input
        # dist sends their ids; the ids read as row 0 there
        self._row_wise_limits: Dict[str, Tuple[str, int, str]] = {}
        self.row_wise_out_of_range = OutOfRangeLog()

    def _create_frugal_sharding(
        self, sharding_infos: List[EmbeddingShardingInfo], env: ShardingEnv, device: Optional[torch.device]
    ) -> FrugalEmbeddingSharding[Any]:
        """The frugal (or frugal_row_wise) sharding of ``sharding_infos``; the parent's ``__init__`` asks for it."""
        kind = self._frugal_sharding_type
        if sharding_infos[0].param_sharding.sharding_type == FRUGAL_ROW_WISE:
            if self._frugal_row_wise_sharding_type is None:
                raise NotImplementedError(f"{type(self).__name__}: no {FRUGAL_ROW_WISE} sharding yet; use frugal or row_wise")
            kind = self._frugal_row_wise_sharding_type
            for info in sharding_infos:
                c = info.embedding_config
                mode = frugal_fused_params(info.fused_params or {}, c.name).bounds_check
                self._row_wise_limits.update({f: (c.name, c.num_embeddings, mode) for f in c.feature_names})
        return kind(
            sharding_infos,
            env,
            device,
            config=self._frugal_config,
            presample_counts=self._frugal_presample_counts,
            init_fns=self._frugal_init_fns,
        )

    def _initialize_torch_state(self, skip_registering: bool = False) -> None:
        if skip_registering:
            super()._initialize_torch_state(skip_registering=True)  # type: ignore[misc]
        else:  # TorchRec 1.6's ShardedEmbeddingCollection takes no argument here
            super()._initialize_torch_state()  # type: ignore[misc]
            self._register_frugal_state_hooks()

    def input_dist(self, ctx: Any, features: KeyedJaggedTensor) -> Awaitable[Awaitable[Any]]:
        keys = features.keys()
        if keys != self._complete_keys or features.variable_stride_per_key():  # a loader's batches share their keys
            check_features(features, self._frugal_features, type(self).__name__)
            self._complete_keys = list(keys)
        features = row_wise_ids_in_range(features, self._row_wise_limits, self.row_wise_out_of_range)
        return super().input_dist(ctx, features)  # type: ignore[misc]

    def _after_sharding(
        self, module_fqn: Optional[str], configs: Iterable[Any], params: Dict[str, ParameterSharding], env: ShardingEnv
    ) -> None:
        """Once the parent's __init__ has sharded the module: keep its process group (the batch
        agreement's), keep the plan report as ``frugal_plan_report`` and log it on rank 0."""
        self._frugal_pg = env.process_group
        self.frugal_plan_report = plan_report(module_fqn or "", list(configs), params, engine_caches(self.frugal_engines()))
        if env.rank == 0:
            log_plan_report(self.frugal_plan_report)

    def frugal_lookups(self) -> List[FrugalEmbeddingLookup]:
        return [lookup for lookup in self._lookups if isinstance(lookup, FrugalEmbeddingLookup)]

    def frugal_engines(self) -> List[FrugalEngine]:
        """The engines serving this module's frugal tables, one per table group: what a training
        script reads for per-step statistics (``last_metrics``, flushed rows, background threads)."""
        return [g.engine for lookup in self.frugal_lookups() for g in lookup.groups]

    def _register_frugal_state_hooks(self) -> None:
        module = self
        assert isinstance(module, nn.Module)
        module._register_state_dict_hook(_frugal_state_dict_hook)
        module._register_load_state_dict_pre_hook(_frugal_load_state_dict_pre_hook, with_module=True)

    def push_lookahead(self, features: KeyedJaggedTensor) -> None:
        """Announce the ids of a future batch of this module (in training order) to its engines.

        Raises, announcing nothing, if an id is refused (bounds_check_mode) or a feature is not served.
        """
        self.announce(self.lookahead_rows(features))

    def lookahead_rows(self, features: KeyedJaggedTensor) -> List[List[torch.Tensor]]:
        """Per frugal lookup, the engine rows of a batch's ``features`` (validated, nothing changed)."""
        check_features(features, self._frugal_features, type(self).__name__)
        # frugal_row_wise: as its step's input dist will (which reuses what this sent, and reports)
        features = row_wise_ids_in_range(features, self._row_wise_limits, None)
        keys = features.keys()
        return [
            # A permute copies every id: skip it when the lookup takes the features as they come.
            lookup.lookahead_rows(
                features if keys == lookup.feature_names else features.permute([keys.index(f) for f in lookup.feature_names])
            )
            for lookup in self.frugal_lookups()
        ]

    def announce(self, rows: List[List[torch.Tensor]]) -> None:
        """Push rows from ``lookahead_rows`` to the engines' lookahead windows."""
        for lookup, r in zip(self.frugal_lookups(), rows):
            lookup.announce(r)

    def check_batch(self, features: KeyedJaggedTensor) -> None:
        """Raise, changing nothing, if a future batch's ``features`` would be refused at its step
        (a missing feature, VBE, an id its bounds_check_mode refuses): the check of a batch that is
        not planned (frugal_row_wise's ids are checked before they cross nodes, the others' as
        fused rows). Ids read as row 0 are reported when the batch is looked up, not here."""
        check_features(features, self._frugal_features, type(self).__name__)
        row_wise_ids_in_range(features, self._row_wise_limits, None)
        keys = features.keys()
        for lookup in self.frugal_lookups():
            if lookup.plans_anywhere:
                names = lookup.feature_names
                lookup.fused_ids(features if keys == names else features.permute([keys.index(f) for f in names]), log=False)

    # ------------------------------------------------------------------ batches planned ahead
    def plans_anywhere(self) -> bool:
        """Whether :meth:`plan_batch` may run on a planner thread (no lookup announces through a collective)."""
        return all(lookup.plans_anywhere for lookup in self.frugal_lookups())

    def plan_batch(self, features: KeyedJaggedTensor) -> List[BatchPlan]:
        """Per frugal lookup, the plan of a future batch's forward (see ``FrugalEmbeddingLookup.plan``);
        ``features`` must not change afterwards (a snapshot). Raises, changing nothing, on bad input."""
        check_features(features, self._frugal_features, type(self).__name__)
        keys = features.keys()
        return [
            lookup.plan(
                features if keys == lookup.feature_names else features.permute([keys.index(f) for f in lookup.feature_names])
            )
            for lookup in self.frugal_lookups()
        ]

    def announce_plans(self, plans: List[BatchPlan]) -> None:
        """Push a planned batch (from ``plan_batch``) to the engines' lookahead windows."""
        for lookup, plan in zip(self.frugal_lookups(), plans):
            lookup.announce_plan(plan)

    def use_plans(self, plans: Optional[List[BatchPlan]]) -> None:
        """The module's next forward is of the batch ``plans`` were made of; None: no plan."""
        for i, lookup in enumerate(self.frugal_lookups()):
            lookup.use_plan(None if plans is None else plans[i])

    def lookahead_capacity(self) -> int:
        """How many future batches the engines take now (the module must have frugal tables)."""
        return min(lookup.lookahead_capacity() for lookup in self.frugal_lookups())

    def agreement_group(self) -> Tuple[Optional[dist.ProcessGroup], FrugalConfig]:
        """The process group whose ranks train this module together, and its configuration (how long
        one rank waits for another, where shared memory lives)."""
        return self._frugal_pg, self._frugal_config

    def lookahead(self) -> int:
        """The engines' lookahead window L (the module must have frugal tables)."""
        return min(lookup.lookahead() for lookup in self.frugal_lookups())


def _frugal_state_dict_hook(
    module: FrugalShardedModuleMixin, destination: Dict[str, Any], prefix: str, _local_metadata: Any
) -> None:
    for lookup in module.frugal_lookups():
        for g in lookup.groups:
            g.ensure_flushed()
            for t in g.tables:
                first, size = g.own_block(t.name)
                weights, _ = g.block(t.name, first - t.row_offset, size)
                key = f"{prefix}{module._frugal_weight_prefix}{t.name}.weight"
                destination[key] = rows_sharded_tensor(weights, t.table_rows, g.checkpoint_pg, g.checkpoint_blocks(t.name))


def _frugal_load_state_dict_pre_hook(
    module: FrugalShardedModuleMixin, state_dict: Dict[str, Any], prefix: str, *args: Any
) -> None:
    for lookup in module.frugal_lookups():
        for g in lookup.groups:
            parts = []
            for t in g.tables:
                key = f"{prefix}{module._frugal_weight_prefix}{t.name}.weight"
                if key not in state_dict:
                    continue
                value = state_dict[key]
                if isinstance(value, torch.Tensor) and tuple(value.shape) != (t.table_rows, t.embedding_dim):
                    raise ValueError(
                        f"{key}: expected the whole table {(t.table_rows, t.embedding_dim)}, got {tuple(value.shape)}"
                    )
                for first, rows in held_rows(value, key, g.checkpoint_pg, g.checkpoint_blocks(t.name)):
                    parts.append((t.name, g.engine_ids(t.name, first, rows.shape[0], key), rows, None))
                state_dict[key] = torch.empty(0)  # what the placeholder parameter loads
            g.write(parts)
