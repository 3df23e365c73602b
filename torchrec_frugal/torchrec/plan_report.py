"""The plan report of a sharded module: what each table got, logged once its engines are built.

TorchRec's ``EmbeddingStats`` reports a plan where the planner runs; a script that lets
``DistributedModelParallel`` plan never sees ours there, and the cache a frugal table gets is fixed
only when its engine picks its rows. So the report is made where every planning path ends: when a
sharded module has built its engines. Per table: the sharding, the rows each rank caches on its
device, and the share of the pre-sample's ids a rank finds in its own cache (the expected hit
ratio; "no pre-sample" where nothing told the engine which rows are hot).
"""
from __future__ import annotations

import logging
import math
from typing import Dict, Iterable, List, Sequence, Tuple

import numpy as np
from torchrec.distributed.types import ParameterSharding
from torchrec.modules.embedding_configs import BaseEmbeddingConfig

from ..engine.frugal_engine import FrugalEngine

logger: logging.Logger = logging.getLogger(__name__)

HEADER = ("table", "sharding", "rows x dim", "cached rows per rank", "expected hit ratio")


def engine_caches(engines: Iterable[FrugalEngine]) -> Dict[str, Tuple[int, float]]:
    """Per table an engine serves: rows each rank caches, and the share of the pre-sample's ids that
    a rank finds in its own cache (NaN without a pre-sample)."""
    out: Dict[str, Tuple[int, float]] = {}
    for engine in engines:
        own = engine.ownership
        offsets = engine.fused.offsets.tolist()
        for t, spec in enumerate(engine.tables):
            cached = int(np.count_nonzero(own.cached[offsets[t] : offsets[t + 1]]))
            # The hottest rows are dealt round-robin: each rank's batch hits its own cache for a
            # 1/world share of what all the caches hold.
            out[spec.name] = (cached // engine.world_size, float(own.cached_share[t]) / engine.world_size)
    return out


def plan_report(
    module_fqn: str,
    configs: Sequence[BaseEmbeddingConfig],
    params: Dict[str, ParameterSharding],
    caches: Dict[str, Tuple[int, float]],
) -> str:
    """The report's text: a line of heading, then one row per table of the module."""
    rows: List[Tuple[str, ...]] = [HEADER]
    for c in configs:
        ps = params.get(c.name)
        kind = ps.sharding_type if ps is not None else "not sharded"
        cached, hit = caches.get(c.name, (None, math.nan))
        rows.append(
            (
                c.name,
                kind,
                f"{c.num_embeddings} x {c.embedding_dim}",
                "-" if cached is None else str(cached),
                "-" if cached is None else ("no pre-sample" if math.isnan(hit) else f"{hit:.3f}"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = [f"torchrec_frugal plan of {module_fqn or 'the model'}:"]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def log_plan_report(report: str) -> None:
    for line in report.splitlines():
        logger.info(line)
