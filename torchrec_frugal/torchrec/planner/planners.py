"""FrugalShardingPlanner: frugal or a stock sharding per table, caches sized from memory.

It is TorchRec's ``EmbeddingShardingPlanner`` (with the shims of :mod:`.patches`, which teach it
the "frugal" type) plus two decisions. Which sharding each table without a ``sharding_types``
constraint gets: "frugal", or, given a hardware profile, the cost model's choice among frugal,
table_wise, row_wise and table_row_wise, with a cache ratio and lookahead, by least predicted step
time (:mod:`.plan_choice` says why that choice is made for the whole plan and not by a TorchRec
shard estimator). And, once the plan is partitioned, the per-rank cache ratio of the frugal
tables: the largest the device memory left on the fullest rank holds, at most
``FrugalConfig.cache_ratio`` (with a profile: at most the chosen ratio). A
``ParameterConstraints(sharding_types=[...])`` keeps a table on any stock type; its cost,
placement and memory are TorchRec's as usual.
"""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union, cast

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.stats import EmbeddingStats
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    Partitioner,
    PerfModel,
    Proposer,
    ShardingOption,
    Stats,
    StorageReservation,
    Topology,
)
from torchrec.distributed.planner.utils import sharder_name
from torchrec.distributed.sharding_plan import ParameterShardingGenerator, placement
from torchrec.distributed.types import (
    CacheParams,
    EnumerableShardingSpec,
    ModuleSharder,
    ParameterSharding,
    ShardMetadata,
    ShardingPlan,
)

from ...config import CACHE_RATIO, FrugalConfig, check_real
from ...estimate.cost_model import CostModel, Plan, PlanChoice, StepCost, Workload, cache_ratio_choices
from ...estimate.profiles import HardwareProfile
from ..checkpoint import row_layout
from ..embedding import FrugalEmbeddingCollectionSharder
from ..embeddingbag import FrugalEmbeddingBagCollectionSharder
from ..fp_embeddingbag import FrugalFeatureProcessedEmbeddingBagCollectionSharder
from ..fused_params import frugal_fused_params, frugal_refusal, output_params, table_fused_params
from .plan_choice import TableCandidates, choose, constrain, hardware_profile
from .stats import FrugalCostStats
from .storage_reservations import DenseEstimateStorageReservation, size_frugal_caches
from ..types import FRUGAL, FRUGAL_ROW_WISE, FRUGAL_TYPES

logger: logging.Logger = logging.getLogger(__name__)


def _frugal_generator(sharding_type: str, cache_ratio: Optional[float]) -> ParameterShardingGenerator:
    """A generator of ``sharding_type`` whose shard metadata lays the rows out per node, then per
    rank of the node (:func:`.checkpoint.row_layout`; one node for "frugal")."""
    if cache_ratio is not None:
        check_real("cache_ratio", cache_ratio, 0.0, 1.0)

    def _parameter_sharding_generator(
        param: nn.Parameter,
        local_size: int,
        world_size: int,
        device_type: str,
        sharder: ModuleSharder[nn.Module],
    ) -> ParameterSharding:
        rows, cols = param.shape
        per_node = local_size if sharding_type == FRUGAL_ROW_WISE else world_size
        return ParameterSharding(
            sharding_spec=EnumerableShardingSpec(
                [
                    ShardMetadata(
                        shard_sizes=[size, cols],
                        shard_offsets=[offset, 0],
                        placement=placement(device_type, rank, local_size),
                    )
                    for rank, (offset, size) in enumerate(row_layout(rows, world_size, per_node))
                ]
            ),
            sharding_type=sharding_type,
            compute_kernel=EmbeddingComputeKernel.FUSED.value,
            ranks=list(range(world_size)),
            cache_params=CacheParams(load_factor=cache_ratio) if cache_ratio is not None else None,
        )

    return _parameter_sharding_generator


