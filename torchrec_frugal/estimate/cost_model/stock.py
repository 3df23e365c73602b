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

    def __init__(self, profile: HardwareProfile) -> None:
        self.profile = profile
        self.uvm = UvmCost(profile)

    def price(
        self, workload: Workload, choice: str, primitives: Primitives, traffic: List[TableTraffic],
        plan: Optional[Plan] = None,
    ) -> Tuple[Dict[str, float], float, float]:
        """TorchRec's fused TBE kernels (lookup, then the optimizer on the distinct rows in the
        backward) plus its all-to-alls; returns (terms, bytes of tables per device, seconds of
        cache prefetch beside the step). A ``sharding:kernel`` choice prices TorchRec's offloading
        (:class:`.uvm.UvmCost`)."""
        sharding, kernel, prefetch = split_choice(choice)
        if kernel != "fused":
            return self.uvm.price(workload, sharding, kernel, prefetch, primitives, traffic, plan or Plan(choice))
        world, batch_size, table_count = workload.world_size, workload.batch_size, len(workload.tables)
        tables = workload.tables
        row_bytes = [table.dim * F32 for table in tables]
        stored_bytes = [table.dim * F32 + workload.state_floats_per_row * F32 for table in tables]  # a row with its state
        resident = [primitives.resident.get(table.name, 0.0) for table in tables]

        def lookup(i: int, ids: float, rows: float) -> float:
            """Each distinct row comes from memory once (or from the last-level cache, for the
            share of its table held there); every id costs the kernel's per-id work (repeats of a
            row hit the caches: kernel_id_s is measured on a cache-resident table)."""
            return primitives.device_gather(rows, row_bytes[i], resident[i]) + ids * self.profile.kernel_id_s

        def update(i: int, rows: float) -> float:
            return primitives.device_gather(rows, stored_bytes[i], resident[i]) + primitives.device_scatter(rows, stored_bytes[i], resident[i])

        dim_sum = sum(table.dim for table in tables)
        ids_sent = sum(counts.ids for counts in traffic) * (world - 1) / world
        terms: Dict[str, float] = {}
        if sharding == "table_wise":
            costs = [lookup(i, world * counts.ids, counts.unique_all) + update(i, counts.unique_all)
                     for i, counts in enumerate(traffic)]  # fmt: skip
            ranks = assign_tables(self._placement_costs(workload, traffic, costs), world)
            busiest = max(ranks, key=lambda rank: sum(costs[i] for i in rank))
            terms["embedding_lookup"] = sum(lookup(i, world * traffic[i].ids, traffic[i].unique_all) for i in busiest)
            terms["embedding_update"] = sum(update(i, traffic[i].unique_all) for i in busiest)
            terms["input_all_to_all"] = primitives.all_to_all(
                ids_sent * INDEX_BYTES + batch_size * table_count * LENGTH_BYTES * (world - 1) / world)
            # pooled embeddings out in the forward, their gradients back in the backward
            terms["output_all_to_all"] = primitives.all_to_all(batch_size * dim_sum * F32 * (world - 1) / world, calls=2)
            memory = max(sum(tables[i].rows * stored_bytes[i] for i in rank) for rank in ranks)
        elif sharding == "table_row_wise" and workload.nodes > 1:
            terms, memory = self._table_row_wise(workload, primitives, traffic, lookup, update)
        elif sharding in ("row_wise", "table_row_wise"):
            # One machine: table_row_wise shards every table row-wise over the host's ranks, as row_wise.
            terms["embedding_lookup"] = sum(lookup(i, counts.ids, counts.unique_all / world)
                                            + primitives.device_stream(world * batch_size * tables[i].dim * F32)
                                            for i, counts in enumerate(traffic))  # fmt: skip
            terms["embedding_update"] = sum(update(i, counts.unique_all / world) for i, counts in enumerate(traffic))
            terms["input_all_to_all"] = primitives.all_to_all(
                ids_sent * INDEX_BYTES + (world - 1) * batch_size * table_count * LENGTH_BYTES)
            # partial sums of all W x B samples: reduce-scatter forward, all-gather of gradients backward
            terms["output_all_to_all"] = primitives.all_to_all((world - 1) * batch_size * dim_sum * F32, calls=2)
            memory = sum(table.rows * stored_bytes[i] for i, table in enumerate(tables)) / world
        elif sharding == "data_parallel":
            terms["embedding_lookup"] = sum(lookup(i, counts.ids, counts.unique_rank) for i, counts in enumerate(traffic))
            # dense gradients of whole tables: zero + accumulate, then the dense optimizer over every row
            terms["embedding_update"] = sum(
                primitives.device_stream(table.rows * (2 * row_bytes[i] + 3 * row_bytes[i] + 2 * (stored_bytes[i] - row_bytes[i])))
                for i, table in enumerate(tables))  # fmt: skip
            terms["table_allreduce"] = primitives.all_reduce(sum(table.rows * row_bytes[i] for i, table in enumerate(tables)))
            memory = sum(table.rows * (row_bytes[i] + stored_bytes[i]) for i, table in enumerate(tables))
        else:
            raise ValueError(f"unknown stock sharding {sharding!r}")
        return terms, memory, 0.0

    def _placement_costs(self, workload: Workload, traffic: List[TableTraffic], costs: List[float]) -> List[float]:
        """What TorchRec's greedy partitioner balances, largest first. Its estimates scale with the
        ids and the row size, not with the distinct rows or the cache; the model's own table costs
        stand in for them where they scale alike. On a profile that prices the last-level cache
        (fitted to the training loop: a per-row rate far from the per-id one) they do not, and
        the placement follows the ids and row sizes."""
        if not self.profile.has_llc:
            return costs
        return [workload.world_size * counts.ids * table.dim for table, counts in zip(workload.tables, traffic)]

    def _table_row_wise(
        self, workload: Workload, primitives: Primitives, traffic: List[TableTraffic],
        lookup: Callable[[int, float, float], float], update: Callable[[int, float], float],
    ) -> Tuple[Dict[str, float], float]:
        """TorchRec's table_row_wise across nodes: each table on one node (greedy, largest first),
        its rows split over that node's R ranks. Ids go to the table's node; partial pooled sums
        of all W B samples are reduce-scattered inside the node, then the N B samples each rank
        then holds go to their nodes (and the gradients back the same way)."""
        world, nodes, ranks_per_node, batch_size = (workload.world_size, workload.nodes, workload.ranks_per_node,
                                                    workload.batch_size)  # fmt: skip
        tables = workload.tables
        stored_bytes = [table.dim * F32 + workload.state_floats_per_row * F32 for table in tables]
        costs = [lookup(i, world * counts.ids, counts.unique_all) + update(i, counts.unique_all)
                 for i, counts in enumerate(traffic)]  # fmt: skip
        placed = assign_tables(self._placement_costs(workload, traffic, costs), nodes)
        busiest = max(placed, key=lambda node: sum(costs[i] for i in node))  # the busiest node's tables
        node_dims = sum(tables[i].dim for i in busiest)
        terms = {
            "embedding_lookup": sum(lookup(i, world * traffic[i].ids / ranks_per_node, traffic[i].unique_all / ranks_per_node)
                                    + primitives.device_stream(world * batch_size * tables[i].dim * F32) for i in busiest),
            "embedding_update": sum(update(i, traffic[i].unique_all / ranks_per_node) for i in busiest),
        }  # fmt: skip
        id_bytes = sum(counts.ids for counts in traffic) * INDEX_BYTES + batch_size * len(tables) * LENGTH_BYTES
        # a rank's ids: 1/N stay on its node (spread over its R ranks), (N-1)/N go to the other nodes' W - R ranks
        terms["input_all_to_all"] = primitives.exchange(id_bytes / nodes * (ranks_per_node - 1) / ranks_per_node,
                                                        id_bytes * (nodes - 1) / nodes, ranks_per_node - 1,
                                                        world - ranks_per_node)  # fmt: skip
        pooled_within = (ranks_per_node - 1) * nodes * batch_size * node_dims * F32
        within = primitives.exchange(pooled_within, 0.0, ranks_per_node - 1, 0, calls=2)
        between = primitives.exchange(0.0, (nodes - 1) * batch_size * node_dims * F32, 0, nodes - 1, calls=2)
        terms["output_all_to_all"] = within + between
        memory = sum(tables[i].rows * stored_bytes[i] for i in busiest) / ranks_per_node
        return terms, memory
