"""What the cost model prices: the tables and their id distributions, the dense model, the
workload of one step, the plan (a sharding per table), and the predicted step (:class:`StepCost`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ...config import CACHE_RATIO, LOOKAHEAD

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
        group_weights = [ranks ** (-s)]
        group_counts = [np.ones(head)]
        if rows > head:
            steps = int(np.ceil(np.log(rows / head) / np.log(ratio))) + 1
            edges = np.unique(np.round(head * ratio ** np.arange(steps + 1)).astype(np.int64))
            edges = np.concatenate([edges[edges < rows], [rows]])  # group (edges[j], edges[j+1]]
            low, high = edges[:-1] + 0.5, edges[1:] + 0.5
            sizes = (edges[1:] - edges[:-1]).astype(np.float64)
            integral = np.log(high / low) if abs(s - 1.0) < 1e-12 else (high ** (1 - s) - low ** (1 - s)) / (1 - s)
            group_weights.append(integral / sizes)
            group_counts.append(sizes)
        weights, counts = np.concatenate(group_weights), np.concatenate(group_counts)
        return cls(weights / float((weights * counts).sum()), counts)

    @classmethod
    def uniform(cls, rows: int) -> "RowDistribution":
        return cls(np.array([1.0 / rows]), np.array([float(rows)]))

    @classmethod
    def from_counts(cls, counts: Sequence[float]) -> "RowDistribution":
        """From per-row id counts of a pre-sample or a trace (rows never seen: probability 0)."""
        per_row = np.asarray(counts, dtype=np.float64).reshape(-1)
        if per_row.size == 0 or (per_row < 0).any() or per_row.sum() <= 0:
            raise ValueError("counts must be non-negative with a positive sum")
        values, multiplicity = np.unique(per_row, return_counts=True)
        order = np.argsort(-values)
        return cls(values[order] / per_row.sum(), multiplicity[order].astype(np.float64))

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
        picked = np.clip(k - before, 0.0, seen)
        rest = max(0.0, k - float(picked.sum()))
        unseen = self.count - seen
        if rest > 0 and unseen.sum() > 0:
            picked = picked + unseen * min(1.0, rest / float(unseen.sum()))
        return picked



@dataclass(frozen=True)
class CostTable:
    """One embedding table: rows, dim, ids per sample, and how its ids are distributed.

    ``epoch_draws``: ids of this table in one epoch of real data, whose tail covers the table (every
    row is read at least once an epoch). A Zipf distribution over many rows leaves most of them
    undrawn in that many draws; the rows it leaves out are read too, once each: the table's
    ``tail_rate``. None: the distribution is the data (synthetic ids), no such rows.
    """

    name: str
    rows: int
    dim: int
    distribution: RowDistribution
    pooling: float = 1.0  # ids per sample (TorchRec's pooling factor)
    epoch_draws: Optional[float] = None

    def __post_init__(self) -> None:
        if self.epoch_draws is not None and self.epoch_draws <= 0:
            raise ValueError(f"table {self.name}: epoch_draws must be > 0, got {self.epoch_draws}")

    @classmethod
    def zipf(cls, name: str, rows: int, dim: int, s: float, pooling: float = 1.0,
             epoch_draws: Optional[float] = None) -> "CostTable":  # fmt: skip
        return cls(name, rows, dim, RowDistribution.zipf(rows, s), pooling, epoch_draws)

    def tail_rate(self) -> float:
        """Distinct rows per draw that the real data reads and the distribution does not: the rows
        left undrawn by ``epoch_draws`` draws, spread evenly over the epoch (each a compulsory miss
        of any cache: read once an epoch, never again before the epoch ends). 0 without ``epoch_draws``."""
        if self.epoch_draws is None:
            return 0.0
        return max(0.0, self.rows - self.distribution.expected_unique(self.epoch_draws)) / self.epoch_draws


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
            for fan_in, fan_out in zip(widths, widths[1:]):
                flops += 2.0 * fan_in * fan_out
                params += fan_in * fan_out + fan_out
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
    cache_ratio: float = CACHE_RATIO
    lookahead: int = LOOKAHEAD
    tables: Mapping[str, str] = field(default_factory=dict)
    uvm_load_factor: float = UVM_LOAD_FACTOR  # fused_uvm_caching tables: TorchRec's cache_load_factor
    uvm_algorithm: str = "lru"  # fused_uvm_caching: FBGEMM's CacheAlgorithm (LRU, its default, or LFU)

    def __post_init__(self) -> None:
        for sharding in (self.sharding, *self.tables.values()):
            if sharding not in SHARDINGS:
                raise ValueError(f"unknown sharding {sharding!r}; choose one of {SHARDINGS}")
        if not 0.0 <= self.cache_ratio <= 1.0 or self.lookahead < 0:
            raise ValueError("cache_ratio must be in [0, 1] and lookahead >= 0")
        if not 0.0 < self.uvm_load_factor <= 1.0 or self.uvm_algorithm not in UVM_ALGORITHMS:
            raise ValueError(f"uvm_load_factor must be in (0, 1] and uvm_algorithm one of {UVM_ALGORITHMS}")

    @classmethod
    def of(cls, shardings: Mapping[str, str], cache_ratio: float = CACHE_RATIO, lookahead: int = LOOKAHEAD,
           uvm_load_factor: float = UVM_LOAD_FACTOR) -> "Plan":
        """The plan giving each table its sharding in ``shardings`` (the most common one as default)."""
        counts = {sharding: list(shardings.values()).count(sharding) for sharding in SHARDINGS}
        default = max(SHARDINGS, key=lambda sharding: counts[sharding])
        exceptions = {name: sharding for name, sharding in shardings.items() if sharding != default}
        return cls(default, cache_ratio, lookahead, exceptions, uvm_load_factor)

    def sharding_of(self, table: str) -> str:
        return self.tables.get(table, self.sharding)

    def groups(self, workload: "Workload") -> Dict[str, List[int]]:
        """Indices of ``workload``'s tables by sharding (shardings in ``SHARDINGS`` order)."""
        unknown = sorted(set(self.tables) - {table.name for table in workload.tables})
        if unknown:
            raise ValueError(f"the plan names tables the workload lacks: {unknown}")
        groups: Dict[str, List[int]] = {}
        for sharding in SHARDINGS:
            indices = [i for i, table in enumerate(workload.tables) if self.sharding_of(table.name) == sharding]
            if indices:
                groups[sharding] = indices
        return groups


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
                "terms_ms": {term: 1e3 * seconds for term, seconds in self.terms.items()}, "fits": self.fits,
                "memory_gib_per_device": self.memory_bytes_per_device / 2**30,
                "host_memory_gib_per_node": self.host_memory_bytes_per_node / 2**30,
                "background_ms": 1e3 * self.background_s, "details": self.details}  # fmt: skip

