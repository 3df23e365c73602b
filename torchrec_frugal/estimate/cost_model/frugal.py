"""Frugal's step priced: one engine per node over the frugal tables (frugal on one machine,
frugal_row_wise across several)."""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Tuple

from ..profiles import HardwareProfile
from .primitives import Primitives
from .traffic import TableTraffic, table_traffic
from .workload import F32, INDEX_BYTES, LENGTH_BYTES, Plan, Workload


TABLE_TERMS = ("embedding_lookup", "host_reads", "embedding_update", "gradient_exchange", "flush_inline", "flushers")
"""What one frugal table adds to its engine's step (``flushers``: beside it, on the flusher threads)."""


def frugal_table_terms(
    primitives: Primitives, traffic: TableTraffic, world: int, row_bytes: float, state_bytes: float,
    resident: float = 0.0,
) -> Dict[str, Tuple[float, ...]]:
    """One frugal table's seconds on one rank of an engine of ``world`` ranks, by :data:`TABLE_TERMS`
    (each term's parts in the order they add up). The one price of a frugal table: the cost model
    sums it over a plan's frugal tables, TorchRec's perf model takes it for a frugal shard
    (``torchrec.patches.perf_evaluator.FrugalPerfEvaluator``).

    Device lookups of the rank's cached rows, host reads of its other distinct rows, the owner's
    update of its rows (on an accelerator, uncached ones first brought into dynamic slots),
    gradients staged through host memory to their owners, and the flushes: the rows due next step
    on the exchange worker at the end of the owner's update, which the next step's gate waits for
    (``flush_inline``), the rest on the flushers (on a CPU device, which has no flusher thread, all
    on the exchange worker). ``resident``: the share of the table held in the last-level cache
    (:func:`.primitives.llc_shares`), which prices its device gathers and scatters."""
    profile = primitives.profile
    owned = traffic.unique_all / world
    stored_bytes = row_bytes + state_bytes  # a row with its optimizer state, as the owner updates and flushes it
    reads: Tuple[float, ...] = (primitives.host_read(traffic.host_rows, row_bytes),)
    if not profile.device_is_host:
        reads += (primitives.host_read(traffic.owned_fresh_rows, stored_bytes),)
    if profile.device_is_host:
        inline, background = (primitives.host_write(traffic.flushed_rows, stored_bytes),), ()
    else:
        inline = (primitives.host_write(traffic.inline_rows, stored_bytes),)
        background = (primitives.host_write(traffic.flushed_rows - traffic.inline_rows, stored_bytes),)
    cached_rows = traffic.unique_rank - traffic.host_rows
    return {
        "embedding_lookup": (primitives.device_gather(cached_rows, row_bytes, resident) + traffic.ids * profile.frugal_id_s,),
        "host_reads": reads,
        "embedding_update": (primitives.device_gather(owned, stored_bytes, resident)
                             + primitives.device_scatter(owned, stored_bytes, resident),),
        "gradient_exchange": (primitives.d2h(traffic.unique_rank * row_bytes)
                              + 2 * primitives.memcpy(traffic.unique_rank * (row_bytes + INDEX_BYTES))
                              + primitives.h2d(owned * row_bytes),),
        "flush_inline": inline,
        "flushers": background,
    }  # fmt: skip


