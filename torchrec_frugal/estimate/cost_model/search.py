"""Plans of least predicted step: Frugal's settings, a stock choice's cache load factor, and a
sharding per table (:func:`choose_plan`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..profiles import HardwareProfile
from .model import CostModel
from .workload import FRUGAL, FRUGAL_KINDS, FRUGAL_ROW_WISE, FUSED_UVM_CACHING, PREFETCH, STOCK_SHARDINGS, UVM_CHOICES, Plan, StepCost, Workload, split_choice

CACHE_RATIO_CHOICES = (0.01, 0.02, 0.05, 0.1, 0.2)
"""Frugal's cache ratios to choose from; where the device is host memory, 0 too (:func:`cache_ratio_choices`)."""
LOOKAHEAD_CHOICES = (0, 2, 5, 10)
UVM_LOAD_FACTOR_CHOICES = (0.05, 0.1, 0.2, 0.4)
"""cache_load_factor choices of a fused_uvm_caching plan (TorchRec's default: 0.2)."""


def cache_ratio_choices(profile: HardwareProfile) -> Tuple[float, ...]:
    """The cache ratios to choose from on ``profile``. Where the device is host memory, no cache at all
    is a choice too: a cached row is read from the same memory as the host table, and its update
    is written to the cache and then flushed, so the model may well price no cache lower."""
    return ((0.0,) if profile.device_is_host else ()) + CACHE_RATIO_CHOICES


def frugal_offered(profile: HardwareProfile, world_size: int) -> bool:
    """Whether the planner offers Frugal to ``world_size`` ranks on ``profile``. Not to one rank whose
    device is host memory: there Frugal has nothing to save (no peer to spare an all-to-all, no
    link between the device and the host table), while its engine's threads still run in the
    rank's process beside the step's. The model prices that as a tie with stock; measured, every
    such run was slower than the best stock plan (docs/cost_model.md, "The planner with the
    shipped profile")."""
    return world_size > 1 or not profile.device_is_host


def frugal_kind(nodes: int) -> str:
    """Frugal's sharding on ``nodes`` machines: ``frugal`` on one, ``frugal_row_wise`` across several."""
    return FRUGAL if nodes == 1 else FRUGAL_ROW_WISE


def shardings_for(nodes: int, device: str = "cuda") -> Tuple[str, ...]:
    """The choices to compare on ``nodes`` machines: Frugal's kind there, then the stock shardings,
    then (on a CUDA device) TorchRec's offloading."""
    return (frugal_kind(nodes),) + STOCK_SHARDINGS + (UVM_CHOICES if device == "cuda" else ())


def recommend_stock(
    model: CostModel, workload: Workload, choice: str, uvm_load_factors: Sequence[float] = UVM_LOAD_FACTOR_CHOICES
) -> Tuple[Plan, StepCost]:
    """A stock choice on every table; for fused_uvm_caching, the cache_load_factor of least predicted
    step among those that fit (the smallest if none fits)."""
    if split_choice(choice)[1] != FUSED_UVM_CACHING:
        plan = Plan(choice)
        return plan, model.predict(workload, plan)
    plans = [Plan(choice, uvm_load_factor=load_factor) for load_factor in uvm_load_factors]
    return _least_step(model, workload, plans)


def recommend_frugal(
    model: CostModel,
    workload: Workload,
    cache_ratios: Optional[Sequence[float]] = None,
    lookaheads: Sequence[int] = LOOKAHEAD_CHOICES,
) -> Tuple[Plan, StepCost]:
    """The cache ratio (default: :func:`cache_ratio_choices`) and lookahead of least predicted step
    time among those that fit in device memory (the smallest cache if none fits); ties go to the
    earlier choice."""
    kind = frugal_kind(workload.nodes)
    if cache_ratios is None:
        cache_ratios = cache_ratio_choices(model.profile)
    plans = [Plan(kind, cache_ratio=ratio, lookahead=lookahead) for ratio in cache_ratios for lookahead in lookaheads]
    return _least_step(model, workload, plans)


