"""TorchRec integration of Frugal: the "frugal" sharding type, sharders, planner, pipeline.

Importing this package installs the small planner shims of :mod:`.patches`, so that TorchRec's
own planner also understands the "frugal" sharding type.
"""
from .. import required_packages

required_packages.require("torch", "fbgemm_gpu", "torchrec")  # what to install first, if one is missing

from . import patches  # noqa: E402
from .embedding import FrugalEmbeddingCollectionSharder, FrugalShardedEmbeddingCollection
from .embeddingbag import FrugalEmbeddingBagCollectionSharder, FrugalShardedEmbeddingBagCollection
from .fp_embeddingbag import FrugalFeatureProcessedEmbeddingBagCollectionSharder
from .train_pipeline.train_pipelines import FrugalTrainPipeline
from .planner.planners import FrugalShardingPlanner, frugal, frugal_row_wise
from .planner.stats import FrugalCostStats
from .types import FRUGAL, FRUGAL_ROW_WISE
from .planner.topology import CONSUMER_GPUS, consumer_pcie_topology

patches.apply()

__all__ = [
    "CONSUMER_GPUS",
    "FRUGAL",
    "FRUGAL_ROW_WISE",
    "FrugalCostStats",
    "FrugalEmbeddingBagCollectionSharder",
    "FrugalEmbeddingCollectionSharder",
    "FrugalFeatureProcessedEmbeddingBagCollectionSharder",
    "FrugalShardedEmbeddingBagCollection",
    "FrugalShardedEmbeddingCollection",
    "FrugalShardingPlanner",
    "FrugalTrainPipeline",
    "consumer_pcie_topology",
    "frugal",
    "frugal_row_wise",
]
