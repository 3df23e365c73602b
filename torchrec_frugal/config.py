"""Typed configuration of the Frugal engine (no TorchRec imports)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Optional

from .priorities import QUEUE_KINDS

LOOKAHEAD = 10
"""The default lookahead window L: the paper's (it swept 2..14). The engine, the examples, the
planner and the cost model read it here."""
CACHE_RATIO = 0.05
"""The default share of each table's rows a rank caches: the middle of the paper's sweep (1, 5, 10 %)."""
OPTIMIZER_KINDS = ("sgd", "rowwise_adagrad", "adagrad", "adam")
HOST_PATHS = ("auto", "zero_copy", "pinned")


@dataclass
class FrugalConfig:
    """Knobs of the Frugal mechanism.

    lookahead: L, the number of future batches per rank whose ids feed the flush priorities.
        0 turns proactive flushing off: every update is written to host before the next step
        (write-through, the ablation baseline).
    cache_ratio: fraction of each table's rows that each rank caches (static, disjoint).
    flush_workers: background flusher threads per rank. Whatever the number, the exchange worker
        flushes the rows the next step reads at the end of each step's update, and flushes ahead
        while it waits for its peers' gradients. 0: the exchange worker also flushes the rest, while
        a gate waits (or when the rows come due), and the deferred rows past ``max_deferred_rows``.
        None picks 1 on an accelerator, whose threads mostly wait for the device, and 0 on a CPU
        device, where the training threads keep every core busy and a flusher thread takes its
        time from them (on 2 cores with 2 ranks it made the DLRM example 5% slower).
    queue: "two_level" (the paper's bucket queue) or "heap" (binary heap, for the ablation).
    flush_chunk_rows: rows a flusher takes from the queue at once; bounds lock hold times.
    max_deferred_rows: rows that may wait in the infinity bucket (no read in the window) before
        the flushers drain it. Deferral coalesces repeated updates of a row into one host write;
        the bound caps the device memory that uncached deferred rows hold.
    update_uncached_in_host: where an owner updates a row it does not cache. False: in a dynamic
        slot of its device memory, flushed to host in the background (the paper's path). True:
        in place in host memory during the update (nobody reads host before the update ends).
        None picks True on a CPU device, where device memory is host memory and a dynamic slot
        would only add two copies, and False on an accelerator.
    lookahead_thread: whether a lookahead worker thread publishes this rank's announced steps and
        ingests its peers' (L > 0). None picks one on an accelerator and none on a CPU device, where
        the exchange worker does both (``engine/placement.py`` resolves the three device choices).
    host_path: how a CUDA device reads and writes host rows. "zero_copy": the shared tables are
        page-locked and mapped into the device's address space, lookups gather host rows with
        one kernel over PCIe and flushes scatter into them the same way. "pinned": the host
        gathers into a page-locked buffer, then one asynchronous copy (flushes: the reverse).
        "auto": zero_copy where the tables can be registered, else pinned. On a CPU device the
        tables are read in place (zero_copy); "pinned" there stages through a buffer, as on CUDA.
    timeout_s: longest wait on another rank before the run is aborted with an error.
    shm_dir: the shared-memory directory that holds the host tables and the mailboxes; None:
        $TORCHREC_FRUGAL_SHM_DIR, else /dev/shm. Every local rank must use the same one.
    mailbox_rows: rows a rank's mailbox holds at first per step (announced rows of each of the
        L + 2 ring slots, gradient rows of a step). A step with more rows grows it (doubling):
        the mailbox follows the batch, not the tables.
    """

    lookahead: int = LOOKAHEAD
    cache_ratio: float = CACHE_RATIO
    flush_workers: Optional[int] = None
    queue: str = "two_level"
    flush_chunk_rows: int = 8192
    max_deferred_rows: int = 65536
    update_uncached_in_host: Optional[bool] = None
    lookahead_thread: Optional[bool] = None
    host_path: str = "auto"
    timeout_s: float = 60.0
    shm_dir: Optional[str] = None
    mailbox_rows: int = 16384

    def __post_init__(self) -> None:
        check_int("lookahead", self.lookahead, 0)
        check_real("cache_ratio", self.cache_ratio, 0.0, 1.0)
        if self.flush_workers is not None:
            check_int("flush_workers", self.flush_workers, 0)
        if self.queue not in QUEUE_KINDS:
            raise ValueError(f"queue must be one of {tuple(QUEUE_KINDS)}, got {self.queue!r}")
        check_int("flush_chunk_rows", self.flush_chunk_rows, 1)
        check_int("max_deferred_rows", self.max_deferred_rows, 0)
        if self.update_uncached_in_host is not None and not isinstance(self.update_uncached_in_host, bool):
            raise ValueError(f"update_uncached_in_host must be True, False or None, got {self.update_uncached_in_host!r}")
        if self.lookahead_thread is not None and not isinstance(self.lookahead_thread, bool):
            raise ValueError(f"lookahead_thread must be True, False or None, got {self.lookahead_thread!r}")
        if self.host_path not in HOST_PATHS:
            raise ValueError(f"host_path must be one of {HOST_PATHS}, got {self.host_path!r}")
        check_real("timeout_s", self.timeout_s, 0.0, math.inf, open_low=True)
        if self.shm_dir is not None and not isinstance(self.shm_dir, str):
            raise ValueError(f"shm_dir must be a path (str) or None, got {self.shm_dir!r}")
        check_int("mailbox_rows", self.mailbox_rows, 1)


def check_int(name: str, value: object, minimum: int) -> None:
    """Refuse, naming the field, a count that is not an int (2.5, "3", True) or is below ``minimum``:
    where it is given, not later inside the shared-memory sizing."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_real(name: str, value: object, low: float, high: float, open_low: bool = False) -> None:
    """Refuse, naming the field, a number that is not real or lies outside [low, high] ((low, high]
    with ``open_low``); NaN is outside every range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    inside = (low < value if open_low else low <= value) and value <= high
    if not inside:
        if high == math.inf:
            bound = f"> {low:g}" if open_low else f">= {low:g}"
        else:
            bound = f"in ({low:g}, {high:g}]" if open_low else f"in [{low:g}, {high:g}]"
        raise ValueError(f"{name} must be {bound}, got {value}")


@dataclass(frozen=True)
class TableSpec:
    """One logical embedding table served by an engine."""

    name: str
    num_embeddings: int
    embedding_dim: int

    def __post_init__(self) -> None:
        for name in ("num_embeddings", "embedding_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"table {self.name!r}: {name} must be an int, got {value!r}")
        if self.num_embeddings <= 0 or self.embedding_dim <= 0:
            raise ValueError(
                f"table {self.name!r}: num_embeddings and embedding_dim must be positive, "
                f"got {self.num_embeddings} x {self.embedding_dim}"
            )


@dataclass
class OptimizerSpec:
    """Row optimizer applied identically to cached and host copies.

    Mutable on purpose: a learning-rate change (e.g. through a KeyedOptimizer's param_groups)
    takes effect at the next update.
    """

    kind: str = "sgd"
    lr: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZER_KINDS:
            raise ValueError(f"optimizer kind must be one of {OPTIMIZER_KINDS}, got {self.kind!r}")
        for name in ("lr", "eps", "weight_decay"):
            check_real(name, getattr(self, name), 0.0, math.inf)
        for name in ("beta1", "beta2"):
            check_real(name, getattr(self, name), 0.0, 1.0)
            if getattr(self, name) == 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
