"""The paper's DLRM configurations (Frugal, ASPLOS 2025, section on embedding models), scaled to fit.

The catalogue lives in the package (free of TorchRec and of the repository's ``examples/``) so that
``python -m torchrec_frugal.estimate`` works from an installed wheel; ``examples/dlrm/configs.py``
re-exports it for the DLRM example.

Three datasets with their real per-field cardinalities, two models, and the knobs the paper swept
(per-rank batch 128 / 1024, cache ratio 1 / 5 / 10 %, lookahead L = 10).

Sources of the cardinalities:

* ``criteo-kaggle``: 26 tables, 33,762,577 rows; ``uw-mad-dash/bagpipe/kaggle_criteo_info`` (also in
  DESIGN.md). Exactly the list Frugal's prior art (Bagpipe) used.
* ``avazu``: 22 fields (every column but ``id`` and ``click``: ``hour`` plus 21 categorical columns),
  9,449,445 rows; per-column unique counts of the 40,428,967-row training file from public analysis
  scripts (two independent ones agree). The paper only says "Avazu, 9.45M rows"; which 22 fields it
  used is inferred (the 22 here sum to exactly that). Avazu has no numeric columns, so ``num_dense``
  is 0; the data generator then emits one constant dense column (see ``DatasetConfig.dense_width``).
* ``criteo-tb``: 26 tables of the full, uncapped Criteo 1TB click logs, 882,774,559 rows, from
  ``facebookresearch/dlrm`` ``torchrec_dlrm/README.MD`` at revision 3d2148a ("full-size" run). The
  paper does not say whether it capped tables; two other published lists are kept as constants for
  users whose preprocessed files use them: the MLPerf 40M cap (:data:`CRITEO_TB_MLPERF_40M`) and the
  list of the current torchrec_dlrm README (:data:`CRITEO_TB_TORCHREC_DLRM`, frequency-thresholded).

The paper's own DLRM benchmark (the authors' ``perf_rec_model.py`` and ``rec_dataloader.py``) is a
different, embedding-dominated workload: :data:`PAPER_DATASETS` holds it, one table over one ID space
per dataset of the authors' capacity (``RecDatasetCapacity``: avazu 9,449,206 rows, criteo 33,762,578,
criteoTB 73,391,341), 21 or 26 ids a sample from that one table, sum-pooled, no dense features; the
model is ``ModelConfig(kind="paper")``. ``get_config(name, model=ModelConfig(kind="paper"))`` picks it.

Scaling: ``rows(scale)`` multiplies every cardinality by ``scale`` (rounded up) but never takes a
table below ``min(cardinality, min_rows)``: small categorical fields (day of week, device type...)
keep their true size, which costs nothing, and the large ones, which hold the bytes, shrink.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

from .config import CACHE_RATIO, LOOKAHEAD  # RunConfig's defaults: the engine's

CRITEO_KAGGLE: Tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip

CRITEO_TB_FULL: Tuple[int, ...] = (
    227605432, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 130229467, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 292775614, 40790948, 187188510, 590152, 12973, 108, 36,
)  # fmt: skip

CRITEO_TB_MLPERF_40M: Tuple[int, ...] = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
"""MLPerf DLRM's 40M-row cap of Criteo 1TB (204,184,588 rows; torchrec_dlrm README @3d2148a, MLPerf v2)."""

CRITEO_TB_TORCHREC_DLRM: Tuple[int, ...] = (
    45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10,
    2209, 11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35,
)  # fmt: skip
"""``--num_embeddings_per_feature`` of facebookresearch/dlrm torchrec_dlrm README @045094c (177,944,275 rows)."""

AVAZU_FIELDS: Tuple[str, ...] = (
    "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id", "app_domain",
    "app_category", "device_id", "device_ip", "device_model", "device_type", "device_conn_type",
    "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21",
)  # fmt: skip
AVAZU: Tuple[int, ...] = (
    240, 7, 7, 4737, 7745, 26, 8552, 559, 36, 2686408, 6729486, 8251, 5, 4,
    2626, 8, 9, 435, 4, 68, 172, 60,
)  # fmt: skip