def _least_step(model: CostModel, workload: Workload, plans: Sequence[Plan]) -> Tuple[Plan, StepCost]:
    """The first of ``plans`` with the least predicted step among those that fit (by ``_better``)."""
    best: Optional[Tuple[Plan, StepCost]] = None
    for plan in plans:
        cost = model.predict(workload, plan)
        if _better(cost, None if best is None else best[1]):
            best = (plan, cost)
    assert best is not None
    return best


def predict_all(
    model: CostModel, workload: Workload, frugal: Optional[Plan] = None, shardings: Optional[Sequence[str]] = None
) -> Dict[str, StepCost]:
    """Every choice's predicted step (default: ``shardings_for(workload.nodes, device)``); Frugal with
    ``frugal``'s cache ratio and lookahead, or the recommended ones; fused_uvm_caching with its
    recommended cache_load_factor (``details["uvm_load_factor"]``)."""
    costs: Dict[str, StepCost] = {}
    for sharding in shardings if shardings is not None else shardings_for(workload.nodes, model.profile.device):
        if sharding not in FRUGAL_KINDS:
            plan, costs[sharding] = recommend_stock(model, workload, sharding)
            if split_choice(sharding)[1] == FUSED_UVM_CACHING:
                costs[sharding].details["uvm_load_factor"] = plan.uvm_load_factor
        elif frugal is not None:
            costs[sharding] = model.predict(workload, replace(frugal, sharding=sharding))
        else:
            costs[sharding] = recommend_frugal(model, workload)[1]
    return costs


PLANNER_SHARDINGS = (FRUGAL, "table_wise", "row_wise", "table_row_wise")
"""What a table may take when the planner chooses on one node (data_parallel replicates whole
tables); across nodes ``frugal_row_wise`` takes frugal's place (:func:`planner_shardings`); on a
CUDA device also TorchRec's offloading of table_wise and row_wise."""


def planner_shardings(nodes: int, device: str = "cuda", prefetch: bool = False) -> Tuple[str, ...]:
    """The planner's candidates: ``prefetch`` adds fused_uvm_caching with the prefetch pipeline
    (the model must then be trained with TorchRec's PrefetchTrainPipelineSparseDist)."""
    uvm = tuple(choice for choice in UVM_CHOICES if prefetch or not choice.endswith(PREFETCH)) if device == "cuda" else ()
    return (frugal_kind(nodes),) + PLANNER_SHARDINGS[1:] + uvm


@dataclass
class PlanChoice:
    """The plan of least predicted step, and each uniform plan for comparison (all predictions)."""

    plan: Plan
    cost: StepCost
    uniform: Dict[str, Tuple[Plan, StepCost]]

    def predicted(self) -> Dict[str, StepCost]:
        """"plan" (the chosen one), then every uniform alternative by sharding."""
        return {"plan": self.cost, **{sharding: cost for sharding, (_, cost) in self.uniform.items()}}


def _better(cost: StepCost, than: Optional[StepCost]) -> bool:
    """A plan that fits beats one that does not; else faster by more than 0.1% (ties keep ``than``)."""
    return than is None or (cost.fits and not than.fits) or (
        cost.fits == than.fits and cost.step_s < than.step_s * (1 - 1e-3)
    )


