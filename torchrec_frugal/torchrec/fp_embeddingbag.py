"""Sharder for FeatureProcessedEmbeddingBagCollection with the "frugal" sharding type.

TorchRec shards a feature-processed collection (e.g. position-weighted features) by sharding its
inner EmbeddingBagCollection with the sharder it wraps and applying the feature processors to
each batch after the input dist. ``FrugalFeatureProcessedEmbeddingBagCollectionSharder`` wraps a
:class:`FrugalEmbeddingBagCollectionSharder` and offers "frugal" among its types, so that a
planner can put the inner tables on Frugal engines; the sharded module is TorchRec's own.
"frugal_row_wise" is not offered: TorchRec's feature processors see a row-sharded batch only
after preprocessing it for its stock row-wise types.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from torchrec.distributed.types import QuantizedCommCodecs

from ..config import FrugalConfig
from .embeddingbag import FrugalEmbeddingBagCollectionSharder
from .types import FRUGAL, FRUGAL_TYPES


class FrugalFeatureProcessedEmbeddingBagCollectionSharder(FeatureProcessedEmbeddingBagCollectionSharder):
    """FeatureProcessedEmbeddingBagCollectionSharder whose inner tables may be planned "frugal".

    Args:
        ebc_sharder: the sharder of the inner collection (default: a FrugalEmbeddingBagCollectionSharder
            with the default FrugalConfig); its fused_params and config serve the frugal tables.
        qcomm_codecs_registry: as for TorchRec's sharder.
    """

    def __init__(
        self,
        ebc_sharder: Optional[FrugalEmbeddingBagCollectionSharder] = None,
        qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
    ) -> None:
        inner = ebc_sharder or FrugalEmbeddingBagCollectionSharder(qcomm_codecs_registry=qcomm_codecs_registry)
        super().__init__(ebc_sharder=inner, qcomm_codecs_registry=qcomm_codecs_registry)
        self._frugal_ebc_sharder = inner

    @property
    def config(self) -> FrugalConfig:
        """The inner sharder's FrugalConfig (the planner sets its chosen lookahead there)."""
        return self._frugal_ebc_sharder.config

    def sharding_types(self, compute_device_type: str) -> List[str]:
        stock = super().sharding_types(compute_device_type)
        return [FRUGAL] + [t for t in self._frugal_ebc_sharder.sharding_types(compute_device_type) if t in stock]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        if sharding_type in FRUGAL_TYPES:
            return self._frugal_ebc_sharder.compute_kernels(sharding_type, compute_device_type)
        return super().compute_kernels(sharding_type, compute_device_type)