class FrugalCost:
    """The frugal tables of a plan: their engine's terms, memory and threads beside the step."""

    def __init__(self, profile: HardwareProfile) -> None:
        self.profile = profile

    def engine(
        self, workload: Workload, plan: Plan, primitives: Primitives, traffic: List[TableTraffic]
    ) -> Tuple[Dict[str, float], float, Dict[str, float], Dict[str, float]]:
        """Frugal's step: device lookups of the rank's cached rows, host reads of every other
        distinct row, gradients exchanged through host memory, the owners' updates, the rows due
        next step written before its gate opens (the exchange worker, which the gate waits for),
        the rest flushed in the background (on a CPU device, which has no flusher thread, by the
        exchange worker too).
        Returns (terms, bytes per device, seconds per step of each thread beside the step, details)."""
        world = workload.world_size
        profile = self.profile
        state_bytes = workload.state_floats_per_row * F32
        terms: Dict[str, float] = {}
        sums = dict.fromkeys(TABLE_TERMS, 0.0)
        memory = 0.0
        for table, counts in zip(workload.tables, traffic):
            resident = primitives.resident.get(table.name, 0.0)
            for term, parts in frugal_table_terms(primitives, counts, world, table.dim * F32, state_bytes, resident).items():
                for seconds in parts:
                    sums[term] += seconds
            memory += int(plan.cache_ratio * table.rows + 1e-9) * (table.dim * F32 + state_bytes)
        lookup, reads, update, exchange, inline, background = (sums[term] for term in TABLE_TERMS)
        unique = sum(counts.unique_rank for counts in traffic)
        terms["embedding_lookup"] = lookup
        terms["host_reads"] = reads
        terms["embedding_update"] = update
        terms["gradient_exchange"] = exchange + (profile.sync_latency_s if world > 1 else 0.0)
        terms["flush_inline"] = inline
        # The planned step: the training thread keeps a flat share of frugal host work; the batch's
        # plan (ids checked and deduplicated, the bags laid out) is made on the planner thread, the
        # exchange's announce and bookkeeping (and the lookahead's window) on the exchange worker,
        # both beside the step (docs/cost_model.md, "Frugal's threads").
        ids = sum(counts.ids for counts in traffic)
        terms["engine_host"] = profile.frugal_train_thread_s
        lookahead_row_s = profile.lookahead_row_s if plan.lookahead else 0.0
        threads = {
            "planner_thread": profile.planner_step_s + ids * profile.planner_id_s + unique * profile.planner_row_s,
            "exchange_worker": profile.exchange_step_s + unique * (profile.exchange_row_s + lookahead_row_s),
            "flushers": background,
        }  # fmt: skip
        details = {
            "cache_hit_ratio": sum(counts.hit_ratio * counts.ids for counts in traffic) / ids,
            "host_rows_per_rank": sum(counts.host_rows for counts in traffic),
            "rows_flushed_per_step": world * sum(counts.flushed_rows for counts in traffic),
            "cache_ratio": plan.cache_ratio,
            "lookahead": float(plan.lookahead),
        }
        return terms, memory, threads, details

    def price(
        self, workload: Workload, plan: Plan, primitives: Primitives
    ) -> Tuple[Dict[str, float], float, Dict[str, float], Dict[str, float], List[TableTraffic]]:
        """Frugal tables. On one node: one engine over every rank (``frugal``; ``frugal_row_wise``
        with its one block is the same). Across N nodes (``frugal_row_wise``): a table's rows
        split into one block per node; a rank's ids go to the ranks of its local rank on the
        blocks' nodes (TorchRec's row-wise input dist over the N-rank cross-node group), where the
        node's engine serves them as a one-node Frugal over the block (about B ids per rank);
        the partial pooled sums of the N B samples a rank received go back reduce-scattered over
        the same group, their gradients the same way. Returns :meth:`engine`'s results and the traffic."""
        device_is_host = self.profile.device_is_host
        if workload.nodes == 1:
            traffic = [table_traffic(table, workload, plan, device_is_host) for table in workload.tables]
            return (*self.engine(workload, plan, primitives, traffic), traffic)
        nodes, ranks_per_node, batch_size = workload.nodes, workload.ranks_per_node, workload.batch_size
        table_count = len(workload.tables)
        blocks = tuple(replace(table, rows=-(-table.rows // nodes), distribution=table.distribution.block(nodes))
                       for table in workload.tables)  # fmt: skip
        draws = None if workload.presample_draws is None else workload.presample_draws / nodes
        node = replace(workload, tables=blocks, world_size=ranks_per_node, nodes=1, presample_draws=draws)
        traffic = [table_traffic(block, node, plan, device_is_host) for block in blocks]
        node_primitives = Primitives(self.profile, ranks_per_node, resident=primitives.resident)
        terms, memory, threads, details = self.engine(node, plan, node_primitives, traffic)
        dim_sum = sum(table.dim for table in workload.tables)
        ids = sum(counts.ids for counts in traffic)  # a rank's own ids, spread over the N blocks
        # With L >= 1 a batch's ids cross L steps early, to feed the owning nodes' windows, and its
        # step reuses what they delivered: once either way.
        sent = ids * INDEX_BYTES * (nodes - 1) / nodes + (nodes - 1) * batch_size * table_count * LENGTH_BYTES
        terms["input_all_to_all"] = primitives.exchange(0.0, sent, 0, nodes - 1)
        pooled_bytes = (nodes - 1) * batch_size * dim_sum * F32
        terms["output_all_to_all"] = primitives.exchange(0.0, pooled_bytes, 0, nodes - 1, calls=2)
        # pooled partial sums of N B samples
        terms["embedding_lookup"] += primitives.device_stream(nodes * batch_size * dim_sum * F32)
        return terms, memory, threads, details, traffic