# torchrec.datasets.criteo.DEFAULT_CAT_NAMES, without importing torchrec here.
CRITEO_CAT_NAMES: Tuple[str, ...] = tuple(f"cat_{i}" for i in range(26))

BATCH_SIZES: Tuple[int, ...] = (128, 1024)
"""Per-rank batch sizes of the paper's DLRM runs."""
CACHE_RATIOS: Tuple[float, ...] = (0.01, 0.05, 0.1)
"""Fraction of each table's rows that each rank caches on its device (the paper's sweep)."""
EMBEDDING_DIM = 32


@dataclass(frozen=True)
class DatasetConfig:
    """One dataset's shape: categorical fields with their cardinalities, numeric feature count."""

    name: str
    feature_names: Tuple[str, ...]
    cardinalities: Tuple[int, ...]
    num_dense: int
    default_scale: float
    source: str
    ids_per_sample: int = 1  # ids of each feature in one sample (Criteo's fields: 1; the paper's one table: 21 or 26)

    def __post_init__(self) -> None:
        if len(self.feature_names) != len(self.cardinalities):
            raise ValueError(f"{self.name}: {len(self.feature_names)} names, {len(self.cardinalities)} cardinalities")
        if self.ids_per_sample < 1:
            raise ValueError(f"{self.name}: ids_per_sample must be >= 1, got {self.ids_per_sample}")

    @property
    def num_sparse(self) -> int:
        return len(self.cardinalities)

    @property
    def total_rows(self) -> int:
        return sum(self.cardinalities)

    @property
    def dense_width(self) -> int:
        """Columns of ``Batch.dense_features``: ``num_dense``, or 1 (a constant) if the data has none."""
        return max(1, self.num_dense)

    def rows(self, scale: Optional[float] = None, min_rows: int = 1000) -> List[int]:
        """Row counts at ``scale`` (default: ``default_scale``), each at least ``min(card, min_rows)``."""
        s = self.default_scale if scale is None else scale
        if not 0.0 < s <= 1.0:
            raise ValueError(f"scale must be in (0, 1], got {s}")
        return [min(c, max(min(c, min_rows), math.ceil(c * s))) for c in self.cardinalities]

    def table_names(self) -> List[str]:
        return [f"t_{f}" for f in self.feature_names]

    def table_bytes(self, scale: Optional[float] = None, dim: int = EMBEDDING_DIM) -> int:
        """FP32 bytes of one copy of every table at ``scale`` (no optimizer state)."""
        return sum(self.rows(scale)) * dim * 4


DATASETS: Dict[str, DatasetConfig] = {
    "criteo-kaggle": DatasetConfig(
        name="criteo-kaggle",
        feature_names=CRITEO_CAT_NAMES,
        cardinalities=CRITEO_KAGGLE,
        num_dense=13,
        default_scale=0.1,  # 3.38M rows, 0.40 GiB at dim 32
        source="uw-mad-dash/bagpipe kaggle_criteo_info (DESIGN.md; anchors.md section 3.2)",
    ),
    "avazu": DatasetConfig(
        name="avazu",
        feature_names=AVAZU_FIELDS,
        cardinalities=AVAZU,
        num_dense=0,
        default_scale=0.25,  # 2.36M rows, 0.28 GiB at dim 32
        source="per-column unique counts of Avazu train (anchors.md section 3.3); field choice inferred",
    ),
    "criteo-tb": DatasetConfig(
        name="criteo-tb",
        feature_names=CRITEO_CAT_NAMES,
        cardinalities=CRITEO_TB_FULL,
        num_dense=13,
        default_scale=0.004,  # 3.54M rows, 0.42 GiB at dim 32
        source="facebookresearch/dlrm torchrec_dlrm README @3d2148a, full-size Criteo 1TB (anchors.md section 3.1)",
    ),
}


