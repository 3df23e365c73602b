"""Sharder for FeatureProcessedEmbeddingBagCollection with the "frugal" sharding type.

TorchRec shards a feature-processed collection (e.g. position-weighted features) by sharding its
inner EmbeddingBagCollection with the sharder it wraps and applying the feature processors to
each batch after the input dist. TorchRec's own ``FeatureProcessedEmbeddingBagCollectionSharder``
wrapping a :class:`FrugalEmbeddingBagCollectionSharder` offers "frugal" (a shim of
:mod:`.patches`); ``FrugalFeatureProcessedEmbeddingBagCollectionSharder`` is that pair with a
frugal inner sharder by default. The sharded module is TorchRec's own. "frugal_row_wise" is not
offered: TorchRec's feature processors see a row-sharded batch only after preprocessing it for
its stock row-wise types.
"""
from __future__ import annotations

from typing import Dict, Optional

from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from torchrec.distributed.types import QuantizedCommCodecs

from ..config import FrugalConfig
from .embeddingbag import FrugalEmbeddingBagCollectionSharder


class FrugalFeatureProcessedEmbeddingBagCollectionSharder(FeatureProcessedEmbeddingBagCollectionSharder):
    """FeatureProcessedEmbeddingBagCollectionSharder whose inner tables are planned "frugal".

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
        """The inner sharder's FrugalConfig."""
        return self._frugal_ebc_sharder.config

    def with_config(self, config: FrugalConfig) -> "FrugalFeatureProcessedEmbeddingBagCollectionSharder":
        """This sharder around a copy of the inner one holding ``config`` (this one left as it is)."""
        inner = self._frugal_ebc_sharder.with_config(config)
        return FrugalFeatureProcessedEmbeddingBagCollectionSharder(inner, self.qcomm_codecs_registry)  # type: ignore[arg-type]
