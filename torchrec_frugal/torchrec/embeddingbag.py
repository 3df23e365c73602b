"""Sharder and sharded module for EmbeddingBagCollection with the "frugal" sharding type.

``FrugalEmbeddingBagCollectionSharder`` is a drop-in for TorchRec's
``EmbeddingBagCollectionSharder``: tables planned as ``"frugal"`` are served by Frugal engines,
every other table goes to TorchRec's own sharding (row_wise, table_row_wise and grid_shard
included on CPU), so one plan can mix both. The sharded module returns what TorchRec's
``ShardedEmbeddingBagCollection`` returns.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Type

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_sharding import EmbeddingSharding, EmbeddingShardingContext, EmbeddingShardingInfo
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import (
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
)
from torchrec.distributed.types import (
    Awaitable,
    ParameterSharding,
    QuantizedCommCodecs,
    ShardingEnv,
    ShardingType,
)
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..config import FrugalConfig
from ..errors import FrugalInputError
from ..engine import FrugalEngine
from .checkpoint import held_rows, row_blocks, rows_sharded_tensor
from .sharding import FRUGAL, FrugalEmbeddingLookup, FrugalPooledEmbeddingSharding

# Every TorchRec sharding type; TorchRec's sharder offers the row-wise ones on CUDA only, but
# they train on CPU too (gloo), which a plan mixing frugal and stock tables may want.
STOCK_SHARDING_TYPES: List[str] = [
    ShardingType.DATA_PARALLEL.value,
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.GRID_SHARD.value,
]


def customized_kernel_for_frugal(params: Dict[str, ParameterSharding]) -> Dict[str, ParameterSharding]:
    """Frugal tables run TorchRec's CUSTOMIZED_KERNEL path: the sharded module owns their state."""
    return {
        name: replace(ps, compute_kernel=EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value)
        if ps.sharding_type == FRUGAL
        else ps
        for name, ps in params.items()
    }


def check_features(features: KeyedJaggedTensor, served: Iterable[str], module: str) -> None:
    """Raise if the KJT carries a feature no table of the module serves, or lacks one it needs."""
    served_set = set(served)
    keys = features.keys()
    extra = [k for k in keys if k not in served_set]
    if extra:
        raise FrugalInputError(
            f"{module}: no table serves feature(s) {extra}; served features are {sorted(served_set)}"
        )
    missing = sorted(served_set - set(keys))
    if missing:
        raise FrugalInputError(f"{module}: the input lacks feature(s) {missing} that its tables serve")


class FrugalShardedModuleMixin:
    """What frugal tables add to a sharded embedding module: checkpoints and the lookahead.

    Host a frugal table's weights in state_dict as a row-block ShardedTensor (see
    :mod:`.checkpoint`); load them back through the engines (collective: every rank loads).
    """

    _frugal_weight_prefix: str  # "embedding_bags." or "embeddings."
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

    def _initialize_torch_state(self, skip_registering: bool = False) -> None:
        if skip_registering:
            super()._initialize_torch_state(skip_registering=True)  # type: ignore[misc]
        else:  # TorchRec 1.6's ShardedEmbeddingCollection takes no argument here
            super()._initialize_torch_state()  # type: ignore[misc]
            self._register_frugal_state_hooks()

    def input_dist(self, ctx: Any, features: KeyedJaggedTensor) -> Awaitable[Awaitable[Any]]:
        check_features(features, self._frugal_features, type(self).__name__)
        return super().input_dist(ctx, features)  # type: ignore[misc]

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

        Raises, announcing nothing, if an id is out of range or a feature is not served.
        """
        self.announce(self.lookahead_rows(features))

    def lookahead_rows(self, features: KeyedJaggedTensor) -> List[List[torch.Tensor]]:
        """Per frugal lookup, the engine rows of a batch's ``features`` (validated, nothing changed)."""
        check_features(features, self._frugal_features, type(self).__name__)
        keys = features.keys()
        return [
            lookup.lookahead_rows(features.permute([keys.index(f) for f in lookup.feature_names]))
            for lookup in self.frugal_lookups()
        ]

    def announce(self, rows: List[List[torch.Tensor]]) -> None:
        """Push rows from ``lookahead_rows`` to the engines' lookahead windows."""
        for lookup, r in zip(self.frugal_lookups(), rows):
            lookup.announce(r)

    def lookahead_capacity(self) -> int:
        """How many future batches the engines take now (the module must have frugal tables)."""
        return min(lookup.lookahead_capacity() for lookup in self.frugal_lookups())

    def lookahead(self) -> int:
        """The engines' lookahead window L (the module must have frugal tables)."""
        return min(lookup.lookahead() for lookup in self.frugal_lookups())


