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

import warnings
from typing import Dict, List, Optional

from torch import nn
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.types import ModuleSharder, get_tensor_size_bytes

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


__all__ = ["DenseEstimateStorageReservation", "dense_tensor_estimate"]
