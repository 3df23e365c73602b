"""Per-step cost model of synchronous embedding training on the ranks of one machine or of several.

For a workload (tables, id distributions, batch, dense model, ranks and nodes), a plan (a sharding
per table, cache ratio, lookahead) and a hardware profile (:mod:`torchrec_frugal.profiles`), it
predicts the time of one training step as a sum of named terms, for Frugal (frugal_row_wise across
nodes) and for TorchRec's table_wise, row_wise, table_row_wise and data_parallel shardings, alone
or mixed table by table. Every figure it returns
is a prediction; the formulas and the sources of the profiles' constants are in
``docs/cost_model.md``. :func:`choose_plan` picks the plan of least predicted step.

No TorchRec import here: the planner integration (``torchrec_frugal.torchrec``) calls into this.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .profiles import HardwareProfile, ProfileError

FRUGAL = "frugal"
FRUGAL_ROW_WISE = "frugal_row_wise"  # one row block per node, each served by its node's Frugal engine
FRUGAL_KINDS = (FRUGAL, FRUGAL_ROW_WISE)
STOCK_SHARDINGS = ("table_wise", "row_wise", "table_row_wise", "data_parallel")
FUSED_UVM_CACHING = "fused_uvm_caching"  # TorchRec's EmbeddingComputeKernel values
FUSED_UVM = "fused_uvm"
PREFETCH = "+prefetch"  # trained with PrefetchTrainPipelineSparseDist: the cache filled beside the step before
UVM_KERNELS = (FUSED_UVM_CACHING, FUSED_UVM_CACHING + PREFETCH, FUSED_UVM)
UVM_SHARDINGS = ("table_wise", "row_wise")
UVM_CHOICES = tuple(f"{s}:{k}" for s in UVM_SHARDINGS for k in UVM_KERNELS)
"""TorchRec's offloading as stock choices, "<sharding>:<kernel>": the table in host memory mapped into
the GPU (UVM), with a device cache of ``Plan.uvm_load_factor`` x rows (fused_uvm_caching; "+prefetch":
filled for batch i+1 while batch i trains) or without one (fused_uvm). A bare stock sharding is FUSED."""
STOCK_CHOICES = STOCK_SHARDINGS + UVM_CHOICES
SHARDINGS = FRUGAL_KINDS + STOCK_CHOICES
TERMS = (
    "dense_compute", "dense_allreduce", "framework", "embedding_lookup", "embedding_update",
    "input_all_to_all", "output_all_to_all", "table_allreduce", "host_reads", "gradient_exchange",
    "flush_inline", "engine_host", "gate_stall", "uvm_reads", "uvm_writes", "prefetch_stall", "contention",
)  # fmt: skip
"""Every term a step can have; a sharding leaves the ones it does not pay at 0."""
F32 = 4
INDEX_BYTES = 8  # int64 ids in TorchRec's KJT
LENGTH_BYTES = 4
MEMORY_HEADROOM = 0.9  # share of device memory a plan may fill
UVM_LOAD_FACTOR = 0.2  # TorchRec's default cache_load_factor (batched_embedding_kernel.py)
UVM_ALGORITHMS = ("lru", "lfu")


def split_choice(choice: str) -> Tuple[str, str, bool]:
    """(sharding, TorchRec compute kernel, prefetch pipeline) of a stock choice or a Frugal kind."""
    sharding, _, kernel = choice.partition(":")
    prefetch = kernel.endswith(PREFETCH)
    return sharding, (kernel[: -len(PREFETCH)] if prefetch else kernel) or "fused", prefetch


# ---------------------------------------------------------------------------- id distributions
@dataclass(frozen=True)
class RowDistribution:
    """Access probabilities of one table's rows, hottest first, as groups of equal probability.

    Group g holds ``count[g]`` rows of probability ``prob[g]`` each (one draw = one id of a batch).
    Groups keep every formula vectorized and a billion-row Zipf table small (log-spaced tail).
    """

    prob: np.ndarray
    count: np.ndarray

    @classmethod
    def zipf(cls, rows: int, s: float, exact_head: int = 1024, ratio: float = 1.01) -> "RowDistribution":
        """Truncated Zipf(s) over ``rows`` ranks (what ``workload.ZipfIds`` draws): rank i has
        probability i^-s / H. The first ``exact_head`` ranks are exact; beyond, log-spaced groups
        whose rows share the group's mean of x^-s (integral over the group's rank range)."""
        head = min(rows, exact_head)
        ranks = np.arange(1, head + 1, dtype=np.float64)
        w = [ranks ** (-s)]
        n = [np.ones(head)]
        if rows > head:
            k = int(np.ceil(np.log(rows / head) / np.log(ratio))) + 1
            edges = np.unique(np.round(head * ratio ** np.arange(k + 1)).astype(np.int64))
            edges = np.concatenate([edges[edges < rows], [rows]])  # group (edges[j], edges[j+1]]
            lo, hi = edges[:-1] + 0.5, edges[1:] + 0.5
            cnt = (edges[1:] - edges[:-1]).astype(np.float64)
            integral = np.log(hi / lo) if abs(s - 1.0) < 1e-12 else (hi ** (1 - s) - lo ** (1 - s)) / (1 - s)
            w.append(integral / cnt)
            n.append(cnt)
        weights, counts = np.concatenate(w), np.concatenate(n)
        return cls(weights / float((weights * counts).sum()), counts)

    @classmethod
    def uniform(cls, rows: int) -> "RowDistribution":
        return cls(np.array([1.0 / rows]), np.array([float(rows)]))

    @classmethod
    def from_counts(cls, counts: Sequence[float]) -> "RowDistribution":
        """From per-row id counts of a pre-sample or a trace (rows never seen: probability 0)."""
        c = np.asarray(counts, dtype=np.float64).reshape(-1)
        if c.size == 0 or (c < 0).any() or c.sum() <= 0:
            raise ValueError("counts must be non-negative with a positive sum")
        values, mult = np.unique(c, return_counts=True)
        order = np.argsort(-values)
        return cls(values[order] / c.sum(), mult[order].astype(np.float64))

    @property
    def rows(self) -> int:
        return int(round(self.count.sum()))

    def block(self, n: int) -> "RowDistribution":
        """One of ``n`` equal row blocks (row_wise sharding) when heat is independent of row
        order (the synthetic ids are a random permutation): 1/n of each group's rows, each n
        times as likely among the ids that fall into the block."""
        return RowDistribution(self.prob * n, self.count / n)

    def touched(self, draws: float) -> np.ndarray:
        """Per group: probability that a row is drawn at least once in ``draws`` draws."""
        return -np.expm1(draws * np.log1p(-np.minimum(self.prob, 1.0 - 1e-15)))

    def expected_unique(self, draws: float) -> float:
        """Expected distinct rows among ``draws`` independent draws: sum_i 1 - (1 - p_i)^draws."""
        return float((self.count * self.touched(draws)).sum())

    def untouched_after(self, draws: float) -> np.ndarray:
        """Per group: probability that a row is not drawn in ``draws`` draws."""
        return 1.0 - self.touched(draws)

    def top(self, k: float) -> np.ndarray:
        """Rows of each group among the ``k`` hottest rows."""
        before = np.concatenate([[0.0], np.cumsum(self.count)[:-1]])
        return np.clip(k - before, 0.0, self.count)

    def hot_set(self, k: float, presample_draws: Optional[float] = None) -> np.ndarray:
        """Rows of each group in a hot set of ``k`` rows picked by counting ids.

        With ``presample_draws`` None the hot set is the true top k. Otherwise the rows seen in a
        pre-sample of that many draws come first, hottest first (a row is seen with probability
        1 - (1 - p)^draws); if fewer than k rows were seen, the rest are unseen rows in row order,
        which is random with respect to heat (ids are permuted).
        """
        if presample_draws is None:
            return self.top(k)
        seen = self.count * self.touched(presample_draws)
        before = np.concatenate([[0.0], np.cumsum(seen)[:-1]])
        w = np.clip(k - before, 0.0, seen)
        rest = max(0.0, k - float(w.sum()))
        unseen = self.count - seen
        if rest > 0 and unseen.sum() > 0:
            w = w + unseen * min(1.0, rest / float(unseen.sum()))
        return w


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


# ---------------------------------------------------------------------------- workload and plan
@dataclass(frozen=True)
class CostTable:
    """One embedding table: rows, dim, ids per sample, and how its ids are distributed."""

    name: str
    rows: int
    dim: int
    distribution: RowDistribution
    pooling: float = 1.0  # ids per sample (TorchRec's pooling factor)

    @classmethod
    def zipf(cls, name: str, rows: int, dim: int, s: float, pooling: float = 1.0) -> "CostTable":
        return cls(name, rows, dim, RowDistribution.zipf(rows, s), pooling)


@dataclass(frozen=True)
class DenseModel:
    """The dense part of the model: forward FLOPs per sample, parameters, operators per forward."""

    flops_per_sample: float
    params: int
    ops: int

    @classmethod
    def mlps(cls, *stacks: Sequence[int], extra_flops: float = 0.0, extra_ops: int = 0) -> "DenseModel":
        """MLP stacks given as layer widths (input first); 2 FLOPs per multiply-add, 3 operators
        per layer (matmul, bias, activation)."""
        flops, params, ops = extra_flops, 0, extra_ops
        for widths in stacks:
            for a, b in zip(widths, widths[1:]):
                flops += 2.0 * a * b
                params += a * b + b
                ops += 3
        return cls(flops, params, ops)


@dataclass(frozen=True)
class Workload:
    """What one step trains: every rank takes ``batch_size`` samples of all tables."""

    tables: Tuple[CostTable, ...]
    dense: DenseModel
    batch_size: int
    world_size: int
    threads_per_rank: Optional[int] = None  # cpu: intra-op threads per rank (None: cores // ranks)
    state_floats_per_row: float = 1.0  # optimizer state per row: row-wise Adagrad 1, SGD 0, Adagrad dim, Adam 2 x dim
    dense_state_floats: float = 1.0  # dense optimizer state per parameter (Adagrad 1)
    presample_draws: Optional[float] = None  # ids per table counted to pick Frugal's hot rows; None: exact
    nodes: int = 1  # machines; world_size ranks split evenly over them (TorchRec's local_world_size)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.world_size < 1 or self.nodes < 1:
            raise ValueError("batch_size, world_size and nodes must be >= 1")
        if self.world_size % self.nodes:
            raise ValueError(f"world_size {self.world_size} does not split into {self.nodes} nodes of equal size")
        if not self.tables:
            raise ValueError("a workload needs at least one table")

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nodes


@dataclass(frozen=True)
class Plan:
    """How the tables are trained: a sharding per table, Frugal's cache ratio and L.

    Every table takes ``sharding`` except those named in ``tables`` (name -> sharding):
    ``Plan("frugal")`` trains every table with Frugal, ``Plan("frugal", tables={"t3":
    "table_wise"})`` all but t3. The cache ratio and L apply to every frugal table.
    """

    sharding: str
    cache_ratio: float = 0.05
    lookahead: int = 10
    tables: Mapping[str, str] = field(default_factory=dict)
    uvm_load_factor: float = UVM_LOAD_FACTOR  # fused_uvm_caching tables: TorchRec's cache_load_factor
    uvm_algorithm: str = "lru"  # fused_uvm_caching: FBGEMM's CacheAlgorithm (LRU, its default, or LFU)

    def __post_init__(self) -> None:
        for s in (self.sharding, *self.tables.values()):
            if s not in SHARDINGS:
                raise ValueError(f"unknown sharding {s!r}; choose one of {SHARDINGS}")
        if not 0.0 <= self.cache_ratio <= 1.0 or self.lookahead < 0:
            raise ValueError("cache_ratio must be in [0, 1] and lookahead >= 0")
        if not 0.0 < self.uvm_load_factor <= 1.0 or self.uvm_algorithm not in UVM_ALGORITHMS:
            raise ValueError(f"uvm_load_factor must be in (0, 1] and uvm_algorithm one of {UVM_ALGORITHMS}")

    @classmethod
    def of(cls, shardings: Mapping[str, str], cache_ratio: float = 0.05, lookahead: int = 10,
           uvm_load_factor: float = UVM_LOAD_FACTOR) -> "Plan":
        """The plan giving each table its sharding in ``shardings`` (the most common one as default)."""
        counts = {s: list(shardings.values()).count(s) for s in SHARDINGS}
        default = max(SHARDINGS, key=lambda s: counts[s])
        return cls(default, cache_ratio, lookahead, {n: s for n, s in shardings.items() if s != default},
                   uvm_load_factor)  # fmt: skip

    def sharding_of(self, table: str) -> str:
        return self.tables.get(table, self.sharding)

    def groups(self, w: "Workload") -> Dict[str, List[int]]:
        """Indices of ``w``'s tables by sharding (shardings in ``SHARDINGS`` order)."""
        unknown = sorted(set(self.tables) - {t.name for t in w.tables})
        if unknown:
            raise ValueError(f"the plan names tables the workload lacks: {unknown}")
        out: Dict[str, List[int]] = {}
        for s in SHARDINGS:
            idx = [i for i, t in enumerate(w.tables) if self.sharding_of(t.name) == s]
            if idx:
                out[s] = idx
        return out


