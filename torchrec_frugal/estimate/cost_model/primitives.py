"""Seconds of the elementary operations of a step (gathers, host reads, all-to-alls, all-reduces)
on a hardware profile."""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from ..profiles import HardwareProfile, ProfileError


class Primitives:
    """Seconds of the elementary operations of a step on one profile with ``world`` ranks, of which
    ``ranks_per_node`` share each machine (default: all on one).

    Collectives also count the bytes one rank sends to ranks of its own node and of other nodes
    (``bytes_within``, ``bytes_between``): what ``examples/comm_counter.py`` measures.
    ``resident`` maps a table's name to the share of its bytes held in the last-level cache
    (:func:`llc_shares`; a profile without ``llc_bytes`` prices every row at the memory rates).
    """

    def __init__(self, profile: HardwareProfile, world: int, ranks_per_node: Optional[int] = None,
                 resident: Optional[Mapping[str, float]] = None) -> None:  # fmt: skip
        self.profile = profile
        self.world = world
        self.local = ranks_per_node or world
        self.resident: Dict[str, float] = dict(resident or {})
        self.bytes_within = 0.0
        self.bytes_between = 0.0

    def _shared_bw(self, bandwidth: float) -> float:
        """Without peer-to-peer, every rank's bytes cross host memory twice (written by the
        sender's device, read by the receiver's): a node's ranks at once share host_mem_bw / (2 x ranks)."""
        return bandwidth if self.profile.p2p else min(bandwidth, self.profile.host_mem_bw / (2.0 * self.local))

    def _network_bw(self) -> float:
        """What one rank sends to other nodes per second while the node's ranks all send: the
        node's network bandwidth shared by its ranks."""
        if self.profile.network_bw is None or self.profile.network_latency_s is None:
            raise ProfileError(
                f"profile {self.profile.name!r} has no network_bw / network_latency_s: it cannot price "
                f"{self.world // self.local} nodes; add both fields to the profile (docs/cost_model.md)"
            )
        return self.profile.network_bw / self.local

    def exchange(self, within: float, between: float, local_peers: int, remote_peers: int, calls: int = 1) -> float:
        """One all-to-all in which a rank sends ``within`` bytes to ``local_peers`` ranks of its node
        and ``between`` bytes to ``remote_peers`` ranks of other nodes: per-peer latencies plus
        each part over its link. The parts add up: one rank's link (PCIe without peer-to-peer, or
        its core under gloo) carries both. ``calls`` such all-to-alls (forward and backward: 2)."""
        seconds = 0.0
        if local_peers > 0 and within > 0:
            self.bytes_within += calls * within
            seconds += local_peers * self.profile.a2a_latency_s + within / self._shared_bw(self.profile.a2a_bw)
        if remote_peers > 0 and between > 0:
            self.bytes_between += calls * between
            seconds += remote_peers * float(self.profile.network_latency_s) + between / self._network_bw()
        return calls * seconds

    def all_to_all(self, bytes_sent: float, calls: int = 1) -> float:
        """``calls`` all-to-alls of all ranks where each rank sends ``bytes_sent`` spread evenly over
        its W - 1 peers: (W - 1) x latency + bytes / bandwidth, split by where the peers are."""
        if self.world == 1 or bytes_sent <= 0:
            return 0.0
        remote = self.world - self.local
        share = remote / (self.world - 1)
        return self.exchange(bytes_sent * (1.0 - share), bytes_sent * share, self.local - 1, remote, calls)

    def all_reduce(self, nbytes: float) -> float:
        """Ring all-reduce: 2 (W - 1) steps, each rank sending 2 (W - 1) / W of the buffer; across
        nodes, every step waits for the ring's slowest hop (the one between nodes)."""
        if self.world == 1 or nbytes <= 0:
            return 0.0
        steps = 2 * (self.world - 1)
        bandwidth, latency = self._shared_bw(self.profile.allreduce_bw), self.profile.allreduce_latency_s
        if self.local < self.world:
            # one ring edge per node leaves it: the whole link
            bandwidth = min(bandwidth, self._network_bw() * self.local)
            latency = max(latency, float(self.profile.network_latency_s))
        return steps * latency + steps / self.world * nbytes / bandwidth

    def dense(self, flops: float, ops: float, threads: int) -> float:
        speed = self.profile.dense_flops_per_s * (1.0 + (threads - 1) * self.profile.dense_thread_efficiency)
        return flops / speed + ops * self.profile.op_overhead_s

    def device_gather(self, rows: float, row_bytes: float, resident: float = 0.0) -> float:
        """Random rows read in device memory: at least one 128-byte line per row; the share
        ``resident`` of them from the last-level cache (a table held there) at its rate."""
        return self._random_rows(rows, row_bytes, resident, self.profile.device_gather_bw, self.profile.llc_gather_bw)

    def device_scatter(self, rows: float, row_bytes: float, resident: float = 0.0) -> float:
        return self._random_rows(rows, row_bytes, resident, self.profile.device_scatter_bw, self.profile.llc_scatter_bw)

    def _random_rows(
        self, rows: float, row_bytes: float, resident: float, memory_bw: float, llc_bw: Optional[float]
    ) -> float:
        nbytes = rows * max(row_bytes, 128.0)
        if resident <= 0.0 or llc_bw is None:
            return nbytes / memory_bw
        return nbytes * ((1.0 - resident) / memory_bw + resident / llc_bw)

    def device_stream(self, nbytes: float) -> float:
        return nbytes / self.profile.device_mem_bw

    def host_read(self, rows: float, row_bytes: float) -> float:
        """Distinct host rows read by the device in row order (the engine's order)."""
        return 0.0 if rows <= 0 else rows * row_bytes / self.profile.host_read_bw(rows, row_bytes)

    def host_read_random(self, rows: float, row_bytes: float) -> float:
        """Distinct host rows read by the device in no particular order (a UVM cache's misses)."""
        if rows <= 0 or row_bytes <= 0:
            return 0.0
        return rows * row_bytes / self.profile.host_read_bw(rows, row_bytes, ordered=False)

    def host_write(self, rows: float, row_bytes: float) -> float:
        if rows <= 0 or row_bytes <= 0:
            return 0.0
        return rows * max(row_bytes, 128.0) / self.profile.host_write_bw

    def memcpy(self, nbytes: float) -> float:
        return nbytes / self.profile.host_memcpy_bw

    def h2d(self, nbytes: float) -> float:
        return 0.0 if self.profile.device_is_host else nbytes / self.profile.h2d_bw

    def d2h(self, nbytes: float) -> float:
        return 0.0 if self.profile.device_is_host else nbytes / self.profile.d2h_bw


