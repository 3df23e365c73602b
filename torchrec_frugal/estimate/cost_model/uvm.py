"""TorchRec's offloading (UVM) priced: fused_uvm_caching, with or without the prefetch pipeline,
and fused_uvm, over an LRU (or LFU) device cache of the id distribution."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..profiles import HardwareProfile
from .primitives import Primitives, assign_tables
from .traffic import TableTraffic
from .workload import F32, FUSED_UVM_CACHING, INDEX_BYTES, LENGTH_BYTES, UVM_ALGORITHMS, Plan, RowDistribution, Workload

UVM_PREFETCH_OPS = 3
"""Operators FBGEMM's ``_prefetch`` dispatches per step (``split_table_batched_embeddings_ops_training``):
``linearize_cache_indices``, ``lru_cache_populate`` and ``lxu_cache_lookup``, each at the profile's
``op_overhead_s``. The kernels ``lru_cache_populate`` launches from C++ (the ids made unique by a radix
sort, ``lru_cache_find_uncached``, the misses sorted by cache set, ``lru_cache_insert``) are priced by
the work they do: a pass over the ids, a set probe per distinct row, the insert per miss."""
SET_PROBE_BYTES = 2 * 32 * 8
"""Bytes a distinct row's lookup reads in its 32-way cache set: the ways' row ids (``lxu_cache_state``)
and their LRU timestamps (``lru_state``), int64 each."""


def cache_management(primitives: Primitives, ids: float, unique: float, misses: float) -> float:
    """Device seconds FBGEMM spends managing a fused_uvm_caching cache for one step's lookups, besides
    moving rows over the host link: the prefetch's fixed operators, one pass over the ids (linearize,
    sort, unique: the TBE kernel's per-id rate), one 32-way set probe per distinct row, and the
    insert per miss (``HardwareProfile.uvm_miss_cost_s``)."""
    profile = primitives.profile
    return (UVM_PREFETCH_OPS * profile.op_overhead_s + ids * profile.kernel_id_s
            + primitives.device_gather(unique, SET_PROBE_BYTES) + misses * profile.uvm_miss_cost_s)  # fmt: skip


def uvm_cache(
    distributions: Sequence[RowDistribution], draws: Sequence[float], capacity: float, algorithm: str = "lru"
) -> List[Tuple[float, float]]:
    """One device cache of ``capacity`` rows shared by tables drawing ``draws[t]`` ids a step from
    ``distributions[t]`` (FBGEMM's cache of one TBE serves all its tables). Per table: (distinct rows
    a step that miss and are fetched from host, the same for every step in steady state; the share
    of the step's distinct rows found in the cache).

    ``lru`` (FBGEMM's default, and what TorchRec's estimator models through reuse distances):
    Che's approximation under independent draws: the cache holds the rows drawn in the last tau
    steps, tau such that the expected distinct rows of tau steps of every table fill it; a row drawn
    in a step misses when it was not drawn in the tau steps before: touched(n) (1 - p)^(n tau).
    ``lfu``: the bound LFU approaches, the ``capacity`` hottest rows (by ids a step) always cached,
    every other distinct row of a step fetched.
    """
    if algorithm not in UVM_ALGORITHMS:
        raise ValueError(f"unknown cache algorithm {algorithm!r}; choose one of {UVM_ALGORITHMS}")
    rows = sum(distribution.rows for distribution in distributions)
    per_table: List[Tuple[float, float]] = []
    if capacity >= rows:
        return [(0.0, 1.0) for _ in distributions]
    if algorithm == "lfu":
        # heat per step of every group of every table, hottest first, the top `capacity` rows cached
        heat = np.concatenate([distribution.prob * table_draws for distribution, table_draws in zip(distributions, draws)])
        count = np.concatenate([distribution.count for distribution in distributions])
        order = np.argsort(-heat, kind="stable")
        before = np.concatenate([[0.0], np.cumsum(count[order])[:-1]])
        cached_sorted = np.clip(capacity - before, 0.0, count[order])
        cached = np.empty_like(cached_sorted)
        cached[order] = cached_sorted
        at = 0
        for distribution, table_draws in zip(distributions, draws):
            groups = len(distribution.count)
            table_cached, touched = cached[at : at + groups], distribution.touched(table_draws)
            at += groups
            unique = float((distribution.count * touched).sum())
            miss = float(((distribution.count - table_cached) * touched).sum())
            per_table.append((miss, 1.0 - miss / unique if unique > 0 else 1.0))
        return per_table

    def filled(tau: float) -> float:
        return sum(distribution.expected_unique(table_draws * tau) for distribution, table_draws in zip(distributions, draws))

    low, high = 0.0, 1.0
    while filled(high) < capacity and high < 1e15:
        high *= 2.0
    for _ in range(60):  # bisection on log scale is not needed: filled() is smooth and monotone
        middle = 0.5 * (low + high)
        low, high = (middle, high) if filled(middle) < capacity else (low, middle)
    tau = 0.5 * (low + high)
    for distribution, table_draws in zip(distributions, draws):
        touched = distribution.touched(table_draws)
        unique = float((distribution.count * touched).sum())
        miss = float((distribution.count * touched * distribution.untouched_after(table_draws * tau)).sum())
        per_table.append((miss, 1.0 - miss / unique if unique > 0 else 1.0))
    return per_table


class UvmCost:
    """A table_wise or row_wise group of tables offloaded to host memory, per rank."""

    def __init__(self, profile: HardwareProfile) -> None:
        self.profile = profile

    def price(
        self, workload: Workload, sharding: str, kernel: str, prefetch: bool, primitives: Primitives,
        traffic: List[TableTraffic], plan: Plan,
    ) -> Tuple[Dict[str, float], float, float]:
        """TorchRec's offloading (FBGEMM's ``EmbeddingLocation.MANAGED_CACHING`` / ``MANAGED``): every
        table in host memory mapped into the GPU, sharded table_wise or row_wise.

        fused_uvm_caching: a device cache per rank of ``uvm_load_factor`` x the rank's rows (weights
        only, shared by the rank's tables; :func:`uvm_cache` gives the rows each step misses). The
        step's distinct rows are pooled and updated in the cache as FUSED does in device memory; the
        misses (the distribution's, plus the real data's tail: ``CostTable.tail_rate``) are read over
        the host link as random rows (``host_read_random_bw``), and as many rows are evicted, dirty
        (every cached row was updated), and written back (``host_write_bw``); FBGEMM's management of
        the cache costs device time (:func:`cache_management`). All of it on the critical path in the
        forward, or, with the prefetch pipeline, beside the previous step (only what exceeds the step
        waits: ``prefetch_stall``). fused_uvm: every distinct
        row read over the link in the forward, read and written back by the optimizer. Row-wise
        optimizer state stays in device memory (FBGEMM places it there); wider state lives in UVM
        and crosses the link with every update. Then the all-to-alls of the sharding, as FUSED.
        Returns (terms, bytes per device, prefetch seconds beside the step)."""
        profile = self.profile
        if profile.device_is_host:
            raise ValueError(f"{kernel} is a CUDA kernel (TorchRec's CPU sharders offer only fused); "
                             f"profile {profile.name!r} trains on {profile.device}")  # fmt: skip
        world, batch_size, table_count = workload.world_size, workload.batch_size, len(workload.tables)
        tables = workload.tables
        state_bytes = workload.state_floats_per_row * F32
        rowwise = workload.state_floats_per_row <= 1.0
        device_state, host_state = (state_bytes, 0.0) if rowwise else (0.0, state_bytes)

        def table_entry(i: int) -> Tuple[int, float, float, RowDistribution, float, float]:
            """(table, ids, distinct rows, distribution, draws, rows) of table ``i`` on one rank: a
            table_wise table whole on its rank, a row_wise table's block on each rank."""
            if sharding == "table_wise":
                return (i, world * traffic[i].ids, traffic[i].unique_all, tables[i].distribution, world * traffic[i].ids,
                        float(tables[i].rows))  # fmt: skip
            return (i, traffic[i].ids, traffic[i].unique_all / world, tables[i].distribution.block(world),
                    traffic[i].ids, tables[i].rows / world)  # fmt: skip

        def rank_cost(entries: Sequence[Tuple[int, float, float, RowDistribution, float, float]]) -> Dict[str, float]:
            cost = dict.fromkeys(("embedding_lookup", "embedding_update", "uvm_reads", "uvm_writes", "prefetch", "misses"), 0.0)
            if kernel == FUSED_UVM_CACHING:
                capacity = plan.uvm_load_factor * sum(entry[5] for entry in entries)
                misses = uvm_cache([entry[3] for entry in entries], [entry[4] for entry in entries], capacity,
                                   plan.uvm_algorithm)  # fmt: skip
            for position, (i, ids, unique, _, draws, _) in enumerate(entries):
                row_bytes = tables[i].dim * F32
                if kernel == FUSED_UVM_CACHING:
                    # the distribution's misses, plus the real data's tail: compulsory misses
                    miss = misses[position][0] + draws * tables[i].tail_rate()
                    cost["misses"] += miss
                    cost["embedding_lookup"] += primitives.device_gather(unique, row_bytes) + ids * profile.kernel_id_s
                    cost["embedding_update"] += (primitives.device_gather(unique, row_bytes + device_state)
                                                 + primitives.device_scatter(unique, row_bytes + device_state))  # fmt: skip
                    manage = cache_management(primitives, ids, unique, miss)
                    # misses in, evicted dirty rows out
                    fill = primitives.host_read_random(miss, row_bytes) + primitives.host_write(miss, row_bytes)
                    if prefetch:
                        cost["prefetch"] += fill + manage
                    else:
                        cost["embedding_lookup"] += manage
                        cost["uvm_reads"] += primitives.host_read_random(miss, row_bytes)
                        cost["uvm_writes"] += primitives.host_write(miss, row_bytes)
                    cost["uvm_reads"] += primitives.host_read_random(unique, host_state)
                    cost["uvm_writes"] += primitives.host_write(unique, host_state)
                else:  # fused_uvm: weights (and wide state) over the link, row-wise state in the device
                    cost["embedding_lookup"] += ids * profile.kernel_id_s
                    cost["uvm_reads"] += (primitives.host_read_random(unique, row_bytes)
                                          + primitives.host_read_random(unique, row_bytes + host_state))  # fmt: skip
                    cost["uvm_writes"] += primitives.host_write(unique, row_bytes + host_state)
                    if device_state:
                        cost["embedding_update"] += (primitives.device_gather(unique, device_state)
                                                     + primitives.device_scatter(unique, device_state))  # fmt: skip
            return cost

        def device_bytes(indices: Sequence[int]) -> float:
            rows = sum(table_entry(i)[5] for i in indices)
            dims = sum(table_entry(i)[5] * tables[i].dim * F32 for i in indices)
            cache = plan.uvm_load_factor * dims if kernel == FUSED_UVM_CACHING else 0.0
            return cache + rows * device_state

        ids_sent = sum(counts.ids for counts in traffic) * (world - 1) / world
        dim_sum = sum(table.dim for table in tables)
        if sharding == "table_wise":
            alone = [_seconds(rank_cost([table_entry(i)])) for i in range(table_count)]  # each table with its own cache
            ranks = assign_tables(alone, world)
            costs = [rank_cost([table_entry(i) for i in rank]) if rank else {} for rank in ranks]
            busiest = max(range(world), key=lambda rank: _seconds(costs[rank]))
            terms = dict(costs[busiest])
            memory = max(device_bytes(rank) for rank in ranks)
            terms["input_all_to_all"] = primitives.all_to_all(
                ids_sent * INDEX_BYTES + batch_size * table_count * LENGTH_BYTES * (world - 1) / world)
            terms["output_all_to_all"] = primitives.all_to_all(batch_size * dim_sum * F32 * (world - 1) / world, calls=2)
        else:
            terms = rank_cost([table_entry(i) for i in range(table_count)])
            terms["embedding_lookup"] += sum(primitives.device_stream(world * batch_size * table.dim * F32) for table in tables)
            memory = device_bytes(range(table_count))
            terms["input_all_to_all"] = primitives.all_to_all(
                ids_sent * INDEX_BYTES + (world - 1) * batch_size * table_count * LENGTH_BYTES)
            terms["output_all_to_all"] = primitives.all_to_all((world - 1) * batch_size * dim_sum * F32, calls=2)
        background = terms.pop("prefetch")
        terms.pop("misses")
        return terms, memory, background


def _seconds(cost: Dict[str, float]) -> float:
    """A rank's seconds of its terms (its miss count left out)."""
    return sum(seconds for term, seconds in cost.items() if term != "misses")
