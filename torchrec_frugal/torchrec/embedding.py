"""Sharder and sharded module for EmbeddingCollection (sequence embeddings) with "frugal" tables.

The EmbeddingCollection counterpart of :mod:`.embeddingbag`: frugal tables return one embedding
per id, read through the engines; the other tables go to TorchRec's own sharding.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Type

import torch
from torchrec.distributed.embedding import (
    EmbeddingCollectionSharder,
    ShardedEmbeddingCollection,
)
from torchrec.distributed.embedding_sharding import EmbeddingSharding, EmbeddingShardingInfo
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext
from torchrec.distributed.types import (
    ParameterSharding,
    QuantizedCommCodecs,
    ShardingEnv,
    ShardingType,
)
from torchrec.modules.embedding_modules import EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..config import FrugalConfig
from .embedding_types import FrugalShardedModuleMixin, FrugalSharderMixin, customized_kernel_for_frugal
from .sharding.frugal_row_wise_sharding import FrugalRowWiseSequenceEmbeddingSharding
from .sharding.frugal_sharding import FrugalSequenceEmbeddingSharding
from .types import FRUGAL_TYPES

# TorchRec's EmbeddingCollectionSharder offers these on every device.
STOCK_SEQUENCE_SHARDING_TYPES: List[str] = [
    ShardingType.DATA_PARALLEL.value,
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.ROW_WISE.value,
]


class FrugalShardedEmbeddingCollection(FrugalShardedModuleMixin, ShardedEmbeddingCollection):
    """ShardedEmbeddingCollection whose "frugal" tables are served by Frugal engines."""

    _frugal_weight_prefix = "embeddings."
    _frugal_sharding_type = FrugalSequenceEmbeddingSharding
    _frugal_row_wise_sharding_type = FrugalRowWiseSequenceEmbeddingSharding

    def __init__(
        self,
        module: EmbeddingCollection,
        table_name_to_parameter_sharding: Dict[str, ParameterSharding],
        env: ShardingEnv,
        fused_params: Optional[Dict[str, Any]] = None,
        device: Optional[torch.device] = None,
        qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
        use_index_dedup: bool = False,
        module_fqn: Optional[str] = None,
        config: Optional[FrugalConfig] = None,
        presample_counts: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        # Read by create_embedding_sharding, which the parent's __init__ calls.
        self._frugal_setup(module.embedding_configs(), config, presample_counts)
        super().__init__(
            module,
            customized_kernel_for_frugal(table_name_to_parameter_sharding),
            env,
            fused_params,
            device,
            qcomm_codecs_registry=qcomm_codecs_registry,
            use_index_dedup=use_index_dedup,
            module_fqn=module_fqn,
        )
        self._after_sharding(module_fqn, module.embedding_configs(), table_name_to_parameter_sharding, env)

    def create_embedding_sharding(  # type: ignore[override]
        self,
        sharding_type: str,
        sharding_infos: List[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
    ) -> EmbeddingSharding[SequenceShardingContext, KeyedJaggedTensor, torch.Tensor, torch.Tensor]:
        if sharding_type in FRUGAL_TYPES:
            return self._create_frugal_sharding(sharding_infos, env, device)
        return super().create_embedding_sharding(
            sharding_type=sharding_type,
            sharding_infos=sharding_infos,
            env=env,
            device=device,
            qcomm_codecs_registry=qcomm_codecs_registry,
        )


class FrugalEmbeddingCollectionSharder(FrugalSharderMixin, EmbeddingCollectionSharder):
    """EmbeddingCollectionSharder that also offers the ``"frugal"`` sharding type.

    Arguments as for :class:`~torchrec_frugal.torchrec.FrugalEmbeddingBagCollectionSharder`, plus
    TorchRec's ``use_index_dedup``.
    """

    _stock_sharding_types = STOCK_SEQUENCE_SHARDING_TYPES

    def __init__(
        self,
        fused_params: Optional[Dict[str, Any]] = None,
        config: Optional[FrugalConfig] = None,
        qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
        use_index_dedup: bool = False,
        presample_counts: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        super().__init__(fused_params, qcomm_codecs_registry, use_index_dedup)
        self._set_frugal(config, presample_counts)

    def shard(
        self,
        module: EmbeddingCollection,
        params: Dict[str, ParameterSharding],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        module_fqn: Optional[str] = None,
    ) -> FrugalShardedEmbeddingCollection:
        return FrugalShardedEmbeddingCollection(
            module,
            params,
            env,
            self.fused_params,
            device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            use_index_dedup=self._use_index_dedup,
            module_fqn=module_fqn,
            **self._frugal_kwargs(),
        )

    @property
    def sharded_module_type(self) -> Type[FrugalShardedEmbeddingCollection]:
        return FrugalShardedEmbeddingCollection
