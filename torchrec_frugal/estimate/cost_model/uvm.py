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


def cache_management(p: Primitives, ids: float, unique: float, misses: float) -> float:
    """Device seconds FBGEMM spends managing a fused_uvm_caching cache for one step's lookups, besides
    moving rows over the host link: the prefetch's fixed operators, one pass over the ids (linearize,
    sort, unique: the TBE kernel's per-id rate), one 32-way set probe per distinct row, and the
    insert per miss (``HardwareProfile.uvm_miss_cost_s``)."""
    hw = p.hw
    return (UVM_PREFETCH_OPS * hw.op_overhead_s + ids * hw.kernel_id_s + p.device_gather(unique, SET_PROBE_BYTES)
            + misses * hw.uvm_miss_cost_s)  # fmt: skip


def uvm_cache(
    dists: Sequence[RowDistribution], draws: Sequence[float], capacity: float, algorithm: str = "lru"
) -> List[Tuple[float, float]]:
    """One device cache of ``capacity`` rows shared by tables drawing ``draws[t]`` ids a step from
    ``dists[t]`` (FBGEMM's cache of one TBE serves all its tables). Per table: (distinct rows a step
    that miss and are fetched from host, the same for every step in steady state; the share of the
    step's distinct rows found in the cache).

    ``lru`` (FBGEMM's default, and what TorchRec's estimator models through reuse distances):
    Che's approximation under independent draws: the cache holds the rows drawn in the last tau
    steps, tau such that the expected distinct rows of tau steps of every table fill it; a row drawn
    in a step misses when it was not drawn in the tau steps before: touched(n) (1 - p)^(n tau).
    ``lfu``: the bound LFU approaches, the ``capacity`` hottest rows (by ids a step) always cached,
    every other distinct row of a step fetched.
    """
    if algorithm not in UVM_ALGORITHMS:
        raise ValueError(f"unknown cache algorithm {algorithm!r}; choose one of {UVM_ALGORITHMS}")
    rows = sum(d.rows for d in dists)
    out: List[Tuple[float, float]] = []
    if capacity >= rows:
        return [(0.0, 1.0) for _ in dists]
    if algorithm == "lfu":
        # heat per step of every group of every table, hottest first, the top `capacity` rows cached
        heat = np.concatenate([d.prob * n for d, n in zip(dists, draws)])
        count = np.concatenate([d.count for d in dists])
        order = np.argsort(-heat, kind="stable")
        before = np.concatenate([[0.0], np.cumsum(count[order])[:-1]])
        cached_sorted = np.clip(capacity - before, 0.0, count[order])
        cached = np.empty_like(cached_sorted)
        cached[order] = cached_sorted
        at = 0
        for d, n in zip(dists, draws):
            g = len(d.count)
            c, touched = cached[at : at + g], d.touched(n)
            at += g
            unique = float((d.count * touched).sum())
            miss = float(((d.count - c) * touched).sum())
            out.append((miss, 1.0 - miss / unique if unique > 0 else 1.0))
        return out

    def filled(tau: float) -> float:
        return sum(d.expected_unique(n * tau) for d, n in zip(dists, draws))

    lo, hi = 0.0, 1.0
    while filled(hi) < capacity and hi < 1e15:
        hi *= 2.0
    for _ in range(60):  # bisection on log scale is not needed: filled() is smooth and monotone
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if filled(mid) < capacity else (lo, mid)
    tau = 0.5 * (lo + hi)
    for d, n in zip(dists, draws):
        touched = d.touched(n)
        unique = float((d.count * touched).sum())
        miss = float((d.count * touched * d.untouched_after(n * tau)).sum())
        out.append((miss, 1.0 - miss / unique if unique > 0 else 1.0))
    return out



