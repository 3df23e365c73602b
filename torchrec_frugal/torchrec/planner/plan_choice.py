"""The cost model's choice for FrugalShardingPlanner: a sharding per table, a cache ratio, L.

Why an explicit choice and not a TorchRec ``ShardEstimator``: TorchRec's proposers and its
partitioner compare plans by per-shard ``perf`` summed per rank, i.e. a table's cost must not
depend on the other tables. Frugal's step does: the frugal tables share one engine (its fixed
host work, the barrier of the gradient exchange, the flushers whose backlog becomes the gate
stall once it exceeds the rest of the step), the tables of one stock sharding share its
all-to-alls' latencies, and the ranks contend for the host's cores as a whole. Priced per shard,
these terms would be counted once per table or not at all. So the planner asks the cost model
for the whole plan (:func:`torchrec_frugal.estimate.cost_model.choose_plan`: a local search over per-table
shardings, each move priced by the mixed plan's predicted step), constrains every free table to
its choice, and lets TorchRec's planner place the shards and check memory as usual: TorchRec's
proposers then see one sharding type per free table, and its perf model prices a frugal shard
with the same per-table function (``cost_model.frugal_table_terms``, via
``patches.perf_evaluator.FrugalPerfEvaluator``).

The workload handed to the cost model comes from the module and the planner's inputs: the
tables of the sharded modules (rows, dim; ids per sample from the constraints' pooling factors,
else 1, TorchRec's default), the batch size and world size, the row state of the fused optimizer,
and a dense model estimated from the module's other parameters (2 FLOPs per weight per sample,
3 operators per ``nn.Linear``). Ids follow the per-table ``id_counts`` when given (pre-sample
counts), else Zipf with the skew of the DLRM example's synthetic data (:data:`DEFAULT_SKEW`).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import torch
from torch import nn
from dataclasses import replace

from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.planner.utils import sharder_name
from torchrec.distributed.types import CacheParams, ModuleSharder

from ...estimate.cost_model import FUSED_UVM_CACHING, SHARDINGS, UVM_SHARDINGS, CostModel, Plan, CostTable, DenseModel, PlanChoice, RowDistribution, Workload, choose_plan, planner_shardings, split_choice
from ...datasets import SkewConfig
from ...engine.optimizers import state_width
from ...estimate.profiles import HardwareProfile, load_profile
from ..embedding_kernel import optimizer_spec

DEFAULT_SKEW = SkewConfig()
"""Zipf skew without id counts: s = 1.2 for tables of 10,000 rows or more, 0.3 below."""


def hardware_profile(hardware: Union[str, HardwareProfile]) -> HardwareProfile:
    """A profile by name ("rtx3090"), by JSON path, or as given."""
    return hardware if isinstance(hardware, HardwareProfile) else load_profile(hardware)


class TableCandidates:
    """The embedding tables a set of sharders serves in a module, and what each may take."""

    def __init__(
        self,
        module: nn.Module,
        sharders: Sequence[ModuleSharder[nn.Module]],
        constraints: Mapping[str, ParameterConstraints],
        compute_device: str,
        nodes: int = 1,
        uvm: bool = True,
    ) -> None:
        """``uvm``: offer TorchRec's offloading (fused_uvm_caching, fused_uvm) where the sharder
        offers the kernel for ``compute_device`` (TorchRec's CPU sharders offer only fused)."""
        by_type = {sharder_name(s.module_type): s for s in sharders}
        self.shapes: Dict[str, Tuple[int, int]] = {}
        self.pooling: Dict[str, float] = {}
        self.candidates: Dict[str, Tuple[str, ...]] = {}
        self.free: Set[str] = set()  # no sharding_types constraint: the planner chooses
        self.fused_params: Dict[str, object] = {}
        table_numel = 0
        for child in module.modules():
            sharder = by_type.get(sharder_name(type(child)))
            if sharder is None:
                continue
            offered = sharder.sharding_types(compute_device)

            def offers(choice: str) -> bool:
                sharding, kernel, _ = split_choice(choice)
                if sharding not in offered:
                    return False
                return kernel == "fused" or (uvm and kernel in sharder.compute_kernels(sharding, compute_device))

            for name, param in sharder.shardable_parameters(child).items():
                table_numel += param.numel()
                c = constraints.get(name)
                if c is None or c.sharding_types is None:
                    cand = tuple(s for s in planner_shardings(nodes, "cuda" if uvm else "cpu") if offers(s))
                    self.free.add(name)
                else:  # kept as the user constrained it; modelled with its first type (and kernel) the model knows
                    kernels = [k for k in (c.compute_kernels or []) if f"table_wise:{k}" in SHARDINGS]
                    typed = [f"{s}:{kernels[0]}" if kernels and s in UVM_SHARDINGS else s for s in c.sharding_types]
                    cand = tuple(s for s in typed if s in SHARDINGS)[:1]
                if not cand:
                    continue  # a type the cost model does not price (column_wise, grid_shard)
                self.candidates[name] = cand
                self.shapes[name] = (int(param.shape[0]), int(param.shape[1]))
                self.pooling[name] = float(sum(c.pooling_factors)) if c is not None else 1.0
                self.fused_params.update(sharder.fused_params or {})
        self.dense = dense_model(module, table_numel)

    def state_floats_per_row(self) -> float:
        """Optimizer state per row of the sharders' fused optimizer (row-wise Adagrad if unknown)."""
        try:
            spec = optimizer_spec(dict(self.fused_params), "any")
        except ValueError:
            return 1.0
        return float(state_width(spec, max((d for _, d in self.shapes.values()), default=0)))


def dense_model(module: nn.Module, table_numel: int) -> DenseModel:
    """The module's parameters other than the tables' ``table_numel``: 2 FLOPs per weight and
    sample, 3 operators per ``nn.Linear`` (an estimate: interactions are left out)."""
    params = max(0, sum(p.numel() for p in module.parameters()) - table_numel)
    linears = sum(isinstance(m, nn.Linear) for m in module.modules())
    return DenseModel(flops_per_sample=2.0 * params, params=params, ops=3 * linears)


def choose(
    tables: TableCandidates,
    hardware: HardwareProfile,
    batch_size: int,
    world_size: int,
    cache_ratios: Sequence[float],
    id_counts: Optional[Mapping[str, Union[torch.Tensor, Sequence[float]]]] = None,
    zipf_s: Optional[float] = None,
    nodes: int = 1,
) -> Tuple[Workload, PlanChoice]:
    """The workload of ``tables`` on ``world_size`` ranks over ``nodes`` machines, and the cost
    model's choice for it (predictions)."""
    cost_tables: List[CostTable] = []
    for name, (rows, dim) in tables.shapes.items():
        counts = (id_counts or {}).get(name)
        if counts is not None:
            dist = RowDistribution.from_counts(torch.as_tensor(counts).reshape(-1).tolist())
        else:
            dist = RowDistribution.zipf(rows, DEFAULT_SKEW.s_for(rows) if zipf_s is None else zipf_s)
        cost_tables.append(CostTable(name, rows, dim, dist, tables.pooling[name]))
    w = Workload(
        tables=tuple(cost_tables),
        dense=tables.dense,
        batch_size=batch_size,
        world_size=world_size,
        state_floats_per_row=tables.state_floats_per_row(),
        nodes=nodes,
    )
    return w, choose_plan(CostModel(hardware), w, tables.candidates, cache_ratios=cache_ratios)


def constrain(c: ParameterConstraints, plan: Optional[Plan]) -> ParameterConstraints:
    """A free table's constraint once chosen: a ``sharding:kernel`` choice (TorchRec's offloading)
    becomes TorchRec's sharding type, ``compute_kernels=[kernel]`` and, for fused_uvm_caching, the
    plan's ``cache_params.load_factor`` (``prefetch_pipeline`` with the prefetch pipeline)."""
    if not c.sharding_types or ":" not in c.sharding_types[0]:
        return c
    sharding, kernel, prefetch = split_choice(c.sharding_types[0])
    out = replace(c, sharding_types=[sharding], compute_kernels=[kernel])
    if kernel == FUSED_UVM_CACHING:
        load_factor = plan.uvm_load_factor if plan is not None else None
        params = c.cache_params or CacheParams()
        out = replace(out, cache_params=replace(params, load_factor=load_factor, prefetch_pipeline=prefetch or None))
    return out
