"""Types the TorchRec glue shares: the "frugal" sharding type and one frugal table.

The counterpart of TorchRec's ``distributed/types.py``: the planner shims and the planner read
``FRUGAL`` from here without importing the engine or the sharded modules.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.modules.embedding_configs import PoolingType

from ..config import OptimizerSpec

FRUGAL = "frugal"
"""The sharding-type string of ``ParameterSharding.sharding_type`` for Frugal tables."""

FRUGAL_ROW_WISE = "frugal_row_wise"
"""Frugal inside each node, TorchRec's row-wise sharding across nodes: a table's rows split into
one block per node, each node's block served to the node's ranks by a Frugal engine."""

FRUGAL_TYPES = (FRUGAL, FRUGAL_ROW_WISE)
"""The sharding types whose tables Frugal engines serve."""

OPTIMIZER_KINDS: Dict[EmbOptimType, str] = {
    EmbOptimType.EXACT_SGD: "sgd",
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: "rowwise_adagrad",
    EmbOptimType.EXACT_ADAGRAD: "adagrad",
    EmbOptimType.ADAM: "adam",
}
"""The fused optimizers frugal tables run, as the engine's optimizer kinds."""


@dataclass
class FrugalTable:
    """One table of a frugal sharding, as its lookup and kernel need it."""

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: List[str]
    pooling: PoolingType
    init_fn: Callable[[torch.Tensor], Any]
    optimizer: OptimizerSpec
    cache_ratio: float
    presample_counts: Optional[torch.Tensor]
    row_offset: int = 0  # the table's first row this engine holds (frugal_row_wise: its node's block)
    total_rows: Optional[int] = None  # rows of the whole table (None: num_embeddings, all of it)
    # bounds_check_mode (bounds_check.MODES): an id out of range read as row 0, or its batch refused
    bounds_check: str = "WARNING"

    @property
    def table_rows(self) -> int:
        """Rows of the whole table (across nodes)."""
        return self.num_embeddings if self.total_rows is None else self.total_rows
