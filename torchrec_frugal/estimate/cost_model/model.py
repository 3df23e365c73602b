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

    def __init__(self, hw: HardwareProfile) -> None:
        self.hw = hw
        self.stock = StockCost(hw)
        self.frugal = FrugalCost(hw)

    def threads(self, w: Workload) -> int:
        if not self.hw.device_is_host:
            return 1
        return w.threads_per_rank or max(1, self.hw.host_cores // w.ranks_per_node)

    def predict(self, w: Workload, plan: Plan) -> StepCost:
        """The predicted step of ``plan``: the terms every step pays (dense compute, DDP, the
        training loop), plus for each sharding the terms of its tables, priced as if they were the
        only tables (the frugal tables share one engine per node: its fixed host work, barrier,
        gradient exchange and flushers; the tables of one stock sharding share its all-to-alls;
        the share of each table the last-level cache holds counts every table of the node),
        then the gate stall and the contention of the whole step."""
        p = Primitives(self.hw, w.world_size, w.ranks_per_node, resident=self._llc_resident(w))
        terms = dict.fromkeys(TERMS, 0.0)
        terms.update(self._common(w, p))
        groups = plan.groups(w)
        if set(FRUGAL_KINDS) <= set(groups):
            raise ValueError(f"a plan takes {FRUGAL} (one node) or {FRUGAL_ROW_WISE} (several), not both")
        by_sharding: Dict[str, Dict[str, float]] = {}
        mem = ids = unique = prefetch = 0.0
        threads: Dict[str, float] = {}
        frugal_details: Dict[str, float] = {}
        for sharding, idx in groups.items():
            part = replace(w, tables=tuple(w.tables[i] for i in idx))
            if sharding == FRUGAL and w.nodes > 1:
                raise ValueError(f"{FRUGAL} serves the ranks of one machine; across {w.nodes} nodes use {FRUGAL_ROW_WISE}")
            if sharding in FRUGAL_KINDS:
                body, m, threads, frugal_details, traffic = self.frugal.price(part, plan, p)
            else:
                traffic = [table_traffic(t, part, plan, self.hw.device_is_host) for t in part.tables]
                body, m, bg = self.stock.price(part, sharding, p, traffic, plan)
                prefetch += bg
            by_sharding[sharding] = body
            for k, v in body.items():
                terms[k] += v
            mem += m  # per group, its fullest device: an upper bound when groups fill different ones
            ids += sum(t.ids for t in traffic)
            unique += sum(t.unique_rank for t in traffic)
        background = sum(threads.values())
        if threads:
            # Frugal's planner thread, exchange worker and flushers run beside the step, each on its
            # own thread: the step waits only for the one that takes longer than the rest of it.
            terms["gate_stall"] = max(0.0, max(threads.values()) - sum(terms.values()))
        if prefetch:
            # the prefetch pipeline fills the cache for the next batch beside this step, on its own stream
            terms["prefetch_stall"] = max(0.0, prefetch - sum(terms.values()))
        terms["contention"] = self._contention(w, terms, background)
        step = sum(terms.values())
        dense_bytes = w.dense.params * F32 * (2.0 + w.dense_state_floats)
        host = self._host_bytes(w, plan, mem + dense_bytes)
        details = {"ids_per_rank": ids, "unique_rows_per_rank": unique, **frugal_details,
                   **{f"{k}_ms": 1e3 * v for k, v in threads.items()},
                   **({"uvm_prefetch_ms": 1e3 * prefetch} if prefetch else {}),
                   "embedding_bytes_within_node_per_step": w.world_size * p.bytes_within,
                   "embedding_bytes_between_nodes_per_step": w.world_size * p.bytes_between}  # fmt: skip
        return StepCost(
            sharding=next(iter(groups)) if len(groups) == 1 else "mixed",
            terms=terms,
            samples_per_second=w.world_size * w.batch_size / step,
            fits=mem + dense_bytes <= MEMORY_HEADROOM * self.hw.device_memory_bytes
            and (self.hw.host_memory_bytes is None or host <= MEMORY_HEADROOM * self.hw.host_memory_bytes),
            memory_bytes_per_device=mem + dense_bytes,
            host_memory_bytes_per_node=host,
            background_s=background,
            details=details,
            by_sharding=by_sharding,
        )

    def _llc_resident(self, w: Workload) -> Dict[str, float]:
        """Share of each table held in a node's last-level cache (:func:`.primitives.llc_shares`):
        a node holds 1/nodes of every table's rows with their optimizer state. Empty on a profile
        without ``llc_bytes``."""
        if not self.hw.has_llc:
            return {}
        nbytes = [t.rows * (t.dim + w.state_floats_per_row) * F32 / w.nodes for t in w.tables]
        return dict(zip((t.name for t in w.tables), map(float, llc_shares(nbytes, float(self.hw.llc_bytes)))))

    def _host_bytes(self, w: Workload, plan: Plan, per_device: float) -> float:
        """Host memory of one node: the frugal tables, whole, once per node (frugal_row_wise: the
        node's block) with their optimizer state; the offloaded (UVM) tables of the node's ranks with
        the state FBGEMM keeps in UVM (all but row-wise state); on a CPU device also every rank's
        own memory."""
        blocks = w.nodes if w.nodes > 1 else 1
        frugal = sum(-(-t.rows // blocks) * (t.dim + w.state_floats_per_row) * F32
                     for t in w.tables if plan.sharding_of(t.name) in FRUGAL_KINDS)  # fmt: skip
        host_state = 0.0 if w.state_floats_per_row <= 1.0 else w.state_floats_per_row
        uvm = sum(t.rows * (t.dim + host_state) * F32 / blocks
                  for t in w.tables if split_choice(plan.sharding_of(t.name))[1] != "fused")  # fmt: skip
        return frugal + uvm + (w.ranks_per_node * per_device if self.hw.device_is_host else 0.0)

    def _common(self, w: Workload, p: Primitives) -> Dict[str, float]:
        """Dense forward + backward (3x the forward FLOPs) and the dense optimizer, DDP's
        all-reduce of the dense gradients, and the training loop's own time."""
        d = w.dense
        optimizer = p.device_stream(d.params * F32 * (3.0 + 2.0 * w.dense_state_floats))
        ids = sum(w.batch_size * t.pooling for t in w.tables)
        return {
            "dense_compute": p.dense(3.0 * d.flops_per_sample * w.batch_size, 3 * d.ops, self.threads(w)) + optimizer,
            "dense_allreduce": p.all_reduce(d.params * F32),
            "framework": self.hw.framework_step_s + self.hw.framework_id_s * ids
            + (self.hw.framework_dist_step_s if w.world_size > 1 else 0.0),
        }


    def _contention(self, w: Workload, terms: Dict[str, float], background: float) -> float:
        """Wait for a shared resource beyond the rank's own critical path.

        CPU device: every term is CPU time (dense on ``threads`` threads), and a node's W ranks
        plus their background flushing share ``host_cores``: the step lasts at least W x CPU / cores.
        Accelerator: ranks beyond ``devices`` share them (W / devices x device terms), and the
        ranks' host-side terms plus their threads beside the step (planner, exchange worker,
        flushers) share the host cores.
        """
        W, hw = w.ranks_per_node, self.hw  # each node's ranks share its cores and devices
        path = sum(terms.values())
        if hw.device_is_host:
            cpu = path - terms["gate_stall"] + (self.threads(w) - 1) * terms["dense_compute"] + background
            need = W * cpu / hw.host_cores
        else:
            device = W * sum(terms[k] for k in DEVICE_TERMS) / hw.devices
            host = W * (sum(terms[k] for k in HOST_TERMS) + background) / hw.host_cores
            need = max(device, host)
        return max(0.0, need - path)

