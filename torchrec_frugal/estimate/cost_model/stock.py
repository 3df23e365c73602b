"""TorchRec's shardings priced: table_wise, row_wise, table_row_wise and data_parallel with the
FUSED kernel; the offloading kernels go to :mod:`.uvm`."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from ..profiles import HardwareProfile
from .primitives import Primitives, assign_tables
from .traffic import TableTraffic
from .uvm import UvmCost
from .workload import F32, INDEX_BYTES, LENGTH_BYTES, Plan, Workload, split_choice


class StockCost:
    """TorchRec's fused TBE kernels and all-to-alls, sharding by sharding, for the tables of one group."""

    def __init__(self, hw: HardwareProfile) -> None:
        self.hw = hw
        self.uvm = UvmCost(hw)

    def price(
        self, w: Workload, choice: str, p: Primitives, tr: List[TableTraffic], plan: Optional[Plan] = None
    ) -> Tuple[Dict[str, float], float, float]:
        """TorchRec's fused TBE kernels (lookup, then the optimizer on the distinct rows in the
        backward) plus its all-to-alls; returns (terms, bytes of tables per device, seconds of
        cache prefetch beside the step). A ``sharding:kernel`` choice prices TorchRec's offloading
        (:class:`.uvm.UvmCost`)."""
        sharding, kernel, prefetch = split_choice(choice)
        if kernel != "fused":
            return self.uvm.price(w, sharding, kernel, prefetch, p, tr, plan or Plan(choice))
        W, B, T = w.world_size, w.batch_size, len(w.tables)
        rb = [t.dim * F32 for t in w.tables]
        sb = [t.dim * F32 + w.state_floats_per_row * F32 for t in w.tables]  # a row with its state
        llc = [p.resident.get(t.name, 0.0) for t in w.tables]

        def lookup(i: int, ids: float, rows: float) -> float:
            """Each distinct row comes from memory once (or from the last-level cache, for the
            share of its table held there); every id costs the kernel's per-id work (repeats of a
            row hit the caches: kernel_id_s is measured on a cache-resident table)."""
            return p.device_gather(rows, rb[i], llc[i]) + ids * self.hw.kernel_id_s

        def update(i: int, rows: float) -> float:
            return p.device_gather(rows, sb[i], llc[i]) + p.device_scatter(rows, sb[i], llc[i])

        dim_sum = sum(t.dim for t in w.tables)
        ids_sent = sum(t.ids for t in tr) * (W - 1) / W
        terms: Dict[str, float] = {}
        if sharding == "table_wise":
            costs = [lookup(i, W * t.ids, t.unique_all) + update(i, t.unique_all) for i, t in enumerate(tr)]
            ranks = assign_tables(self._placement_costs(w, tr, costs), W)
            busiest = max(ranks, key=lambda r: sum(costs[i] for i in r))
            terms["embedding_lookup"] = sum(lookup(i, W * tr[i].ids, tr[i].unique_all) for i in busiest)
            terms["embedding_update"] = sum(update(i, tr[i].unique_all) for i in busiest)
            terms["input_all_to_all"] = p.all_to_all(ids_sent * INDEX_BYTES + B * T * LENGTH_BYTES * (W - 1) / W)
            # pooled embeddings out in the forward, their gradients back in the backward
            terms["output_all_to_all"] = p.all_to_all(B * dim_sum * F32 * (W - 1) / W, calls=2)
            mem = max(sum(w.tables[i].rows * sb[i] for i in r) for r in ranks)
        elif sharding == "table_row_wise" and w.nodes > 1:
            terms, mem = self._table_row_wise(w, p, tr, lookup, update)
        elif sharding in ("row_wise", "table_row_wise"):
            # One machine: table_row_wise shards every table row-wise over the host's ranks, as row_wise.
            terms["embedding_lookup"] = sum(lookup(i, t.ids, t.unique_all / W) + p.device_stream(W * B * w.tables[i].dim * F32)
                                            for i, t in enumerate(tr))  # fmt: skip
            terms["embedding_update"] = sum(update(i, t.unique_all / W) for i, t in enumerate(tr))
            terms["input_all_to_all"] = p.all_to_all(ids_sent * INDEX_BYTES + (W - 1) * B * T * LENGTH_BYTES)
            # partial sums of all W x B samples: reduce-scatter forward, all-gather of gradients backward
            terms["output_all_to_all"] = p.all_to_all((W - 1) * B * dim_sum * F32, calls=2)
            mem = sum(t.rows * sb[i] for i, t in enumerate(w.tables)) / W
        elif sharding == "data_parallel":
            terms["embedding_lookup"] = sum(lookup(i, t.ids, t.unique_rank) for i, t in enumerate(tr))
            # dense gradients of whole tables: zero + accumulate, then the dense optimizer over every row
            terms["embedding_update"] = sum(p.device_stream(t.rows * (2 * rb[i] + 3 * rb[i] + 2 * (sb[i] - rb[i])))
                                            for i, t in enumerate(w.tables))  # fmt: skip
            terms["table_allreduce"] = p.all_reduce(sum(t.rows * rb[i] for i, t in enumerate(w.tables)))
            mem = sum(t.rows * (rb[i] + sb[i]) for i, t in enumerate(w.tables))
        else:
            raise ValueError(f"unknown stock sharding {sharding!r}")
        return terms, mem, 0.0


    def _placement_costs(self, w: Workload, tr: List[TableTraffic], costs: List[float]) -> List[float]:
        """What TorchRec's greedy partitioner balances, largest first. Its estimates scale with the
        ids and the row size, not with the distinct rows or the cache; the model's own table costs
        stand in for them where they scale alike. On a profile that prices the last-level cache
        (fitted to the training loop: a per-row rate far from the per-id one) they do not, and
        the placement follows the ids and row sizes."""
        if not self.hw.has_llc:
            return costs
        return [w.world_size * x.ids * t.dim for t, x in zip(w.tables, tr)]

    def _table_row_wise(
        self, w: Workload, p: Primitives, tr: List[TableTraffic], lookup: Callable[[int, float, float], float],
        update: Callable[[int, float], float],
    ) -> Tuple[Dict[str, float], float]:
        """TorchRec's table_row_wise across nodes: each table on one node (greedy, largest first),
        its rows split over that node's R ranks. Ids go to the table's node; partial pooled sums
        of all W B samples are reduce-scattered inside the node, then the N B samples each rank
        then holds go to their nodes (and the gradients back the same way)."""
        W, N, R, B = w.world_size, w.nodes, w.ranks_per_node, w.batch_size
        sb = [t.dim * F32 + w.state_floats_per_row * F32 for t in w.tables]
        costs = [lookup(i, W * t.ids, t.unique_all) + update(i, t.unique_all) for i, t in enumerate(tr)]
        placed = assign_tables(self._placement_costs(w, tr, costs), N)
        node = max(placed, key=lambda n: sum(costs[i] for i in n))  # the busiest node's tables
        dim_node = sum(w.tables[i].dim for i in node)
        terms = {
            "embedding_lookup": sum(lookup(i, W * tr[i].ids / R, tr[i].unique_all / R)
                                    + p.device_stream(W * B * w.tables[i].dim * F32) for i in node),
            "embedding_update": sum(update(i, tr[i].unique_all / R) for i in node),
        }  # fmt: skip
        ids = sum(t.ids for t in tr) * INDEX_BYTES + B * len(w.tables) * LENGTH_BYTES
        # a rank's ids: 1/N stay on its node (spread over its R ranks), (N-1)/N go to the other nodes' W - R ranks
        terms["input_all_to_all"] = p.exchange(ids / N * (R - 1) / R, ids * (N - 1) / N, R - 1, W - R)
        within = p.exchange((R - 1) * N * B * dim_node * F32, 0.0, R - 1, 0, calls=2)
        between = p.exchange(0.0, (N - 1) * B * dim_node * F32, 0, N - 1, calls=2)
        terms["output_all_to_all"] = within + between
        mem = sum(w.tables[i].rows * sb[i] for i in node) / R
        return terms, mem

