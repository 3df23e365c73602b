"""CostModel: a plan's predicted step on a hardware profile, the sum of its named terms."""
from __future__ import annotations

from dataclasses import replace
from typing import Dict

from ..profiles import HardwareProfile
from .frugal import FrugalCost
from .primitives import Primitives, llc_shares
from .stock import StockCost
from .traffic import table_traffic
from .workload import F32, FRUGAL, FRUGAL_KINDS, FRUGAL_ROW_WISE, MEMORY_HEADROOM, TERMS, Plan, StepCost, Workload, split_choice

DEVICE_TERMS = ("dense_compute", "embedding_lookup", "embedding_update", "uvm_reads", "uvm_writes")
HOST_TERMS = ("framework", "engine_host", "gradient_exchange", "flush_inline", "host_reads")


class CostModel:
    """Predicted step time of a plan on a hardware profile, term by term."""

    def __init__(self, profile: HardwareProfile) -> None:
        self.profile = profile
        self.stock = StockCost(profile)
        self.frugal = FrugalCost(profile)

    def threads(self, workload: Workload) -> int:
        if not self.profile.device_is_host:
            return 1
        return workload.threads_per_rank or max(1, self.profile.host_cores // workload.ranks_per_node)

    def predict(self, workload: Workload, plan: Plan) -> StepCost:
        """The predicted step of ``plan``: the terms every step pays (dense compute, DDP, the
        training loop), plus for each sharding the terms of its tables, priced as if they were the
        only tables (the frugal tables share one engine per node: its fixed host work, barrier,
        gradient exchange and flushers; the tables of one stock sharding share its all-to-alls;
        the share of each table the last-level cache holds counts every table of the node),
        then the gate stall and the contention of the whole step."""
        profile = self.profile
        primitives = Primitives(profile, workload.world_size, workload.ranks_per_node, resident=self._llc_resident(workload))
        terms = dict.fromkeys(TERMS, 0.0)
        terms.update(self._common(workload, primitives))
        groups = plan.groups(workload)
        if set(FRUGAL_KINDS) <= set(groups):
            raise ValueError(f"a plan takes {FRUGAL} (one node) or {FRUGAL_ROW_WISE} (several), not both")
        by_sharding: Dict[str, Dict[str, float]] = {}
        memory = ids = unique = prefetch = 0.0
        threads: Dict[str, float] = {}
        frugal_details: Dict[str, float] = {}
        for sharding, indices in groups.items():
            part = replace(workload, tables=tuple(workload.tables[i] for i in indices))
            if sharding == FRUGAL and workload.nodes > 1:
                raise ValueError(f"{FRUGAL} serves the ranks of one machine; across {workload.nodes} nodes use {FRUGAL_ROW_WISE}")
            if sharding in FRUGAL_KINDS:
                body, part_memory, threads, frugal_details, traffic = self.frugal.price(part, plan, primitives)
            else:
                traffic = [table_traffic(table, part, plan, profile.device_is_host) for table in part.tables]
                body, part_memory, prefetch_s = self.stock.price(part, sharding, primitives, traffic, plan)
                prefetch += prefetch_s
            by_sharding[sharding] = body
            for term, seconds in body.items():
                terms[term] += seconds
            memory += part_memory  # per group, its fullest device: an upper bound when groups fill different ones
            ids += sum(counts.ids for counts in traffic)
            unique += sum(counts.unique_rank for counts in traffic)
        background = sum(threads.values())
        if threads:
            # Frugal's planner thread, exchange worker and flushers run beside the step, each on its
            # own thread: the step waits only for the one that takes longer than the rest of it.
            terms["gate_stall"] = max(0.0, max(threads.values()) - sum(terms.values()))
        if prefetch:
            # the prefetch pipeline fills the cache for the next batch beside this step, on its own stream
            terms["prefetch_stall"] = max(0.0, prefetch - sum(terms.values()))
        terms["contention"] = self._contention(workload, terms, background)
        step = sum(terms.values())
        dense_bytes = workload.dense.params * F32 * (2.0 + workload.dense_state_floats)
        host = self._host_bytes(workload, plan, memory + dense_bytes)
        details = {"ids_per_rank": ids, "unique_rows_per_rank": unique, **frugal_details,
                   **{f"{name}_ms": 1e3 * seconds for name, seconds in threads.items()},
                   **({"uvm_prefetch_ms": 1e3 * prefetch} if prefetch else {}),
                   "embedding_bytes_within_node_per_step": workload.world_size * primitives.bytes_within,
                   "embedding_bytes_between_nodes_per_step": workload.world_size * primitives.bytes_between}  # fmt: skip
        return StepCost(
            sharding=next(iter(groups)) if len(groups) == 1 else "mixed",
            terms=terms,
            samples_per_second=workload.world_size * workload.batch_size / step,
            fits=memory + dense_bytes <= MEMORY_HEADROOM * profile.device_memory_bytes
            and (profile.host_memory_bytes is None or host <= MEMORY_HEADROOM * profile.host_memory_bytes),
            memory_bytes_per_device=memory + dense_bytes,
            host_memory_bytes_per_node=host,
            background_s=background,
            details=details,
            by_sharding=by_sharding,
        )

    def _llc_resident(self, workload: Workload) -> Dict[str, float]:
        """Share of each table held in a node's last-level cache (:func:`.primitives.llc_shares`):
        a node holds 1/nodes of every table's rows with their optimizer state. Empty on a profile
        without ``llc_bytes``."""
        if not self.profile.has_llc:
            return {}
        nbytes = [table.rows * (table.dim + workload.state_floats_per_row) * F32 / workload.nodes for table in workload.tables]
        shares = llc_shares(nbytes, float(self.profile.llc_bytes))
        return dict(zip((table.name for table in workload.tables), map(float, shares)))

    def _host_bytes(self, workload: Workload, plan: Plan, per_device: float) -> float:
        """Host memory of one node: the frugal tables, whole, once per node (frugal_row_wise: the
        node's block) with their optimizer state; the offloaded (UVM) tables of the node's ranks with
        the state FBGEMM keeps in UVM (all but row-wise state); on a CPU device also every rank's
        own memory."""
        blocks = workload.nodes if workload.nodes > 1 else 1
        state_floats = workload.state_floats_per_row
        frugal = sum(-(-table.rows // blocks) * (table.dim + state_floats) * F32
                     for table in workload.tables if plan.sharding_of(table.name) in FRUGAL_KINDS)  # fmt: skip
        host_state = 0.0 if state_floats <= 1.0 else state_floats
        uvm = sum(table.rows * (table.dim + host_state) * F32 / blocks
                  for table in workload.tables if split_choice(plan.sharding_of(table.name))[1] != "fused")  # fmt: skip
        return frugal + uvm + (workload.ranks_per_node * per_device if self.profile.device_is_host else 0.0)

    def _common(self, workload: Workload, primitives: Primitives) -> Dict[str, float]:
        """Dense forward + backward (3x the forward FLOPs) and the dense optimizer, DDP's
        all-reduce of the dense gradients, and the training loop's own time."""
        dense, profile = workload.dense, self.profile
        optimizer = primitives.device_stream(dense.params * F32 * (3.0 + 2.0 * workload.dense_state_floats))
        ids = sum(workload.batch_size * table.pooling for table in workload.tables)
        forward_backward_flops = 3.0 * dense.flops_per_sample * workload.batch_size
        return {
            "dense_compute": primitives.dense(forward_backward_flops, 3 * dense.ops, self.threads(workload)) + optimizer,
            "dense_allreduce": primitives.all_reduce(dense.params * F32),
            "framework": profile.framework_step_s + profile.framework_id_s * ids
            + (profile.framework_dist_step_s if workload.world_size > 1 else 0.0),
        }

    def _contention(self, workload: Workload, terms: Dict[str, float], background: float) -> float:
        """Wait for a shared resource beyond the rank's own critical path.

        CPU device: every term is CPU time (dense on ``threads`` threads), and a node's W ranks
        plus their background flushing share ``host_cores``: the step lasts at least W x CPU / cores.
        Accelerator: ranks beyond ``devices`` share them (W / devices x device terms), and the
        ranks' host-side terms plus their threads beside the step (planner, exchange worker,
        flushers) share the host cores.
        """
        ranks, profile = workload.ranks_per_node, self.profile  # each node's ranks share its cores and devices
        path = sum(terms.values())
        if profile.device_is_host:
            cpu = path - terms["gate_stall"] + (self.threads(workload) - 1) * terms["dense_compute"] + background
            need = ranks * cpu / profile.host_cores
        else:
            device = ranks * sum(terms[term] for term in DEVICE_TERMS) / profile.devices
            host = ranks * (sum(terms[term] for term in HOST_TERMS) + background) / profile.host_cores
            need = max(device, host)
        return max(0.0, need - path)