def frugal(cache_ratio: Optional[float] = None) -> ParameterShardingGenerator:
    """A ``construct_module_sharding_plan`` generator putting a table on the "frugal" type.

    Example::

        plan = construct_module_sharding_plan(ebc, {"t0": frugal(), "t1": table_wise(rank=0)}, sharder=sharder)

    Args:
        cache_ratio: this table's per-rank cache ratio (default: the sharder's FrugalConfig).
    """
    return _frugal_generator(FRUGAL, cache_ratio)


def frugal_row_wise(cache_ratio: Optional[float] = None) -> ParameterShardingGenerator:
    """A ``construct_module_sharding_plan`` generator putting a table on "frugal_row_wise": one row
    block per node (``local_size`` ranks each), served inside the node by a Frugal engine.

    Example::

        plan = construct_module_sharding_plan(ebc, {"t0": frugal_row_wise()}, sharder=sharder, local_size=2)

    Args:
        cache_ratio: per-rank cache ratio of the node's block (default: the sharder's FrugalConfig).
    """
    return _frugal_generator(FRUGAL_ROW_WISE, cache_ratio)


def check_fused_params(module: nn.Module, sharders: List[ModuleSharder[nn.Module]], plan: ShardingPlan) -> None:
    """Raise ValueError, naming the key, its value and the table, if a table ``plan`` puts on a
    frugal type has fused_params frugal tables do not honour: what the sharder would refuse."""
    by_type = {sharder_name(s.module_type): s for s in sharders}
    for path, module_plan in plan.plan.items():
        sharder = by_type[sharder_name(type(module.get_submodule(path)))]
        for kind in FRUGAL_TYPES:
            tables = {
                name: frugal_fused_params(table_fused_params(sharder.fused_params, ps), name)
                for name, ps in module_plan.items()  # type: ignore[attr-defined]
                if ps.sharding_type == kind
            }
            if tables:
                output_params(tables)


def with_lookahead(sharder: ModuleSharder[nn.Module], lookahead: Optional[int]) -> ModuleSharder[nn.Module]:
    """``sharder`` with ``lookahead`` in its FrugalConfig: a copy holding a new config where the
    lookahead differs, so that the caller's sharder and config are left as they were."""
    config = getattr(sharder, "config", None)
    if lookahead is None or not isinstance(config, FrugalConfig) or config.lookahead == lookahead:
        return sharder
    return cast(ModuleSharder[nn.Module], sharder.with_config(replace(config, lookahead=lookahead)))  # type: ignore[attr-defined]


