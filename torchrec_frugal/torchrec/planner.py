"""FrugalShardingPlanner: every table on "frugal" unless constrained, caches sized from memory.

It is TorchRec's ``EmbeddingShardingPlanner`` (with the shims of :mod:`.patches`, which teach it
the "frugal" type) plus two decisions: tables without a ``sharding_types`` constraint are
constrained to "frugal", and once the plan is partitioned, the per-rank cache ratio of the frugal
tables is set from the device memory the topology has left on the fullest rank (at most
``FrugalConfig.cache_ratio``). A ``ParameterConstraints(sharding_types=[...])`` keeps a table on
any stock type; its cost, placement and memory are TorchRec's as usual.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Tuple, Union, cast

import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    Partitioner,
    PerfModel,
    Proposer,
    ShardingOption,
    Stats,
    StorageReservation,
    Storage,
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

from ..config import FrugalConfig
from .checkpoint import row_blocks
from .embedding import FrugalEmbeddingCollectionSharder
from .embeddingbag import FrugalEmbeddingBagCollectionSharder
from .patches import frugal_row_bytes
from .types import FRUGAL

logger: logging.Logger = logging.getLogger(__name__)


def frugal(cache_ratio: Optional[float] = None) -> ParameterShardingGenerator:
    """A ``construct_module_sharding_plan`` generator putting a table on the "frugal" type.

    Example::

        plan = construct_module_sharding_plan(ebc, {"t0": frugal(), "t1": table_wise(rank=0)}, sharder=sharder)

    Args:
        cache_ratio: this table's per-rank cache ratio (default: the sharder's FrugalConfig).
    """

    def _parameter_sharding_generator(
        param: nn.Parameter,
        local_size: int,
        world_size: int,
        device_type: str,
        sharder: ModuleSharder[nn.Module],
    ) -> ParameterSharding:
        rows, cols = param.shape
        return ParameterSharding(
            sharding_spec=EnumerableShardingSpec(
                [
                    ShardMetadata(
                        shard_sizes=[size, cols],
                        shard_offsets=[offset, 0],
                        placement=placement(device_type, rank, local_size),
                    )
                    for rank, (offset, size) in enumerate(row_blocks(rows, world_size))
                ]
            ),
            sharding_type=FRUGAL,
            compute_kernel=EmbeddingComputeKernel.FUSED.value,
            ranks=list(range(world_size)),
            cache_params=CacheParams(load_factor=cache_ratio) if cache_ratio is not None else None,
        )

    return _parameter_sharding_generator


class FrugalShardingPlanner(EmbeddingShardingPlanner):
    """Plans "frugal" for every table a frugal sharder serves, unless constrained otherwise.

    Takes the arguments of TorchRec's ``EmbeddingShardingPlanner`` plus ``config``, whose
    ``cache_ratio`` caps the per-rank cache ratio (default: the frugal sharders' configs).
    ``plan(module, sharders)`` and ``collective_plan(module, sharders, pg)`` work as there; without
    sharders they use the frugal sharders (with ``config``). After planning, ``cache_ratio`` holds
    the ratio given to frugal tables (None if the plan has none).
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
    ) -> None:
        super().__init__(
            topology=topology,
            batch_size=batch_size,
            enumerator=enumerator,
            storage_reservation=storage_reservation,
            proposer=proposer,
            partitioner=partitioner,
            performance_model=performance_model,
            stats=stats,
            constraints=constraints,
            debug=debug,
            callbacks=[self._size_caches] + list(callbacks or []),
            timeout_seconds=timeout_seconds,
        )
        self._config = config
        self._user_constraints: Dict[str, ParameterConstraints] = dict(constraints or {})
        self._own_enumerator = enumerator is None
        self._planning: Optional[Tuple[nn.Module, List[ModuleSharder[nn.Module]]]] = None
        self.cache_ratio: Optional[float] = None

    def collective_plan(
        self,
        module: nn.Module,
        sharders: Optional[List[ModuleSharder[nn.Module]]] = None,
        pg: Optional[dist.ProcessGroup] = None,
    ) -> ShardingPlan:
        return super().collective_plan(module, sharders if sharders is not None else self._default_sharders(), pg)

    def plan(self, module: nn.Module, sharders: Optional[List[ModuleSharder[nn.Module]]] = None) -> ShardingPlan:
        if sharders is None:
            sharders = self._default_sharders()
        self._constraints = self._frugal_constraints(module, sharders)
        if self._own_enumerator:
            self._enumerator = EmbeddingEnumerator(
                topology=self._topology, batch_size=self._batch_size, constraints=self._constraints
            )
        self._planning = (module, sharders)
        self.cache_ratio = None
        return super().plan(module, sharders)

    def _default_sharders(self) -> List[ModuleSharder[nn.Module]]:
        config = self._config or FrugalConfig()
        return [
            cast(ModuleSharder[nn.Module], FrugalEmbeddingBagCollectionSharder(config=config)),
            cast(ModuleSharder[nn.Module], FrugalEmbeddingCollectionSharder(config=config)),
        ]

    def _frugal_constraints(
        self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]
    ) -> Dict[str, ParameterConstraints]:
        """The user's constraints, with "frugal" for every table they leave unconstrained."""
        by_type = {sharder_name(s.module_type): s for s in sharders}
        out = dict(self._user_constraints)
        for child in module.modules():
            sharder = by_type.get(sharder_name(type(child)))
            if sharder is None or FRUGAL not in sharder.sharding_types(self._topology.compute_device):
                continue
            for name in sharder.shardable_parameters(child):
                c = out.get(name)
                if c is None:
                    out[name] = ParameterConstraints(sharding_types=[FRUGAL])
                elif c.sharding_types is None:
                    out[name] = replace(c, sharding_types=[FRUGAL])
        return out

    def _size_caches(self, best_plan: List[ShardingOption]) -> List[ShardingOption]:
        """Give frugal tables the largest cache ratio (<= config) that the fullest rank holds."""
        frugal_options = [so for so in best_plan if so.sharding_type == FRUGAL]
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
        kind = "hbm" if self._topology.compute_device in {"cuda", "mtia"} else "ddr"
        world = self._topology.world_size
        used = [0.0] * world
        for so in best_plan:
            for shard in so.shards:
                used[shard.rank] += getattr(shard.storage, kind)  # type: ignore[index]
        by_type = {sharder_name(s.module_type): s for s in sharders}

        def cache_bytes_at_ratio_one(so: ShardingOption) -> float:
            sharder = by_type[sharder_name(type(so.module[1]))]
            rows, dim = so.tensor.shape
            return float(rows * frugal_row_bytes(dim, so.tensor.element_size(), sharder.fused_params or {}))

        fixed = [so for so in frugal_options if so.cache_params is not None and so.cache_params.load_factor is not None]
        sized = [so for so in frugal_options if so not in fixed]
        unit = [0.0] * world
        for so in fixed:
            for shard in so.shards:
                used[shard.rank] += so.cache_params.load_factor * cache_bytes_at_ratio_one(so)  # type: ignore[union-attr]
        for so in sized:
            for shard in so.shards:
                unit[shard.rank] += cache_bytes_at_ratio_one(so)
        free = [getattr(reserved.devices[r].storage, kind) - used[r] for r in range(world)]
        fits = [free[r] / unit[r] for r in range(world) if unit[r] > 0]
        cap = min(self._cache_ratio_cap(by_type[sharder_name(type(so.module[1]))]) for so in frugal_options)
        ratio = max(0.0, min([cap, 1.0 / world] + fits))
        if sized and ratio < min(cap, 1.0 / world):
            logger.warning(
                f"FrugalShardingPlanner: device memory holds a cache ratio of {ratio:.4f} per rank, "
                f"less than FrugalConfig.cache_ratio={cap}"
            )
        for so in sized:
            so.cache_params = replace(so.cache_params or CacheParams(), load_factor=ratio)
        for so in frugal_options:
            extra = so.cache_params.load_factor * cache_bytes_at_ratio_one(so)  # type: ignore[union-attr]
            for shard in so.shards:
                s = shard.storage
                assert s is not None
                shard.storage = Storage(
                    hbm=s.hbm + (extra if kind == "hbm" else 0),
                    ddr=s.ddr + (extra if kind == "ddr" else 0),
                    ssd=s.ssd,
                )
        self.cache_ratio = ratio if sized else None
        return best_plan

    def _cache_ratio_cap(self, sharder: ModuleSharder[nn.Module]) -> float:
        if self._config is not None:
            return self._config.cache_ratio
        config = getattr(sharder, "config", None)
        return config.cache_ratio if isinstance(config, FrugalConfig) else FrugalConfig().cache_ratio
