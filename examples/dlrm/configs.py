"""The paper's DLRM configurations: the catalogue of :mod:`torchrec_frugal.datasets`, re-exported,
beside the engine's defaults (:mod:`torchrec_frugal.config`).

The datasets, models and run knobs live in the package so that the cost model's command line
(``python -m torchrec_frugal.estimate``) has them without this repository's ``examples/``; the DLRM
example and its tests keep importing them from here.
"""
from torchrec_frugal.config import CACHE_RATIO, LOOKAHEAD
from torchrec_frugal.datasets import (
    AVAZU,
    AVAZU_FIELDS,
    BATCH_SIZES,
    CACHE_RATIOS,
    CRITEO_CAT_NAMES,
    CRITEO_KAGGLE,
    CRITEO_TB_FULL,
    CRITEO_TB_MLPERF_40M,
    CRITEO_TB_TORCHREC_DLRM,
    DATASETS,
    EMBEDDING_DIM,
    DatasetConfig,
    ModelConfig,
    RunConfig,
    SkewConfig,
    describe,
    get_config,
)

__all__ = [
    "AVAZU",
    "AVAZU_FIELDS",
    "BATCH_SIZES",
    "CACHE_RATIO",
    "CACHE_RATIOS",
    "CRITEO_CAT_NAMES",
    "CRITEO_KAGGLE",
    "CRITEO_TB_FULL",
    "CRITEO_TB_MLPERF_40M",
    "CRITEO_TB_TORCHREC_DLRM",
    "DATASETS",
    "EMBEDDING_DIM",
    "LOOKAHEAD",
    "DatasetConfig",
    "ModelConfig",
    "RunConfig",
    "SkewConfig",
    "describe",
    "get_config",
]
