"""TorchRec's default storage reservation, given the dense estimate TorchRec asks for.

``EmbeddingShardingPlanner`` without a ``storage_reservation`` builds
``HeuristicalStorageReservation(0.15)``: it reserves 15% of device memory, six times the dense
parameters' bytes and the input KJTs' bytes before placing tables. Built that way it warns twice:
a ``FutureWarning`` on construction (TorchRec 1.8 and later) and, on every plan, a logged warning
that the dense size is over-estimated in a dry run "unless you pass a dense_tensor_estimate".
:class:`DenseEstimateStorageReservation` is the same reservation with that estimate, measured
from the module being planned, so plans are those of TorchRec's default and neither warning
applies. A dry run (dense parameters on the meta device) gets no estimate and keeps TorchRec's
logged warning, which is then true.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import replace
from typing import Dict, List, Mapping, Optional

from torch import nn
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints, ShardingOption, Storage, Topology
from torchrec.distributed.planner.utils import sharder_name
from torchrec.distributed.types import CacheParams, ModuleSharder, get_tensor_size_bytes

from ..patches.planner_shims import frugal_row_bytes
from ..types import FRUGAL, FRUGAL_ROW_WISE, FRUGAL_TYPES

logger: logging.Logger = logging.getLogger(__name__)

PERCENTAGE = 0.15  # EmbeddingShardingPlanner's heuristical_storage_reservation_percentage default
PARAMETER_MULTIPLIER = 6.0  # HeuristicalStorageReservation's: parameter + optimizer (~2x) + DDP (~3x)


def dense_tensor_estimate(
    module: nn.Module, sharders: List[ModuleSharder[nn.Module]], parameter_multiplier: float = PARAMETER_MULTIPLIER
) -> Optional[int]:
    """The dense bytes HeuristicalStorageReservation reserves for ``module``, computed as TorchRec
    computes them (``parameter_multiplier`` x the parameters' bytes plus the buffers' bytes, of the
    whole module less the modules ``sharders`` shard); None where a dense tensor is on the meta
    device, whose size TorchRec's dry-run warning is about."""
    sharded = {s.module_type for s in sharders}
    shardable: List[nn.Module] = []

    def walk(m: nn.Module) -> None:
        if type(m) in sharded:
            shardable.append(m)
        else:
            for child in m.children():
                walk(child)

    walk(module)
    inside = {id(t) for m in shardable for t in (*m.parameters(), *m.buffers())}
    if any(t.device.type == "meta" for t in (*module.parameters(), *module.buffers()) if id(t) not in inside):
        return None

    def size(m: nn.Module) -> int:
        params = sum(parameter_multiplier * get_tensor_size_bytes(p) for p in m.parameters())
        return round(params + sum(get_tensor_size_bytes(b) for b in m.buffers()))

    return size(module) - sum(size(m) for m in shardable)


class DenseEstimateStorageReservation(HeuristicalStorageReservation):
    """``HeuristicalStorageReservation(percentage, parameter_multiplier)`` that measures the
    ``dense_tensor_estimate`` of each module it reserves for (unless one is given), so that it
    reserves what TorchRec's default reserves without TorchRec's warnings about the estimate.

    It stays a ``HeuristicalStorageReservation``, so TorchRec's plan report shows its reserved
    dense and KJT storage as for the default.
    """

    def __init__(
        self,
        percentage: float = PERCENTAGE,
        parameter_multiplier: float = PARAMETER_MULTIPLIER,
        dense_tensor_estimate: Optional[int] = None,
    ) -> None:
        self._frugal_args = (percentage, parameter_multiplier, dense_tensor_estimate)
        self._heuristical_init(dense_tensor_estimate)

    def _heuristical_init(self, estimate: Optional[int]) -> None:
        # TorchRec's FutureWarning on construction recommends passing a dense_tensor_estimate:
        # every reserve() below passes one (or, in a dry run, TorchRec's logged warning stays).
        percentage, multiplier, _ = self._frugal_args
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="HeuristicalStorageReservation is known", category=FutureWarning)
            HeuristicalStorageReservation.__init__(self, percentage, multiplier, dense_tensor_estimate=estimate)

    def reserve(
        self,
        topology: Topology,
        batch_size: int,
        module: nn.Module,
        sharders: List[ModuleSharder[nn.Module]],
        constraints: Optional[Dict[str, ParameterConstraints]] = None,
    ) -> Topology:
        _, multiplier, given = self._frugal_args
        estimate = given if given is not None else dense_tensor_estimate(module, sharders, multiplier)
        if estimate is not None:
            estimate = max(estimate, 1)  # TorchRec reads an estimate of 0 as none given
        self._heuristical_init(estimate)  # the base class takes the estimate at construction only
        return super().reserve(topology, batch_size, module, sharders, constraints)


def size_frugal_caches(
    best_plan: List[ShardingOption],
    reserved: Topology,
    topology: Topology,
    by_type: Mapping[str, ModuleSharder[nn.Module]],
    cap: float,
    nodes: int,
) -> Optional[float]:
    """Give the frugal tables of ``best_plan`` without a cache ratio of their own the largest ratio,
    at most ``cap`` (and 1 / the ranks of an engine), that the fullest rank of ``reserved`` holds,
    and add every frugal table's cache to its shards' storage. Returns the ratio given (None when
    every frugal table had its own)."""
    frugal_options = [so for so in best_plan if so.sharding_type in FRUGAL_TYPES]
    kind = "hbm" if topology.compute_device in {"cuda", "mtia"} else "ddr"
    world = topology.world_size
    used = [0.0] * world
    for so in best_plan:
        for shard in so.shards:
            used[shard.rank] += getattr(shard.storage, kind)  # type: ignore[index]

    def cache_bytes_at_ratio_one(so: ShardingOption) -> float:
        """Bytes of a rank's cache at ratio 1: the rows its engine serves (frugal_row_wise: the node's block)."""
        sharder = by_type[sharder_name(type(so.module[1]))]
        rows, dim = so.tensor.shape
        if so.sharding_type == FRUGAL_ROW_WISE:
            rows = -(-rows // nodes)
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
    per_engine = world if all(so.sharding_type == FRUGAL for so in frugal_options) else topology.local_world_size
    ratio = max(0.0, min([cap, 1.0 / per_engine] + fits))
    if sized and ratio < min(cap, 1.0 / per_engine):
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
    return ratio if sized else None


__all__ = ["DenseEstimateStorageReservation", "dense_tensor_estimate", "size_frugal_caches"]