@dataclass
class StepCost:
    """A predicted step: its terms (seconds, summing to ``step_s``) and what they add up to."""

    sharding: str  # the plan's one sharding, or "mixed"
    terms: Dict[str, float]
    samples_per_second: float
    fits: bool  # the plan's tables and caches fit in device memory, and in host memory where the profile says how much
    memory_bytes_per_device: float
    background_s: float = 0.0  # Frugal's host work beside the step, per rank (planner thread, exchange worker, flushers)
    host_memory_bytes_per_node: float = 0.0  # Frugal's host tables (cpu device: every rank's memory too)
    details: Dict[str, float] = field(default_factory=dict)  # hit ratio, rows per step, bytes moved
    by_sharding: Dict[str, Dict[str, float]] = field(default_factory=dict)  # each sharding's tables' own terms

    @property
    def step_s(self) -> float:
        return sum(self.terms.values())

    def to_json(self) -> Dict[str, object]:
        return {"samples_per_second": self.samples_per_second, "step_ms": 1e3 * self.step_s,
                "terms_ms": {k: 1e3 * v for k, v in self.terms.items()}, "fits": self.fits,
                "memory_gib_per_device": self.memory_bytes_per_device / 2**30,
                "host_memory_gib_per_node": self.host_memory_bytes_per_node / 2**30,
                "background_ms": 1e3 * self.background_s, "details": self.details}  # fmt: skip