class UvmCost:
    """A table_wise or row_wise group of tables offloaded to host memory, per rank."""

    def __init__(self, hw: HardwareProfile) -> None:
        self.hw = hw

    def price(
        self, w: Workload, sharding: str, kernel: str, prefetch: bool, p: Primitives, tr: List[TableTraffic], plan: Plan
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
        if self.hw.device_is_host:
            raise ValueError(f"{kernel} is a CUDA kernel (TorchRec's CPU sharders offer only fused); "
                             f"profile {self.hw.name!r} trains on {self.hw.device}")  # fmt: skip
        W, B, T = w.world_size, w.batch_size, len(w.tables)
        hw, sf = self.hw, w.state_floats_per_row * F32
        rowwise = w.state_floats_per_row <= 1.0
        dev_state, host_state = (sf, 0.0) if rowwise else (0.0, sf)
        if sharding == "table_wise":  # (table, ids, distinct rows, distribution, draws, rows) on the table's rank
            entry = lambda i: (i, W * tr[i].ids, tr[i].unique_all, w.tables[i].distribution, W * tr[i].ids,  # noqa: E731
                               float(w.tables[i].rows))  # fmt: skip
        else:
            entry = lambda i: (i, tr[i].ids, tr[i].unique_all / W, w.tables[i].distribution.block(W),  # noqa: E731
                               tr[i].ids, w.tables[i].rows / W)  # fmt: skip

        def rank_cost(entries: Sequence[Tuple[int, float, float, RowDistribution, float, float]]) -> Dict[str, float]:
            out = dict.fromkeys(("embedding_lookup", "embedding_update", "uvm_reads", "uvm_writes", "prefetch", "misses"), 0.0)
            if kernel == FUSED_UVM_CACHING:
                capacity = plan.uvm_load_factor * sum(e[5] for e in entries)
                misses = uvm_cache([e[3] for e in entries], [e[4] for e in entries], capacity, plan.uvm_algorithm)
            for k, (i, ids, unique, _, draws, _) in enumerate(entries):
                rb = w.tables[i].dim * F32
                if kernel == FUSED_UVM_CACHING:
                    # the distribution's misses, plus the real data's tail: compulsory misses
                    miss = misses[k][0] + draws * w.tables[i].tail_rate()
                    out["misses"] += miss
                    out["embedding_lookup"] += p.device_gather(unique, rb) + ids * hw.kernel_id_s
                    out["embedding_update"] += p.device_gather(unique, rb + dev_state) + p.device_scatter(unique, rb + dev_state)
                    manage = cache_management(p, ids, unique, miss)
                    fill = p.host_read_random(miss, rb) + p.host_write(miss, rb)  # misses in, evicted dirty rows out
                    if prefetch:
                        out["prefetch"] += fill + manage
                    else:
                        out["embedding_lookup"] += manage
                        out["uvm_reads"] += p.host_read_random(miss, rb)
                        out["uvm_writes"] += p.host_write(miss, rb)
                    out["uvm_reads"] += p.host_read_random(unique, host_state)
                    out["uvm_writes"] += p.host_write(unique, host_state)
                else:  # fused_uvm: weights (and wide state) over the link, row-wise state in the device
                    out["embedding_lookup"] += ids * hw.kernel_id_s
                    out["uvm_reads"] += p.host_read_random(unique, rb) + p.host_read_random(unique, rb + host_state)
                    out["uvm_writes"] += p.host_write(unique, rb + host_state)
                    if dev_state:
                        out["embedding_update"] += p.device_gather(unique, dev_state) + p.device_scatter(unique, dev_state)
            return out

        def device_bytes(idx: Sequence[int]) -> float:
            rows = sum(entry(i)[5] for i in idx)
            dims = sum(entry(i)[5] * w.tables[i].dim * F32 for i in idx)
            cache = plan.uvm_load_factor * dims if kernel == FUSED_UVM_CACHING else 0.0
            return cache + rows * dev_state

        if sharding == "table_wise":
            alone = [_seconds(rank_cost([entry(i)])) for i in range(T)]  # each table with its own cache
            ranks = assign_tables(alone, W)
            costs = [rank_cost([entry(i) for i in r]) if r else {} for r in ranks]
            busiest = max(range(W), key=lambda r: _seconds(costs[r]))
            terms = {k: v for k, v in costs[busiest].items()}
            mem = max(device_bytes(r) for r in ranks)
            ids_sent = sum(t.ids for t in tr) * (W - 1) / W
            terms["input_all_to_all"] = p.all_to_all(ids_sent * INDEX_BYTES + B * T * LENGTH_BYTES * (W - 1) / W)
            terms["output_all_to_all"] = p.all_to_all(B * sum(t.dim for t in w.tables) * F32 * (W - 1) / W, calls=2)
        else:
            terms = rank_cost([entry(i) for i in range(T)])
            terms["embedding_lookup"] += sum(p.device_stream(W * B * t.dim * F32) for t in w.tables)
            mem = device_bytes(range(T))
            ids_sent = sum(t.ids for t in tr) * (W - 1) / W
            terms["input_all_to_all"] = p.all_to_all(ids_sent * INDEX_BYTES + (W - 1) * B * T * LENGTH_BYTES)
            terms["output_all_to_all"] = p.all_to_all((W - 1) * B * sum(t.dim for t in w.tables) * F32, calls=2)
        background = terms.pop("prefetch")
        terms.pop("misses")
        return terms, mem, background


def _seconds(cost: Dict[str, float]) -> float:
    """A rank's seconds of its terms (its miss count left out)."""
    return sum(v for k, v in cost.items() if k != "misses")
