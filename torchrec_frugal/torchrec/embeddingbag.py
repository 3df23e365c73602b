"""Sharder and sharded module for EmbeddingBagCollection with the "frugal" sharding type.

``FrugalEmbeddingBagCollectionSharder`` is a drop-in for TorchRec's
``EmbeddingBagCollectionSharder``: tables planned as ``"frugal"`` are served by Frugal engines,
every other table goes to TorchRec's own sharding (row_wise, table_row_wise and grid_shard
included on CPU), so one plan can mix both. The sharded module returns what TorchRec's
``ShardedEmbeddingBagCollection`` returns.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Type

import torch
from torchrec.distributed.embedding_sharding import EmbeddingSharding, EmbeddingShardingContext, EmbeddingShardingInfo
from torchrec.distributed.embeddingbag import (
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
)
from torchrec.distributed.types import (
    ParameterSharding,
    QuantizedCommCodecs,
    ShardingEnv,
    ShardingType,
)
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..config import FrugalConfig
from .embedding_types import FrugalShardedModuleMixin, FrugalSharderMixin, customized_kernel_for_frugal
from .sharding.frugal_row_wise_sharding import FrugalRowWisePooledEmbeddingSharding
from .sharding.frugal_sharding import FrugalPooledEmbeddingSharding
from .types import FRUGAL_TYPES

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


class FrugalShardedEmbeddingBagCollection(FrugalShardedModuleMixin, ShardedEmbeddingBagCollection):
    """ShardedEmbeddingBagCollection whose "frugal" tables are served by Frugal engines."""

    _frugal_weight_prefix = "embedding_bags."
    _frugal_sharding_type = FrugalPooledEmbeddingSharding
    _frugal_row_wise_sharding_type = FrugalRowWisePooledEmbeddingSharding

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
        self._after_sharding(module_fqn, module.embedding_bag_configs(), table_name_to_parameter_sharding, env)

    def create_embedding_bag_sharding(  # type: ignore[override]
        self,
        sharding_infos: List[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        permute_embeddings: bool = False,
        qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
    ) -> EmbeddingSharding[EmbeddingShardingContext, KeyedJaggedTensor, torch.Tensor, torch.Tensor]:
        if sharding_infos[0].param_sharding.sharding_type in FRUGAL_TYPES:
            return self._create_frugal_sharding(sharding_infos, env, device)
        return super().create_embedding_bag_sharding(
            sharding_infos,
            env,
            device,
            permute_embeddings=permute_embeddings,
            qcomm_codecs_registry=qcomm_codecs_registry,
        )


class FrugalEmbeddingBagCollectionSharder(FrugalSharderMixin, EmbeddingBagCollectionSharder):
    """EmbeddingBagCollectionSharder that also offers the ``"frugal"`` sharding type.

    Args:
        fused_params: as for TorchRec's fused kernels, e.g.
            ``{"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}``; they
            configure frugal and stock tables alike.
        config: the Frugal mechanism's knobs (lookahead, cache ratio, flushers, queue, timeout).
        presample_counts: optional per-table id counts of a pre-sample of this rank's data, from
            which the hottest rows are picked for the static caches.
    """

    _stock_sharding_types = STOCK_SHARDING_TYPES

    def __init__(
        self,
        fused_params: Optional[Dict[str, Any]] = None,
        config: Optional[FrugalConfig] = None,
        qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
        presample_counts: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        super().__init__(fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry)
        self._set_frugal(config, presample_counts)

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
            **self._frugal_kwargs(),
        )

    @property
    def sharded_module_type(self) -> Type[FrugalShardedEmbeddingBagCollection]:
        return FrugalShardedEmbeddingBagCollection