def llc_shares(table_bytes: Sequence[float], llc_bytes: float) -> np.ndarray:
    """Share of each table's bytes held in a last-level cache of ``llc_bytes``: the smallest
    tables fill it first (a step touches every table, and a small table's rows are reused before
    the cache evicts them); the first table that does not fit whole holds the rest, larger ones
    nothing. Hot rows of a large table that stay cached are left to the memory rate's fit."""
    sizes = np.asarray(table_bytes, dtype=np.float64)
    order = np.argsort(sizes, kind="stable")
    before = np.cumsum(sizes[order]) - sizes[order]
    shares = np.empty_like(sizes)
    shares[order] = np.clip((llc_bytes - before) / np.maximum(sizes[order], 1.0), 0.0, 1.0)
    return shares


def assign_tables(costs: Sequence[float], ranks: int) -> List[List[int]]:
    """Tables to ranks, largest cost first onto the least loaded rank (what TorchRec's greedy
    partitioner does for table_wise): the step waits for the most loaded rank."""
    loads = [0.0] * ranks
    tables: List[List[int]] = [[] for _ in range(ranks)]
    for table in sorted(range(len(costs)), key=lambda i: -costs[i]):
        rank = min(range(ranks), key=lambda r: loads[r])
        loads[rank] += costs[table]
        tables[rank].append(table)
    return tables