PAPER_CAPACITIES: Dict[str, int] = {"avazu": 9_449_206, "criteo-kaggle": 33_762_578, "criteo-tb": 73_391_341}
"""Rows of the authors' one table per dataset (``RecDatasetCapacity`` in their ``rec_dataloader.py``)."""
PAPER_IDS_PER_SAMPLE: Dict[str, int] = {"avazu": 21, "criteo-kaggle": 26, "criteo-tb": 26}
"""Ids per sample of the authors' benchmark (``nr_ids_one_sample`` in their ``perf_rec_model.py``)."""
PAPER_FEATURE = "ids"

EPOCH_SAMPLES: Dict[str, int] = {
    "avazu": 40_428_967,  # Avazu CTR's training file (Kaggle), the rows whose columns AVAZU counts
    "criteo-kaggle": 45_840_617,  # Criteo Display Advertising Challenge, train.txt
    "criteo-tb": 4_373_472_329,  # Criteo 1TB Click Logs, the 24 days
}
"""Samples in one epoch of each real dataset: over an epoch the real ids read every row of the
table at least once (the dataset's capacity is its distinct ids), which the Zipf model's tail does not
(``CostTable.tail_rate``)."""

PAPER_DATASETS: Dict[str, DatasetConfig] = {
    name: DatasetConfig(
        name=name,
        feature_names=(PAPER_FEATURE,),
        cardinalities=(PAPER_CAPACITIES[name],),
        num_dense=0,
        default_scale=scale,
        source="the authors' RecStore src/executable/dlrm/rec_dataloader.py (RecDatasetCapacity) and perf_rec_model.py",
        ids_per_sample=PAPER_IDS_PER_SAMPLE[name],
    )
    for name, scale in (("avazu", 0.25), ("criteo-kaggle", 0.1), ("criteo-tb", 0.05))
}
"""The paper's DLRM benchmark: one table over one ID space per dataset; the default scales give
2.4M-3.7M rows, about the per-field catalogue's defaults (two ranks fit a 24 GiB machine)."""

MODEL_KINDS: Tuple[str, ...] = ("dlrm", "paper")
EMBEDDING_OPTIMIZERS: Tuple[str, ...] = ("rowwise_adagrad", "sgd")
PAPER_TRAINING: Dict[str, object] = {
    "embedding_optimizer": "sgd", "embedding_lr": 0.01, "dense_optimizer": "sgd", "dense_lr": 0.01,
}  # fmt: skip
"""The authors' optimizers: SGD at lr 0.01 on the table and the MLP (``LR`` in ``perf_rec_model.py``)."""


@dataclass(frozen=True)
class ModelConfig:
    """The two models: the paper's DLRM benchmark and TorchRec's DLRM.

    ``paper``: the authors' benchmark (``SimpleDLRM`` in their ``perf_rec_model.py``): a sample's
    ids of the one table sum-pooled into one ``embedding_dim`` vector, through an MLP
    ``embedding_dim``-512-256-1 (``mlp_layers``, ReLU between layers), trained with MSE against
    random 0/1 labels (a throughput benchmark), SGD on table and MLP.
    ``dlrm``: ``torchrec.models.dlrm.DLRM``: dense arch 512-256-dim, pairwise-dot interaction,
    over arch 512-256-1, over the per-field tables and the dense features.
    """

    kind: str = "dlrm"
    embedding_dim: int = EMBEDDING_DIM
    mlp_layers: Tuple[int, ...] = (512, 256, 1)
    dense_arch_layers: Tuple[int, ...] = (512, 256, EMBEDDING_DIM)
    over_arch_layers: Tuple[int, ...] = (512, 256, 1)

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"model must be one of {MODEL_KINDS}, got {self.kind!r}")
        if self.kind == "dlrm" and self.dense_arch_layers[-1] != self.embedding_dim:
            raise ValueError("DLRM needs dense_arch_layers[-1] == embedding_dim")
        if self.mlp_layers[-1] != 1 or self.over_arch_layers[-1] != 1:
            raise ValueError("the last layer must have one output (the click logit)")