# ---------------------------------------------------------------------------- table traffic
@dataclass(frozen=True)
class TableTraffic:
    """Per-step row counts of one table (expectations, per rank unless named otherwise)."""

    ids: float  # ids of one rank's batch
    unique_rank: float  # distinct rows of one rank's batch
    unique_all: float  # distinct rows of all ranks' batches together
    hit_ratio: float = 0.0  # frugal: share of a rank's ids found in its own cache
    host_rows: float = 0.0  # frugal: distinct rows a rank reads from host
    owned_fresh_rows: float = 0.0  # frugal: uncached rows an owner updates (accelerator: read from host first)
    flushed_rows: float = 0.0  # frugal: rows an owner writes to host per step
    inline_rows: float = 0.0  # frugal: of which due at the very next step (written on the training thread)


def flush_rate(updated: np.ndarray, read_by_others: np.ndarray, lookahead: int) -> np.ndarray:
    """Host writes per step of one row with pending updates, under Frugal's lookahead.

    ``updated`` u: probability the row is updated in a step (some rank reads it); ``read_by_others``
    q: probability a rank other than its owner reads it from host. L = 0 (write-through): every
    update is written, rate u. L >= 1: an update followed by a read of another rank within the
    window is written eagerly (u (1 - (1 - q)^L)); updates with no such read are deferred and
    coalesce into one write per later read of another rank (q (1 - q)^L). L -> infinity gives u
    (every update is eventually seen in the window); hot rows (u = q = 1) give 1 per step. The
    deferred-rows cap (``FrugalConfig.max_deferred_rows``) is not modelled.
    """
    if lookahead == 0:
        return updated
    miss = (1.0 - read_by_others) ** lookahead
    return updated * (1.0 - miss) + read_by_others * miss