class FrugalShardingPlanner(EmbeddingShardingPlanner):
    """Plans "frugal", or with ``hardware`` the cheapest predicted sharding, for every table a
    frugal sharder serves, unless constrained otherwise.

    Takes the arguments of TorchRec's ``EmbeddingShardingPlanner`` plus:

    - ``config``: its ``cache_ratio`` caps the per-rank cache ratio (default: the frugal sharders'
      configs); without ``hardware`` every free table goes "frugal".
    - ``hardware``: a profile name ("rtx3090", "cpu", ...), a profile JSON path or a
      ``HardwareProfile``. Each free table then goes to frugal (frugal_row_wise on a topology of
      several nodes), table_wise, row_wise or table_row_wise (what its sharder offers), and the
      frugal tables' cache ratio and lookahead
      are chosen, by least predicted step time (:func:`torchrec_frugal.estimate.cost_model.choose_plan`);
      the cache ratio is then the smaller of the chosen one and what device memory holds.
    - ``id_counts``: per table, id counts of a pre-sample (the distribution the prediction uses);
      tables without counts get Zipf ids, skew ``zipf_s`` or by table size (``plan_choice.DEFAULT_SKEW``).

    ``plan(module, sharders)`` and ``collective_plan(module, sharders, pg)`` work as there; without
    sharders they use the frugal sharders (with ``config``). After planning, ``cache_ratio`` holds
    the ratio given to frugal tables (None if the plan has none). With ``hardware`` also:
    ``lookahead`` (the chosen L), ``chosen`` (the cost model's ``Plan``) and ``predicted`` (the predicted step, as ``StepCost``, of the
    plan under "plan" and of every uniform alternative under its sharding's name); the plan report
    logs them (:class:`.stats.FrugalCostStats`). The lookahead reaches the engines through the
    sharders' ``FrugalConfig``: ``sharders()`` returns the planner's sharders with the chosen L in
    a new config (on every rank for ``collective_plan``; the sharders and configs given are left
    as they were): give those to ``DistributedModelParallel``. The cache ratio reaches them per
    table, as ``cache_params.load_factor`` in the plan.
    """

    def __init__(
        self,
        topology: Optional[Topology] = None,
        batch_size: Optional[int] = None,
        enumerator: Optional[Enumerator] = None,
        storage_reservation: Optional[StorageReservation] = None,
        proposer: Optional[Union[Proposer, List[Proposer]]] = None,
        partitioner: Optional[Partitioner] = None,
        performance_model: Optional[PerfModel] = None,
        stats: Optional[Union[Stats, List[Stats]]] = None,
        constraints: Optional[Dict[str, ParameterConstraints]] = None,
        debug: bool = True,
        callbacks: Optional[List[Callable[[List[ShardingOption]], List[ShardingOption]]]] = None,
        timeout_seconds: Optional[int] = None,
        config: Optional[FrugalConfig] = None,
        hardware: Optional[Union[str, HardwareProfile]] = None,
        id_counts: Optional[Mapping[str, Union[torch.Tensor, Sequence[float]]]] = None,
        zipf_s: Optional[float] = None,
    ) -> None:
        if zipf_s is not None:
            check_real("zipf_s", zipf_s, 0.0, math.inf, open_low=True)
        if config is not None and not isinstance(config, FrugalConfig):
            raise TypeError(f"config must be a FrugalConfig, got {type(config).__name__}")
        self._hardware = hardware_profile(hardware) if hardware is not None else None
        self._cost_stats = FrugalCostStats()
        if self._hardware is not None:
            given = [] if stats is None else stats if isinstance(stats, list) else [stats]
            stats = (given or [EmbeddingStats()]) + [self._cost_stats]
        super().__init__(
            topology=topology,
            batch_size=batch_size,
            enumerator=enumerator,
            # TorchRec's default reservation, with the dense estimate TorchRec asks for (no warnings)
            storage_reservation=storage_reservation if storage_reservation is not None else DenseEstimateStorageReservation(),
            proposer=proposer,
            partitioner=partitioner,
            performance_model=performance_model,
            stats=stats,
            constraints=constraints,
            debug=debug,
            callbacks=[self._size_caches, self._predict_final] + list(callbacks or []),
            timeout_seconds=timeout_seconds,
        )
        self._config = config
        self._user_constraints: Dict[str, ParameterConstraints] = dict(constraints or {})
        self._own_enumerator = enumerator is None
        self._planning: Optional[Tuple[nn.Module, List[ModuleSharder[nn.Module]]]] = None
        self._id_counts = dict(id_counts or {})
        self._zipf_s = zipf_s
        self._choice: Optional[Tuple[Workload, PlanChoice]] = None
        self._sharders: List[ModuleSharder[nn.Module]] = []
        self.cache_ratio: Optional[float] = None
        self.lookahead: Optional[int] = None
        self.predicted: Dict[str, StepCost] = {}
        self.chosen: Optional[Plan] = None  # with a profile: the cost model's plan, as predicted["plan"] prices it

    def collective_plan(
        self,
        module: nn.Module,
        sharders: Optional[List[ModuleSharder[nn.Module]]] = None,
        pg: Optional[dist.ProcessGroup] = None,
    ) -> ShardingPlan:
        sharders = sharders if sharders is not None else self._default_sharders()
        group = pg if pg is not None else dist.GroupMember.WORLD
        # Rank 0 plans (TorchRec's collective_plan); the fused params are checked after the
        # broadcast, on every rank, so that a refusal stops every rank, not rank 0 alone.
        plan = invoke_on_rank_and_broadcast_result(group, 0, self._plan, module, sharders)
        self._sharders = sharders
        if self._hardware is not None:  # rank 0 planned: every rank takes its choice
            chosen = [(self.cache_ratio, self.lookahead, self.predicted, self.chosen)]
            dist.broadcast_object_list(chosen, src=dist.get_global_rank(group, 0), group=group)
            self.cache_ratio, self.lookahead, self.predicted, self.chosen = chosen[0]
            self._sharders = [with_lookahead(s, self.lookahead) for s in sharders]
        check_fused_params(module, sharders, plan)
        return plan

    def plan(self, module: nn.Module, sharders: Optional[List[ModuleSharder[nn.Module]]] = None) -> ShardingPlan:
        """TorchRec's plan, refused (ValueError naming the key, its value and the table) if a frugal
        table's fused_params hold a key that frugal tables do not honour."""
        if sharders is None:
            sharders = self._default_sharders()
        plan = self._plan(module, sharders)
        check_fused_params(module, sharders, plan)
        return plan

    def _plan(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> ShardingPlan:
        """TorchRec's plan under the frugal constraints, then the lookahead chosen (unchecked)."""
        self._sharders = sharders
        self.cache_ratio, self.lookahead, self.predicted, self._choice = None, None, {}, None
        self.chosen = None
        self._cost_stats.prediction = None
        self._constraints = self._frugal_constraints(module, sharders)
        if self._own_enumerator:
            self._enumerator = EmbeddingEnumerator(
                topology=self._topology, batch_size=self._batch_size, constraints=self._constraints
            )
        self._planning = (module, sharders)
        plan = super().plan(module, sharders)
        self._sharders = [with_lookahead(s, self.lookahead) for s in sharders]
        return plan

    def sharders(self) -> List[ModuleSharder[nn.Module]]:
        """The sharders of the last plan (the frugal defaults if it got none), each frugal one with
        the chosen lookahead in its ``FrugalConfig`` (a copy: the sharders and configs given stay as
        they were): give these to ``DistributedModelParallel``."""
        return list(self._sharders)

    def _default_sharders(self) -> List[ModuleSharder[nn.Module]]:
        config = self._config or FrugalConfig()
        return [
            cast(ModuleSharder[nn.Module], FrugalEmbeddingBagCollectionSharder(config=config)),
            cast(ModuleSharder[nn.Module], FrugalEmbeddingCollectionSharder(config=config)),
            cast(
                ModuleSharder[nn.Module],
                FrugalFeatureProcessedEmbeddingBagCollectionSharder(FrugalEmbeddingBagCollectionSharder(config=config)),
            ),
        ]

    def _frugal_constraints(
        self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]
    ) -> Dict[str, ParameterConstraints]:
        """The user's constraints, with a sharding type for every table they leave unconstrained:
        "frugal", or with a hardware profile the cost model's choice."""
        by_type = {sharder_name(s.module_type): s for s in sharders}
        choice = self._choose(module, sharders)
        out = dict(self._user_constraints)
        for child in module.modules():
            sharder = by_type.get(sharder_name(type(child)))
            if sharder is None or FRUGAL not in sharder.sharding_types(self._topology.compute_device):
                continue
            default = self._default_type(sharder)
            for name, param in sharder.shardable_parameters(child).items():
                c = out.get(name)
                if c is not None and c.sharding_types is not None:
                    continue  # the user's choice (a frugal one is checked once planned)
                refused = frugal_refusal(sharder.fused_params, name, param.dtype)
                if refused is None:
                    kinds = [choice.get(name, default)]
                else:  # what the frugal sharder would refuse goes to TorchRec's best stock type
                    device = self._topology.compute_device
                    kinds = [t for t in sharder.sharding_types(device) if t not in FRUGAL_TYPES]
                    logger.warning("table %r is planned among %s, not frugal: %s", name, kinds, refused)
                out[name] = ParameterConstraints(sharding_types=kinds) if c is None else replace(c, sharding_types=kinds)
                out[name] = constrain(out[name], self._choice[1].plan if self._choice is not None else None)
        return out

    def _nodes(self) -> int:
        return max(1, self._topology.world_size // self._topology.local_world_size)

    def _default_type(self, sharder: ModuleSharder[nn.Module]) -> str:
        """A free table's type without a hardware profile: "frugal" on one node; across nodes
        "frugal_row_wise" (an error naming the sharder if it does not offer it)."""
        if self._nodes() == 1:
            return FRUGAL
        if FRUGAL_ROW_WISE not in sharder.sharding_types(self._topology.compute_device):
            raise NotImplementedError(
                f"FrugalShardingPlanner: the topology spans {self._nodes()} nodes, where a frugal table needs "
                f"{FRUGAL_ROW_WISE}, which {type(sharder).__name__} does not offer; constrain its tables to a stock type"
            )
        return FRUGAL_ROW_WISE

    def _choose(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> Dict[str, str]:
        """With a hardware profile: the cost model's sharding for each free table (else none)."""
        if self._hardware is None:
            return {}
        nodes = self._nodes()
        device = self._topology.compute_device
        tables = TableCandidates(module, sharders, self._user_constraints, device, nodes,
                                 uvm=device == "cuda" and not self._hardware.device_is_host)  # fmt: skip
        if not tables.shapes:
            return {}
        world = self._topology.world_size
        per_engine = world // nodes  # frugal: all ranks of the one node; frugal_row_wise: a node's ranks
        ratios = [c for c in cache_ratio_choices(self._hardware) if c <= 1.0 / per_engine] or [1.0 / per_engine]
        self._choice = choose(
            tables, self._hardware, self._batch_size, world, ratios, self._id_counts, self._zipf_s, nodes
        )
        plan = self._choice[1].plan
        logger.info(f"FrugalShardingPlanner: predicted best plan on {self._hardware.name!r}: {plan}")
        return {name: plan.sharding_of(name) for name in tables.free}

    def _size_caches(self, best_plan: List[ShardingOption]) -> List[ShardingOption]:
        """Give frugal tables the largest cache ratio (<= config, or the cost model's choice) that
        the fullest rank holds (:func:`.storage.size_frugal_caches`)."""
        frugal_options = [so for so in best_plan if so.sharding_type in FRUGAL_TYPES]
        if not frugal_options:
            return best_plan
        assert self._planning is not None
        module, sharders = self._planning
        reserved = self._storage_reservation.reserve(
            topology=self._topology,
            batch_size=self._batch_size,
            module=module,
            sharders=sharders,
            constraints=self._constraints,
        )
        by_type = {sharder_name(s.module_type): s for s in sharders}
        cap = min(self._cache_ratio_cap(by_type[sharder_name(type(so.module[1]))]) for so in frugal_options)
        self.cache_ratio = size_frugal_caches(best_plan, reserved, self._topology, by_type, cap, self._nodes())
        return best_plan

    def _predict_final(self, best_plan: List[ShardingOption]) -> List[ShardingOption]:
        """With a hardware profile: the prediction of the plan as sized (its final cache ratio)."""
        if self._choice is None:
            return best_plan
        w, choice = self._choice
        plan = choice.plan
        if any(so.sharding_type in FRUGAL_TYPES for so in best_plan):
            self.lookahead = plan.lookahead
        if self.cache_ratio is not None:  # frugal tables were sized: predict the ratio they got
            plan = replace(plan, cache_ratio=self.cache_ratio)
        assert self._hardware is not None
        self.predicted = {**choice.predicted(), "plan": CostModel(self._hardware).predict(w, plan)}
        self._cost_stats.prediction, self._cost_stats.plan = self.predicted, plan
        self.chosen = plan
        self._cost_stats.profile = self._hardware.name
        return best_plan

    def _cache_ratio_cap(self, sharder: ModuleSharder[nn.Module]) -> float:
        if self._choice is not None:
            return self._choice[1].plan.cache_ratio
        if self._config is not None:
            return self._config.cache_ratio
        config = getattr(sharder, "config", None)
        return config.cache_ratio if isinstance(config, FrugalConfig) else CACHE_RATIO
