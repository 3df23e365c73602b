"""FrugalCostStats: the plan report's predicted step time, term by term.

A TorchRec ``Stats`` (like ``EmbeddingStats`` in TorchRec's ``planner/stats.py``) that
FrugalShardingPlanner adds to its stats when it plans with a hardware profile: after the plan,
it logs the cost model's predicted step of the chosen plan and of each uniform alternative,
broken into the model's terms (docs/cost_model.md). Every figure is a prediction.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional

from torch import nn
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    PlanDebugStats,
    ShardingOption,
    Stats,
    StorageReservation,
    Topology,
)
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from ...estimate.cost_model import Plan, StepCost
from ...estimate.cli import breakdown_table

logger: logging.Logger = logging.getLogger(__name__)


class FrugalCostStats(Stats):
    """Logs the prediction the planner set in ``prediction`` (nothing when it is None)."""

    def __init__(self) -> None:
        self.prediction: Optional[Dict[str, StepCost]] = None
        self.plan: Optional[Plan] = None
        self.profile = ""
        self.report = ""  # the last report logged

    def log(
        self,
        sharding_plan: ShardingPlan,
        topology: Topology,
        batch_size: int,
        storage_reservation: StorageReservation,
        num_proposals: int,
        num_plans: int,
        run_time: float,
        best_plan: List[ShardingOption],
        constraints: Optional[Dict[str, ParameterConstraints]] = None,
        sharders: Optional[List[ModuleSharder[nn.Module]]] = None,
        enumerator: Optional[Enumerator] = None,
        debug: bool = False,
        debug_stats: Optional[PlanDebugStats] = None,
    ) -> None:
        if self.prediction is None or self.plan is None:
            return
        plan = self.plan
        shardings = ", ".join(f"{t}: {s}" for t, s in sorted(plan.tables.items()))
        self.report = "\n".join(
            [
                f"FrugalShardingPlanner: PREDICTED step (cost model, profile {self.profile!r}; "
                f"predictions, not measurements), {topology.world_size} ranks x batch {batch_size}",
                f"plan: {plan.sharding} for every table" + (f" except {shardings}" if shardings else "")
                + f"; frugal cache ratio {plan.cache_ratio:g}, lookahead L={plan.lookahead}",
                "columns: the chosen plan, then every table on one sharding (frugal with its best settings)",
                breakdown_table(self.prediction),
            ]
        )
        for line in self.report.splitlines():
            logger.info(line)