def _frugal_state_dict_hook(
    module: FrugalShardedModuleMixin, destination: Dict[str, Any], prefix: str, _local_metadata: Any
) -> None:
    for lookup in module.frugal_lookups():
        for g in lookup.groups:
            g.ensure_flushed()
            world, rank = dist.get_world_size(g.pg), dist.get_rank(g.pg)
            for t in g.tables:
                off, size = row_blocks(t.num_embeddings, world)[rank]
                weights, _ = g.block(t.name, off, size)
                key = f"{prefix}{module._frugal_weight_prefix}{t.name}.weight"
                destination[key] = rows_sharded_tensor(weights, t.num_embeddings, g.pg)


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
                if isinstance(value, torch.Tensor) and tuple(value.shape) != (t.num_embeddings, t.embedding_dim):
                    raise ValueError(
                        f"{key}: expected the whole table {(t.num_embeddings, t.embedding_dim)}, got {tuple(value.shape)}"
                    )
                for first, rows in held_rows(value, key, g.pg):
                    parts.append((t.name, torch.arange(first, first + rows.shape[0]), rows, None))
                state_dict[key] = torch.empty(0)  # what the placeholder parameter loads
            g.write(parts)


class FrugalShardedEmbeddingBagCollection(FrugalShardedModuleMixin, ShardedEmbeddingBagCollection):
    """ShardedEmbeddingBagCollection whose "frugal" tables are served by Frugal engines."""

    _frugal_weight_prefix = "embedding_bags."

    def __init__(
        self,
        module: EmbeddingBagCollection,
        table_name_to_parameter_sharding: Dict[str, ParameterSharding],
        env: ShardingEnv,
        fused_params: Optional[Dict[str, Any]] = None,
        device: Optional[torch.device] = None,
        qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
        module_fqn: Optional[str] = None,
        sharded_module_order_overwrite: Optional[List[str]] = None,
        config: Optional[FrugalConfig] = None,
        presample_counts: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        # Read by create_embedding_bag_sharding, which the parent's __init__ calls.
        self._frugal_setup(module.embedding_bag_configs(), config, presample_counts)
        super().__init__(
            module=module,
            table_name_to_parameter_sharding=customized_kernel_for_frugal(table_name_to_parameter_sharding),
            env=env,
            fused_params=fused_params,
            device=device,
            qcomm_codecs_registry=qcomm_codecs_registry,
            module_fqn=module_fqn,
            sharded_module_order_overwrite=sharded_module_order_overwrite,
        )

    def create_embedding_bag_sharding(  # type: ignore[override]
        self,
        sharding_infos: List[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        permute_embeddings: bool = False,
        qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
    ) -> EmbeddingSharding[EmbeddingShardingContext, KeyedJaggedTensor, torch.Tensor, torch.Tensor]:
        if sharding_infos[0].param_sharding.sharding_type == FRUGAL:
            return FrugalPooledEmbeddingSharding(
                sharding_infos,
                env,
                device,
                config=self._frugal_config,
                presample_counts=self._frugal_presample_counts,
                init_fns=self._frugal_init_fns,
            )
        return super().create_embedding_bag_sharding(
            sharding_infos,
            env,
            device,
            permute_embeddings=permute_embeddings,
            qcomm_codecs_registry=qcomm_codecs_registry,
        )


class FrugalEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """EmbeddingBagCollectionSharder that also offers the ``"frugal"`` sharding type.

    Args:
        fused_params: as for TorchRec's fused kernels, e.g.
            ``{"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}``; they
            configure frugal and stock tables alike.
        config: the Frugal mechanism's knobs (lookahead, cache ratio, flushers, queue, timeout).
        presample_counts: optional per-table id counts of a pre-sample of this rank's data, from
            which the hottest rows are picked for the static caches.
    """

    def __init__(
        self,
        fused_params: Optional[Dict[str, Any]] = None,
        config: Optional[FrugalConfig] = None,
        qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
        presample_counts: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        super().__init__(fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry)
        self._config = config or FrugalConfig()
        self._presample_counts = presample_counts

    @property
    def config(self) -> FrugalConfig:
        return self._config

    def shard(
        self,
        module: EmbeddingBagCollection,
        params: Dict[str, ParameterSharding],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        module_fqn: Optional[str] = None,
    ) -> FrugalShardedEmbeddingBagCollection:
        return FrugalShardedEmbeddingBagCollection(
            module=module,
            table_name_to_parameter_sharding=params,
            env=env,
            fused_params=self.fused_params,
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            module_fqn=module_fqn,
            sharded_module_order_overwrite=self._sharded_module_order_overwrite,
            config=self._config,
            presample_counts=self._presample_counts,
        )

    @property
    def sharded_module_type(self) -> Type[FrugalShardedEmbeddingBagCollection]:
        return FrugalShardedEmbeddingBagCollection

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return [FRUGAL] + STOCK_SHARDING_TYPES

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        if sharding_type == FRUGAL:
            return [EmbeddingComputeKernel.FUSED.value]
        return super().compute_kernels(sharding_type, compute_device_type)
