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
    p: Primitives, x: TableTraffic, world: int, row_bytes: float, state_bytes: float, resident: float = 0.0
) -> Dict[str, Tuple[float, ...]]:
    """One frugal table's seconds on one rank of an engine of ``world`` ranks, by :data:`TABLE_TERMS`
    (each term's parts in the order they add up). The one price of a frugal table: the cost model
    sums it over a plan's frugal tables, TorchRec's perf model takes it for a frugal shard
    (``torchrec.patches.FrugalPerfEvaluator``).

    Device lookups of the rank's cached rows, host reads of its other distinct rows, the owner's
    update of its rows (on an accelerator, uncached ones first brought into dynamic slots),
    gradients staged through host memory to their owners, and the flushes: the rows due next step
    on the exchange worker at the end of the owner's update, which the next step's gate waits for
    (``flush_inline``), the rest on the flushers (on a CPU device, which has no flusher thread, all
    on the exchange worker). ``resident``: the share of the table held in the last-level cache
    (:func:`.primitives.llc_shares`), which prices its device gathers and scatters."""
    hw, rb, sf = p.hw, row_bytes, state_bytes
    owned = x.unique_all / world
    reads: Tuple[float, ...] = (p.host_read(x.host_rows, rb),)
    if not hw.device_is_host:
        reads += (p.host_read(x.owned_fresh_rows, rb + sf),)
    if hw.device_is_host:
        inline, background = (p.host_write(x.flushed_rows, rb + sf),), ()
    else:
        inline, background = (p.host_write(x.inline_rows, rb + sf),), (p.host_write(x.flushed_rows - x.inline_rows, rb + sf),)
    return {
        "embedding_lookup": (p.device_gather(x.unique_rank - x.host_rows, rb, resident) + x.ids * hw.frugal_id_s,),
        "host_reads": reads,
        "embedding_update": (p.device_gather(owned, rb + sf, resident) + p.device_scatter(owned, rb + sf, resident),),
        "gradient_exchange": (p.d2h(x.unique_rank * rb) + 2 * p.memcpy(x.unique_rank * (rb + INDEX_BYTES)) + p.h2d(owned * rb),),
        "flush_inline": inline,
        "flushers": background,
    }


class FrugalCost:
    """The frugal tables of a plan: their engine's terms, memory and threads beside the step."""

    def __init__(self, hw: HardwareProfile) -> None:
        self.hw = hw

    def engine(
        self, w: Workload, plan: Plan, p: Primitives, tr: List[TableTraffic]
    ) -> Tuple[Dict[str, float], float, Dict[str, float], Dict[str, float]]:
        """Frugal's step: device lookups of the rank's cached rows, host reads of every other
        distinct row, gradients exchanged through host memory, the owners' updates, the rows due
        next step written before its gate opens (the exchange worker, which the gate waits for),
        the rest flushed in the background (on a CPU device, which has no flusher thread, by the
        exchange worker too).
        Returns (terms, bytes per device, seconds per step of each thread beside the step, details)."""
        W = w.world_size
        hw = self.hw
        sf = w.state_floats_per_row * F32
        terms: Dict[str, float] = {}
        sums = dict.fromkeys(TABLE_TERMS, 0.0)
        mem = 0.0
        for t, x in zip(w.tables, tr):
            for k, parts in frugal_table_terms(p, x, W, t.dim * F32, sf, p.resident.get(t.name, 0.0)).items():
                for v in parts:
                    sums[k] += v
            mem += int(plan.cache_ratio * t.rows + 1e-9) * (t.dim * F32 + sf)
        lookup, reads, update, exchange, inline, background = (sums[k] for k in TABLE_TERMS)
        unique = sum(x.unique_rank for x in tr)
        terms["embedding_lookup"] = lookup
        terms["host_reads"] = reads
        terms["embedding_update"] = update
        terms["gradient_exchange"] = exchange + (hw.sync_latency_s if W > 1 else 0.0)
        terms["flush_inline"] = inline
        # The planned step: the training thread keeps a flat share of frugal host work; the batch's
        # plan (ids checked and deduplicated, the bags laid out) is made on the planner thread, the
        # exchange's announce and bookkeeping (and the lookahead's window) on the exchange worker,
        # both beside the step (docs/cost_model.md, "Frugal's threads").
        ids = sum(x.ids for x in tr)
        terms["engine_host"] = hw.frugal_train_thread_s
        threads = {
            "planner_thread": hw.planner_step_s + ids * hw.planner_id_s + unique * hw.planner_row_s,
            "exchange_worker": hw.exchange_step_s + unique * (hw.exchange_row_s + (hw.lookahead_row_s if plan.lookahead else 0.0)),
            "flushers": background,
        }  # fmt: skip
        details = {
            "cache_hit_ratio": sum(x.hit_ratio * x.ids for x in tr) / ids,
            "host_rows_per_rank": sum(x.host_rows for x in tr),
            "rows_flushed_per_step": W * sum(x.flushed_rows for x in tr),
            "cache_ratio": plan.cache_ratio,
            "lookahead": float(plan.lookahead),
        }
        return terms, mem, threads, details

    def price(
        self, w: Workload, plan: Plan, p: Primitives
    ) -> Tuple[Dict[str, float], float, Dict[str, float], Dict[str, float], List[TableTraffic]]:
        """Frugal tables. On one node: one engine over every rank (``frugal``; ``frugal_row_wise``
        with its one block is the same). Across N nodes (``frugal_row_wise``): a table's rows
        split into one block per node; a rank's ids go to the ranks of its local rank on the
        blocks' nodes (TorchRec's row-wise input dist over the N-rank cross-node group), where the
        node's engine serves them as a one-node Frugal over the block (about B ids per rank);
        the partial pooled sums of the N B samples a rank received go back reduce-scattered over
        the same group, their gradients the same way. Returns :meth:`engine`'s results and the traffic."""
        if w.nodes == 1:
            traffic = [table_traffic(t, w, plan, self.hw.device_is_host) for t in w.tables]
            return (*self.engine(w, plan, p, traffic), traffic)
        N, R, B, T = w.nodes, w.ranks_per_node, w.batch_size, len(w.tables)
        blocks = tuple(replace(t, rows=-(-t.rows // N), distribution=t.distribution.block(N)) for t in w.tables)
        draws = None if w.presample_draws is None else w.presample_draws / N
        node = replace(w, tables=blocks, world_size=R, nodes=1, presample_draws=draws)
        traffic = [table_traffic(t, node, plan, self.hw.device_is_host) for t in blocks]
        terms, mem, threads, details = self.engine(node, plan, Primitives(self.hw, R, resident=p.resident), traffic)
        dim_sum = sum(t.dim for t in w.tables)
        ids = sum(t.ids for t in traffic)  # a rank's own ids, spread over the N blocks
        # With L >= 1 a batch's ids cross L steps early, to feed the owning nodes' windows, and its
        # step reuses what they delivered: once either way.
        sent = ids * INDEX_BYTES * (N - 1) / N + (N - 1) * B * T * LENGTH_BYTES
        terms["input_all_to_all"] = p.exchange(0.0, sent, 0, N - 1)
        terms["output_all_to_all"] = p.exchange(0.0, (N - 1) * B * dim_sum * F32, 0, N - 1, calls=2)
        terms["embedding_lookup"] += p.device_stream(N * B * dim_sum * F32)  # pooled partial sums of N B samples
        return terms, mem, threads, details, traffic
