"""torchrec_frugal: Frugal (ASPLOS 2025) embedding training for TorchRec.

The mechanism (host tables, owner caches, lookahead window, priority queue, flushers, gate)
lives in flat modules free of TorchRec imports; the TorchRec glue is in ``torchrec_frugal.torchrec``.
"""
from . import required_packages

required_packages.require("torch")  # an ImportError saying what to install first, rather than a bare "No module named"

from .config import FrugalConfig, OptimizerSpec, TableSpec  # noqa: E402
from .engine.frugal_engine import FrugalEngine
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

_TORCHREC_API = (
    "FRUGAL",
    "FrugalEmbeddingBagCollectionSharder",
    "FrugalEmbeddingCollectionSharder",
    "FrugalShardingPlanner",
    "FrugalTrainPipeline",
    "consumer_pcie_topology",
    "frugal",
)
__all__ += list(_TORCHREC_API)


def __getattr__(name: str):
    """The TorchRec API loads on first use (installing the planner shims), so the engine alone never imports TorchRec."""
    if name in _TORCHREC_API:
        from . import torchrec as _torchrec

        return getattr(_torchrec, name)
    raise AttributeError(f"module 'torchrec_frugal' has no attribute {name!r}")