def table_traffic(t: CostTable, w: Workload, plan: Plan, device_is_host: bool) -> TableTraffic:
    """The row counts one table costs per step under ``plan`` (docs/cost_model.md, "Traffic")."""
    d, W = t.distribution, w.world_size
    ids = w.batch_size * t.pooling
    base = TableTraffic(ids=ids, unique_rank=d.expected_unique(ids), unique_all=d.expected_unique(W * ids))
    if plan.sharding_of(t.name) not in FRUGAL_KINDS:
        return base
    # Hot rows: W * floor(c N) hottest (by pre-sample), dealt round-robin: each rank holds 1/W of them.
    k = min(t.rows, W * int(plan.cache_ratio * t.rows + 1e-9)) if plan.cache_ratio < 1.0 else t.rows
    hot = d.hot_set(k, w.presample_draws)
    own_hot_unique = float((hot * d.touched(ids)).sum()) / W
    u, q = d.touched(W * ids), d.touched((W - 1) * ids)
    rate = flush_rate(u, q, plan.lookahead)
    inline = u if plan.lookahead == 0 else u * q
    # On a CPU device an owner updates uncached rows in place in host memory: only cached rows flush.
    rows_flushing = hot if device_is_host else d.count
    return replace(
        base,
        hit_ratio=float((hot * d.prob).sum()) / W,
        host_rows=max(0.0, base.unique_rank - own_hot_unique),
        owned_fresh_rows=float(((d.count - hot) * u).sum()) / W,
        flushed_rows=float((rows_flushing * rate).sum()) / W,
        inline_rows=float((rows_flushing * inline).sum()) / W,
    )


# ---------------------------------------------------------------------------- primitive costs
class Primitives:
    """Seconds of the elementary operations of a step on one profile with ``world`` ranks, of which
    ``ranks_per_node`` share each machine (default: all on one).

    Collectives also count the bytes one rank sends to ranks of its own node and of other nodes
    (``bytes_within``, ``bytes_between``): what ``examples/comm_counter.py`` measures.
    """

    def __init__(self, hw: HardwareProfile, world: int, ranks_per_node: Optional[int] = None) -> None:
        self.hw = hw
        self.world = world
        self.local = ranks_per_node or world
        self.bytes_within = 0.0
        self.bytes_between = 0.0

    def _shared_bw(self, bw: float) -> float:
        """Without peer-to-peer, every rank's bytes cross host memory twice (written by the
        sender's device, read by the receiver's): a node's ranks at once share host_mem_bw / (2 x ranks)."""
        return bw if self.hw.p2p else min(bw, self.hw.host_mem_bw / (2.0 * self.local))

    def _network_bw(self) -> float:
        """What one rank sends to other nodes per second while the node's ranks all send: the
        node's network bandwidth shared by its ranks."""
        if self.hw.network_bw is None or self.hw.network_latency_s is None:
            raise ProfileError(
                f"profile {self.hw.name!r} has no network_bw / network_latency_s: it cannot price "
                f"{self.world // self.local} nodes; add both fields to the profile (docs/cost_model.md)"
            )
        return self.hw.network_bw / self.local

    def exchange(self, within: float, between: float, local_peers: int, remote_peers: int, calls: int = 1) -> float:
        """One all-to-all in which a rank sends ``within`` bytes to ``local_peers`` ranks of its node
        and ``between`` bytes to ``remote_peers`` ranks of other nodes: per-peer latencies plus
        each part over its link. The parts add up: one rank's link (PCIe without peer-to-peer, or
        its core under gloo) carries both. ``calls`` such all-to-alls (forward and backward: 2)."""
        t = 0.0
        if local_peers > 0 and within > 0:
            self.bytes_within += calls * within
            t += local_peers * self.hw.a2a_latency_s + within / self._shared_bw(self.hw.a2a_bw)
        if remote_peers > 0 and between > 0:
            self.bytes_between += calls * between
            bw = self._network_bw()
            t += remote_peers * float(self.hw.network_latency_s) + between / bw
        return calls * t

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
        bw, latency = self._shared_bw(self.hw.allreduce_bw), self.hw.allreduce_latency_s
        if self.local < self.world:
            bw = min(bw, self._network_bw() * self.local)  # one ring edge per node leaves it: the whole link
            latency = max(latency, float(self.hw.network_latency_s))
        return steps * latency + steps / self.world * nbytes / bw

    def dense(self, flops: float, ops: float, threads: int) -> float:
        speed = self.hw.dense_flops_per_s * (1.0 + (threads - 1) * self.hw.dense_thread_efficiency)
        return flops / speed + ops * self.hw.op_overhead_s

    def device_gather(self, rows: float, row_bytes: float) -> float:
        """Random rows read in device memory: at least one 128-byte line per row."""
        return rows * max(row_bytes, 128.0) / self.hw.device_gather_bw

    def device_scatter(self, rows: float, row_bytes: float) -> float:
        return rows * max(row_bytes, 128.0) / self.hw.device_scatter_bw

    def device_stream(self, nbytes: float) -> float:
        return nbytes / self.hw.device_mem_bw

    def host_read(self, rows: float, row_bytes: float) -> float:
        """Distinct host rows read by the device in row order (the engine's order)."""
        return 0.0 if rows <= 0 else rows * row_bytes / self.hw.host_read_bw(rows, row_bytes)

    def host_read_random(self, rows: float, row_bytes: float) -> float:
        """Distinct host rows read by the device in no particular order (a UVM cache's misses)."""
        if rows <= 0 or row_bytes <= 0:
            return 0.0
        return rows * row_bytes / self.hw.host_read_bw(rows, row_bytes, ordered=False)

    def host_write(self, rows: float, row_bytes: float) -> float:
        if rows <= 0 or row_bytes <= 0:
            return 0.0
        return rows * max(row_bytes, 128.0) / self.hw.host_write_bw

    def memcpy(self, nbytes: float) -> float:
        return nbytes / self.hw.host_memcpy_bw

    def h2d(self, nbytes: float) -> float:
        return 0.0 if self.hw.device_is_host else nbytes / self.hw.h2d_bw

    def d2h(self, nbytes: float) -> float:
        return 0.0 if self.hw.device_is_host else nbytes / self.hw.d2h_bw