def choose_plan(
    model: CostModel,
    workload: Workload,
    candidates: Optional[Mapping[str, Sequence[str]]] = None,
    cache_ratios: Optional[Sequence[float]] = None,
    lookaheads: Sequence[int] = LOOKAHEAD_CHOICES,
    rounds: int = 4,
    uvm_load_factors: Sequence[float] = UVM_LOAD_FACTOR_CHOICES,
) -> PlanChoice:
    """A sharding per table, a cache ratio (default: :func:`cache_ratio_choices`) and a lookahead of
    least predicted step time.

    ``candidates`` maps each table to the shardings it may take (default: ``planner_shardings``;
    a table with one candidate is fixed; Frugal only where :func:`frugal_offered`). A local search
    starts from each uniform plan (every table on one sharding where it allows it, Frugal's
    settings tuned) and alternates: each table in turn, largest first, moves to the sharding that
    lowers the predicted step of the whole mixed plan (``CostModel.predict``); then the cache
    ratio and L are tuned for the assignment; until a round changes nothing. The best end point
    wins. The step is not a sum of per-table costs (shared all-to-all latencies, the engine's
    fixed work, the gate stall, contention), so every move is priced on the whole plan; the
    result is never predicted slower than the best uniform plan.
    """
    profile = model.profile
    names = [table.name for table in sorted(workload.tables, key=lambda table: -table.rows * table.dim)]
    ratios = cache_ratio_choices(profile) if cache_ratios is None else cache_ratios
    allowed = {name: tuple((candidates or {}).get(name, planner_shardings(workload.nodes, profile.device))) for name in names}
    if not frugal_offered(profile, workload.world_size):  # a table that may only be Frugal's keeps it
        allowed = {name: tuple(option for option in shardings if option not in FRUGAL_KINDS) or shardings for name, shardings in allowed.items()}
    if any(not shardings for shardings in allowed.values()):
        raise ValueError("every table needs at least one candidate sharding")

    def tune(assignment: Dict[str, str], plan: Plan, cost: Optional[StepCost]) -> Tuple[Plan, StepCost]:
        """The best cache ratio and L (with fused_uvm_caching tables: cache_load_factor) for
        ``assignment`` (kept as in ``plan`` on ties)."""
        best = (plan, cost if cost is not None else model.predict(workload, plan))
        if set(assignment.values()) & set(FRUGAL_KINDS):
            for ratio in ratios:
                for lookahead in lookaheads:
                    trial = Plan.of(assignment, ratio, lookahead, best[0].uvm_load_factor)
                    trial_cost = model.predict(workload, trial)
                    if _better(trial_cost, best[1]):
                        best = (trial, trial_cost)
        if any(split_choice(sharding)[1] == FUSED_UVM_CACHING for sharding in assignment.values()):
            for load_factor in uvm_load_factors:
                trial = Plan.of(assignment, best[0].cache_ratio, best[0].lookahead, load_factor)
                trial_cost = model.predict(workload, trial)
                if _better(trial_cost, best[1]):
                    best = (trial, trial_cost)
        return best

    def descend(assignment: Dict[str, str], plan: Plan, cost: StepCost) -> Tuple[Plan, StepCost]:
        for _ in range(rounds):
            moved = False
            for name in names:
                for sharding in allowed[name]:
                    if sharding == assignment[name]:
                        continue
                    trial = {**assignment, name: sharding}
                    trial_plan = Plan.of(trial, plan.cache_ratio, plan.lookahead, plan.uvm_load_factor)
                    trial_cost = model.predict(workload, trial_plan)
                    if _better(trial_cost, cost):
                        assignment, plan, cost, moved = trial, trial_plan, trial_cost, True
            if not moved:
                break
            plan, cost = tune(assignment, plan, cost)
        return plan, cost

    uniform: Dict[str, Tuple[Plan, StepCost]] = {}
    best: Optional[Tuple[Plan, StepCost]] = None
    for sharding in dict.fromkeys(option for name in names for option in allowed[name]):
        assignment = {name: sharding if sharding in allowed[name] else allowed[name][0] for name in names}
        uniform[sharding] = tune(assignment, Plan.of(assignment), None)
        plan, cost = descend(assignment, *uniform[sharding])
        if best is None or _better(cost, best[1]):
            best = (plan, cost)
    assert best is not None
    plan, cost = best
    return PlanChoice(plan, cost, uniform)
