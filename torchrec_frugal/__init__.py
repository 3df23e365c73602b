"""torchrec_frugal: Frugal (ASPLOS 2025) embedding training for TorchRec.

The mechanism (host tables, owner caches, lookahead window, priority queue, flushers, gate)
lives in flat modules free of TorchRec imports; the TorchRec glue is in ``torchrec_frugal.torchrec``.
"""
from .config import FrugalConfig, OptimizerSpec, TableSpec
from .engine import FrugalEngine
from .errors import FrugalError, FrugalInputError, RankLostError
from .metrics import StepMetrics

__all__ = [
    "FrugalConfig",
    "FrugalEngine",
    "FrugalError",
    "FrugalInputError",
    "OptimizerSpec",
    "RankLostError",
    "StepMetrics",
    "TableSpec",
]