def assign_tables(costs: Sequence[float], ranks: int) -> List[List[int]]:
    """Tables to ranks, largest cost first onto the least loaded rank (what TorchRec's greedy
    partitioner does for table_wise): the step waits for the most loaded rank."""
    loads = [0.0] * ranks
    out: List[List[int]] = [[] for _ in range(ranks)]
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        r = min(range(ranks), key=lambda r: loads[r])
        loads[r] += costs[i]
        out[r].append(i)
    return out


# ---------------------------------------------------------------------------- the model
DEVICE_TERMS = ("dense_compute", "embedding_lookup", "embedding_update", "uvm_reads", "uvm_writes")
HOST_TERMS = ("framework", "engine_host", "gradient_exchange", "flush_inline", "host_reads")


class CostModel:
    """Predicted step time of a plan on a hardware profile, term by term."""

    def __init__(self, hw: HardwareProfile) -> None:
        self.hw = hw

    def threads(self, w: Workload) -> int:
        if not self.hw.device_is_host:
            return 1
        return w.threads_per_rank or max(1, self.hw.host_cores // w.ranks_per_node)

    def predict(self, w: Workload, plan: Plan) -> StepCost:
        """The predicted step of ``plan``: the terms every step pays (dense compute, DDP, the
        training loop), plus for each sharding the terms of its tables, priced as if they were the
        only tables (the frugal tables share one engine per node: its fixed host work, barrier,
        gradient exchange and flushers; the tables of one stock sharding share its all-to-alls),
        then the gate stall and the contention of the whole step."""
        p = Primitives(self.hw, w.world_size, w.ranks_per_node)
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
                body, m, threads, frugal_details, traffic = self._frugal_row_wise(part, plan, p)
            else:
                traffic = [table_traffic(t, part, plan, self.hw.device_is_host) for t in part.tables]
                body, m, bg = self._stock(part, sharding, p, traffic, plan)
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

    # ------------------------------------------------------------------ TorchRec
    def _stock(
        self, w: Workload, choice: str, p: Primitives, tr: List[TableTraffic], plan: Optional[Plan] = None
    ) -> Tuple[Dict[str, float], float, float]:
        """TorchRec's fused TBE kernels (lookup, then the optimizer on the distinct rows in the
        backward) plus its all-to-alls; returns (terms, bytes of tables per device, seconds of
        cache prefetch beside the step). A ``sharding:kernel`` choice prices TorchRec's offloading
        (:meth:`_uvm`)."""
        sharding, kernel, prefetch = split_choice(choice)
        if kernel != "fused":
            return self._uvm(w, sharding, kernel, prefetch, p, tr, plan or Plan(choice))
        W, B, T = w.world_size, w.batch_size, len(w.tables)
        rb = [t.dim * F32 for t in w.tables]
        sb = [t.dim * F32 + w.state_floats_per_row * F32 for t in w.tables]  # a row with its state

        def lookup(i: int, ids: float, rows: float) -> float:
            """Each distinct row comes from memory once; every id costs the kernel's per-id work
            (repeats of a row hit the caches: kernel_id_s is measured on a cache-resident table)."""
            return p.device_gather(rows, rb[i]) + ids * self.hw.kernel_id_s

        def update(i: int, rows: float) -> float:
            return p.device_gather(rows, sb[i]) + p.device_scatter(rows, sb[i])

        dim_sum = sum(t.dim for t in w.tables)
        ids_sent = sum(t.ids for t in tr) * (W - 1) / W
        terms: Dict[str, float] = {}
        if sharding == "table_wise":
            costs = [lookup(i, W * t.ids, t.unique_all) + update(i, t.unique_all) for i, t in enumerate(tr)]
            ranks = assign_tables(costs, W)
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

    def _uvm(
        self, w: Workload, sharding: str, kernel: str, prefetch: bool, p: Primitives, tr: List[TableTraffic], plan: Plan
    ) -> Tuple[Dict[str, float], float, float]:
        """TorchRec's offloading (FBGEMM's ``EmbeddingLocation.MANAGED_CACHING`` / ``MANAGED``): every
        table in host memory mapped into the GPU, sharded table_wise or row_wise.

        fused_uvm_caching: a device cache per rank of ``uvm_load_factor`` x the rank's rows (weights
        only, shared by the rank's tables; :func:`uvm_cache` gives the rows each step misses). The
        step's distinct rows are pooled and updated in the cache as FUSED does in device memory; the
        misses are read over the host link as random rows (``host_read_random_bw``), and as many
        rows are evicted, dirty (every cached row was updated), and written back (``host_write_bw``):
        on the critical path in the forward, or, with the prefetch pipeline, beside the previous
        step (only what exceeds the step waits: ``prefetch_stall``). fused_uvm: every distinct
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
            out = dict.fromkeys(("embedding_lookup", "embedding_update", "uvm_reads", "uvm_writes", "prefetch"), 0.0)
            if kernel == FUSED_UVM_CACHING:
                capacity = plan.uvm_load_factor * sum(e[5] for e in entries)
                misses = uvm_cache([e[3] for e in entries], [e[4] for e in entries], capacity, plan.uvm_algorithm)
            for k, (i, ids, unique, _, _, _) in enumerate(entries):
                rb = w.tables[i].dim * F32
                if kernel == FUSED_UVM_CACHING:
                    miss = misses[k][0]
                    out["embedding_lookup"] += p.device_gather(unique, rb) + ids * hw.kernel_id_s
                    out["embedding_update"] += p.device_gather(unique, rb + dev_state) + p.device_scatter(unique, rb + dev_state)
                    fill = p.host_read_random(miss, rb) + p.host_write(miss, rb)  # misses in, evicted dirty rows out
                    if prefetch:
                        out["prefetch"] += fill
                    else:
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
            alone = [sum(rank_cost([entry(i)]).values()) for i in range(T)]  # each table with its own cache
            ranks = assign_tables(alone, W)
            costs = [rank_cost([entry(i) for i in r]) if r else {} for r in ranks]
            busiest = max(range(W), key=lambda r: sum(costs[r].values()))
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
        return terms, mem, background

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
        node = max(assign_tables(costs, N), key=lambda n: sum(costs[i] for i in n))  # the busiest node's tables
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

    # ------------------------------------------------------------------ Frugal
    def _frugal(
        self, w: Workload, plan: Plan, p: Primitives, tr: List[TableTraffic]
    ) -> Tuple[Dict[str, float], float, Dict[str, float], Dict[str, float]]:
        """Frugal's step: device lookups of the rank's cached rows, host reads of every other
        distinct row, gradients exchanged through host memory, the owners' updates, the rows due
        next step written on the training thread, the rest flushed in the background (on a CPU
        device, which has no flusher thread, by the training thread too).
        Returns (terms, bytes per device, seconds per step of each thread beside the step, details)."""
        W = w.world_size
        hw = self.hw
        sf = w.state_floats_per_row * F32
        terms: Dict[str, float] = {}
        lookup = reads = update = exchange = inline = background = mem = 0.0
        for t, x in zip(w.tables, tr):
            rb = t.dim * F32
            # the rank's own cached rows from its device memory (each distinct row once), the rest from host
            lookup += p.device_gather(x.unique_rank - x.host_rows, rb) + x.ids * hw.frugal_id_s
            reads += p.host_read(x.host_rows, rb)
            owned = x.unique_all / W
            if hw.device_is_host:
                update += p.device_gather(owned, rb + sf) + p.device_scatter(owned, rb + sf)
            else:  # uncached owned rows come into dynamic slots (weights and state) before the update
                reads += p.host_read(x.owned_fresh_rows, rb + sf)
                update += p.device_gather(owned, rb + sf) + p.device_scatter(owned, rb + sf)
            # stage this rank's rows + gradients, the owners read theirs from every rank's mailbox
            exchange += p.d2h(x.unique_rank * rb) + 2 * p.memcpy(x.unique_rank * (rb + INDEX_BYTES)) + p.h2d(owned * rb)
            if hw.device_is_host:  # no flusher thread on a CPU device (FrugalConfig.flush_workers): all inline
                inline += p.host_write(x.flushed_rows, rb + sf)
            else:
                inline += p.host_write(x.inline_rows, rb + sf)
                background += p.host_write(x.flushed_rows - x.inline_rows, rb + sf)
            mem += int(plan.cache_ratio * t.rows + 1e-9) * (rb + sf)
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

    def _frugal_row_wise(
        self, w: Workload, plan: Plan, p: Primitives
    ) -> Tuple[Dict[str, float], float, Dict[str, float], Dict[str, float], List[TableTraffic]]:
        """Frugal tables. On one node: one engine over every rank (``frugal``; ``frugal_row_wise``
        with its one block is the same). Across N nodes (``frugal_row_wise``): a table's rows
        split into one block per node; a rank's ids go to the ranks of its local rank on the
        blocks' nodes (TorchRec's row-wise input dist over the N-rank cross-node group), where the
        node's engine serves them as a one-node Frugal over the block (about B ids per rank);
        the partial pooled sums of the N B samples a rank received go back reduce-scattered over
        the same group, their gradients the same way. Returns ``_frugal``'s results and the traffic."""
        if w.nodes == 1:
            traffic = [table_traffic(t, w, plan, self.hw.device_is_host) for t in w.tables]
            return (*self._frugal(w, plan, p, traffic), traffic)
        N, R, B, T = w.nodes, w.ranks_per_node, w.batch_size, len(w.tables)
        blocks = tuple(replace(t, rows=-(-t.rows // N), distribution=t.distribution.block(N)) for t in w.tables)
        draws = None if w.presample_draws is None else w.presample_draws / N
        node = replace(w, tables=blocks, world_size=R, nodes=1, presample_draws=draws)
        traffic = [table_traffic(t, node, plan, self.hw.device_is_host) for t in blocks]
        terms, mem, threads, details = self._frugal(node, plan, Primitives(self.hw, R), traffic)
        dim_sum = sum(t.dim for t in w.tables)
        ids = sum(t.ids for t in traffic)  # a rank's own ids, spread over the N blocks
        # With L >= 1 a batch's ids cross L steps early, to feed the owning nodes' windows, and its
        # step reuses what they delivered: once either way.
        sent = ids * INDEX_BYTES * (N - 1) / N + (N - 1) * B * T * LENGTH_BYTES
        terms["input_all_to_all"] = p.exchange(0.0, sent, 0, N - 1)
        terms["output_all_to_all"] = p.exchange(0.0, (N - 1) * B * dim_sum * F32, 0, N - 1, calls=2)
        terms["embedding_lookup"] += p.device_stream(N * B * dim_sum * F32)  # pooled partial sums of N B samples
        return terms, mem, threads, details, traffic

    # ------------------------------------------------------------------ sharing the machine
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


# ---------------------------------------------------------------------------- choosing a plan
CACHE_RATIO_CHOICES = (0.01, 0.02, 0.05, 0.1, 0.2)
LOOKAHEAD_CHOICES = (0, 2, 5, 10)
UVM_LOAD_FACTOR_CHOICES = (0.05, 0.1, 0.2, 0.4)
"""cache_load_factor choices of a fused_uvm_caching plan (TorchRec's default: 0.2)."""


def frugal_kind(nodes: int) -> str:
    """Frugal's sharding on ``nodes`` machines: ``frugal`` on one, ``frugal_row_wise`` across several."""
    return FRUGAL if nodes == 1 else FRUGAL_ROW_WISE


def shardings_for(nodes: int, device: str = "cuda") -> Tuple[str, ...]:
    """The choices to compare on ``nodes`` machines: Frugal's kind there, then the stock shardings,
    then (on a CUDA device) TorchRec's offloading."""
    return (frugal_kind(nodes),) + STOCK_SHARDINGS + (UVM_CHOICES if device == "cuda" else ())


def recommend_stock(
    model: CostModel, w: Workload, choice: str, load_factors: Sequence[float] = UVM_LOAD_FACTOR_CHOICES
) -> Tuple[Plan, StepCost]:
    """A stock choice on every table; for fused_uvm_caching, the cache_load_factor of least predicted
    step among those that fit (the smallest if none fits)."""
    if split_choice(choice)[1] != FUSED_UVM_CACHING:
        plan = Plan(choice)
        return plan, model.predict(w, plan)
    best: Optional[Tuple[Plan, StepCost]] = None
    for lf in load_factors:
        plan = Plan(choice, uvm_load_factor=lf)
        cost = model.predict(w, plan)
        if _better(cost, None if best is None else best[1]):
            best = (plan, cost)
    assert best is not None
    return best


def recommend_frugal(
    model: CostModel,
    w: Workload,
    cache_ratios: Sequence[float] = CACHE_RATIO_CHOICES,
    lookaheads: Sequence[int] = LOOKAHEAD_CHOICES,
) -> Tuple[Plan, StepCost]:
    """The cache ratio and lookahead of least predicted step time among those that fit in device
    memory (the smallest cache if none fits); ties go to the earlier choice."""
    best: Optional[Tuple[Plan, StepCost]] = None
    for c in cache_ratios:
        for L in lookaheads:
            plan = Plan(frugal_kind(w.nodes), cache_ratio=c, lookahead=L)
            cost = model.predict(w, plan)
            if _better(cost, None if best is None else best[1]):
                best = (plan, cost)
    assert best is not None
    return best


def predict_all(
    model: CostModel, w: Workload, frugal: Optional[Plan] = None, shardings: Optional[Sequence[str]] = None
) -> Dict[str, StepCost]:
    """Every choice's predicted step (default: ``shardings_for(w.nodes, device)``); Frugal with
    ``frugal``'s cache ratio and lookahead, or the recommended ones; fused_uvm_caching with its
    recommended cache_load_factor (``details["uvm_load_factor"]``)."""
    out: Dict[str, StepCost] = {}
    for s in shardings if shardings is not None else shardings_for(w.nodes, model.hw.device):
        if s in FRUGAL_KINDS:
            out[s] = model.predict(w, replace(frugal, sharding=s)) if frugal is not None else recommend_frugal(model, w)[1]
        else:
            plan, out[s] = recommend_stock(model, w, s)
            if split_choice(s)[1] == FUSED_UVM_CACHING:
                out[s].details["uvm_load_factor"] = plan.uvm_load_factor
    return out


PLANNER_SHARDINGS = (FRUGAL, "table_wise", "row_wise", "table_row_wise")
"""What a table may take when the planner chooses on one node (data_parallel replicates whole
tables); across nodes ``frugal_row_wise`` takes frugal's place (:func:`planner_shardings`); on a
CUDA device also TorchRec's offloading of table_wise and row_wise."""


def planner_shardings(nodes: int, device: str = "cuda", prefetch: bool = False) -> Tuple[str, ...]:
    """The planner's candidates: ``prefetch`` adds fused_uvm_caching with the prefetch pipeline
    (the model must then be trained with TorchRec's PrefetchTrainPipelineSparseDist)."""
    uvm = tuple(c for c in UVM_CHOICES if prefetch or not c.endswith(PREFETCH)) if device == "cuda" else ()
    return (frugal_kind(nodes),) + PLANNER_SHARDINGS[1:] + uvm


@dataclass
class PlanChoice:
    """The plan of least predicted step, and each uniform plan for comparison (all predictions)."""

    plan: Plan
    cost: StepCost
    uniform: Dict[str, Tuple[Plan, StepCost]]

    def predicted(self) -> Dict[str, StepCost]:
        """"plan" (the chosen one), then every uniform alternative by sharding."""
        return {"plan": self.cost, **{s: c for s, (_, c) in self.uniform.items()}}


def _better(cost: StepCost, than: Optional[StepCost]) -> bool:
    """A plan that fits beats one that does not; else faster by more than 0.1% (ties keep ``than``)."""
    return than is None or (cost.fits and not than.fits) or (
        cost.fits == than.fits and cost.step_s < than.step_s * (1 - 1e-3)
    )


def choose_plan(
    model: CostModel,
    w: Workload,
    candidates: Optional[Mapping[str, Sequence[str]]] = None,
    cache_ratios: Sequence[float] = CACHE_RATIO_CHOICES,
    lookaheads: Sequence[int] = LOOKAHEAD_CHOICES,
    rounds: int = 4,
    load_factors: Sequence[float] = UVM_LOAD_FACTOR_CHOICES,
) -> PlanChoice:
    """A sharding per table, a cache ratio and a lookahead of least predicted step time.

    ``candidates`` maps each table to the shardings it may take (default: ``planner_shardings``;
    a table with one candidate is fixed). A local search starts from each uniform plan (every
    table on one sharding where it allows it, Frugal's settings tuned) and alternates: each table
    in turn, largest first, moves to the sharding that lowers the predicted step of the whole
    mixed plan (``CostModel.predict``); then the cache ratio and L are tuned for the assignment;
    until a round changes nothing. The best end point wins. The step is not a sum of per-table
    costs (shared all-to-all latencies, the engine's fixed work, the gate stall, contention), so
    every move is priced on the whole plan; the result is never predicted slower than the best
    uniform plan.
    """
    names = [t.name for t in sorted(w.tables, key=lambda t: -t.rows * t.dim)]
    cand = {n: tuple((candidates or {}).get(n, planner_shardings(w.nodes, model.hw.device))) for n in names}
    if any(not c for c in cand.values()):
        raise ValueError("every table needs at least one candidate sharding")

    def tune(assign: Dict[str, str], plan: Plan, cost: Optional[StepCost]) -> Tuple[Plan, StepCost]:
        """The best cache ratio and L (with fused_uvm_caching tables: cache_load_factor) for
        ``assign`` (kept as in ``plan`` on ties)."""
        best = (plan, cost if cost is not None else model.predict(w, plan))
        if set(assign.values()) & set(FRUGAL_KINDS):
            for c in cache_ratios:
                for L in lookaheads:
                    trial = Plan.of(assign, c, L, best[0].uvm_load_factor)
                    trial_cost = model.predict(w, trial)
                    if _better(trial_cost, best[1]):
                        best = (trial, trial_cost)
        if any(split_choice(s)[1] == FUSED_UVM_CACHING for s in assign.values()):
            for lf in load_factors:
                trial = Plan.of(assign, best[0].cache_ratio, best[0].lookahead, lf)
                trial_cost = model.predict(w, trial)
                if _better(trial_cost, best[1]):
                    best = (trial, trial_cost)
        return best

    def descend(assign: Dict[str, str], plan: Plan, cost: StepCost) -> Tuple[Plan, StepCost]:
        for _ in range(rounds):
            moved = False
            for n in names:
                for s in cand[n]:
                    if s == assign[n]:
                        continue
                    trial = {**assign, n: s}
                    trial_plan = Plan.of(trial, plan.cache_ratio, plan.lookahead, plan.uvm_load_factor)
                    trial_cost = model.predict(w, trial_plan)
                    if _better(trial_cost, cost):
                        assign, plan, cost, moved = trial, trial_plan, trial_cost, True
            if not moved:
                break
            plan, cost = tune(assign, plan, cost)
        return plan, cost

    uniform: Dict[str, Tuple[Plan, StepCost]] = {}
    best: Optional[Tuple[Plan, StepCost]] = None
    for s in dict.fromkeys(x for n in names for x in cand[n]):
        assign = {n: s if s in cand[n] else cand[n][0] for n in names}
        uniform[s] = tune(assign, Plan.of(assign), None)
        plan, cost = descend(assign, *uniform[s])
        if best is None or _better(cost, best[1]):
            best = (plan, cost)
    assert best is not None
    plan, cost = best
    return PlanChoice(plan, cost, uniform)