@dataclass(frozen=True)
class SkewConfig:
    """Zipf skew of the synthetic ids, per table, over a random permutation of its rows.

    s = ``s_large`` (1.2: "1% of rows take 92% of accesses", Bagpipe, on ~1M-row tables) for
    tables of at least ``small_rows`` rows, ``s_small`` (near-uniform) below.
    """

    s_large: float = 1.2
    s_small: float = 0.3
    small_rows: int = 10_000

    def s_for(self, rows: int) -> float:
        return self.s_large if rows >= self.small_rows else self.s_small


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs besides the sharder."""

    dataset: DatasetConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    scale: Optional[float] = None
    min_rows: int = 1000
    batch_size: int = 1024
    cache_ratio: float = CACHE_RATIO
    lookahead: int = LOOKAHEAD
    embedding_lr: float = 0.05
    embedding_optimizer: str = "rowwise_adagrad"
    dense_lr: float = 0.005
    dense_optimizer: str = "adagrad"
    skew: SkewConfig = field(default_factory=SkewConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0.0 <= self.cache_ratio <= 1.0:
            raise ValueError(f"cache_ratio must be in [0, 1], got {self.cache_ratio}")
        if self.lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {self.lookahead}")
        if self.embedding_optimizer not in EMBEDDING_OPTIMIZERS:
            raise ValueError(f"embedding_optimizer must be one of {EMBEDDING_OPTIMIZERS}, got {self.embedding_optimizer!r}")
        if self.dense_optimizer not in ("adagrad", "sgd"):
            raise ValueError(f"dense_optimizer must be 'adagrad' or 'sgd', got {self.dense_optimizer!r}")

    @property
    def effective_scale(self) -> float:
        return self.dataset.default_scale if self.scale is None else self.scale

    def rows(self) -> List[int]:
        return self.dataset.rows(self.effective_scale, self.min_rows)


def dataset_for(name: str, model_kind: str = "dlrm") -> DatasetConfig:
    """Dataset ``name``'s shape as ``model_kind`` trains it: the per-field tables (``dlrm``) or the
    authors' one table (``paper``)."""
    if name not in DATASETS:
        raise ValueError(f"unknown config {name!r}; choose one of {sorted(DATASETS)}")
    return PAPER_DATASETS[name] if model_kind == "paper" else DATASETS[name]


def get_config(name: str, **overrides: object) -> RunConfig:
    """The run configuration of dataset ``name`` with ``overrides`` (RunConfig fields); the
    dataset's shape follows the model (:func:`dataset_for`), and so do the optimizers' defaults
    (:data:`PAPER_TRAINING` for the paper's model)."""
    model = overrides.get("model", ModelConfig())
    kind = model.kind  # type: ignore[union-attr]
    defaults = dict(PAPER_TRAINING) if kind == "paper" else {}
    return replace(RunConfig(dataset=dataset_for(name, kind)), **{**defaults, **overrides})  # type: ignore[arg-type]


def describe(cfg: RunConfig, sizes: Sequence[int]) -> str:
    rows = sum(sizes)
    ids = f", {cfg.dataset.ids_per_sample} ids a sample" if cfg.dataset.ids_per_sample > 1 else ""
    return (
        f"{cfg.dataset.name} scale {cfg.effective_scale:g}: {len(sizes)} table{'s' if len(sizes) > 1 else ''}{ids}, {rows:,} rows "
        f"({rows * cfg.model.embedding_dim * 4 / 2**30:.2f} GiB at dim {cfg.model.embedding_dim}), "
        f"largest {max(sizes):,}"
    )
