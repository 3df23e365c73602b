"""Static owner caches: which rank owns each row, and the rows an owner holds on its device.

Every row has exactly one owner, the only rank that applies its updates. The hottest rows of each
table (by id counts of a pre-sample, summed over ranks) are split round-robin over the ranks and
cached by their owner in device memory for the whole run (no eviction). Every other row is owned
by ``id % world`` and lives only in host memory; while such a row has an update that is not yet
flushed, its owner keeps the updated value in a dynamic slot of the same store.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

from ..config import TableSpec
from ..errors import FrugalInputError


@dataclass
class Ownership:
    """Row ownership of a fused row space, identical on every rank."""

    owner: np.ndarray  # int16 [num_rows]: owning rank of each row
    cached: np.ndarray  # bool [num_rows]: row sits in its owner's static cache
    # float64 [num_tables]: per table, the share of the pre-sample's ids whose rows are cached (on
    # any rank); NaN where the pre-sample holds no id of the table (no rows known to be hot)
    cached_share: np.ndarray

    def cached_rows(self, rank: int) -> np.ndarray:
        return np.flatnonzero(self.cached & (self.owner == rank))


def assign_ownership(
    counts: Sequence[np.ndarray], cache_ratio: float, world_size: int
) -> Ownership:
    """Pick each rank's cached rows from global per-table id counts.

    ``counts[t]`` holds the summed pre-sample counts of table t's ids. Each rank caches
    ``floor(cache_ratio * rows)`` rows of each table (all of them at most, split over the ranks),
    the hottest first, dealt round-robin so that every rank gets an equal share of the heat.
    """
    owners: List[np.ndarray] = []
    cached: List[np.ndarray] = []
    shares: List[float] = []
    for c in counts:
        n = c.shape[0]
        owner = (np.arange(n, dtype=np.int64) % world_size).astype(np.int16)
        is_cached = np.zeros(n, dtype=bool)
        per_rank = int(cache_ratio * n + 1e-9)  # tolerate float error: 0.29 * 100 is 28.999...
        k = min(n, per_rank * world_size) if cache_ratio < 1.0 else n
        if k > 0:
            # Hottest first; ties broken by row id so every rank computes the same order.
            order = np.lexsort((np.arange(n), -c.astype(np.int64)))[:k]
            owner[order] = (np.arange(k) % world_size).astype(np.int16)
            is_cached[order] = True
        owners.append(owner)
        cached.append(is_cached)
        total = float(c.sum())
        shares.append(float(c[is_cached].sum()) / total if total > 0 else math.nan)
    return Ownership(np.concatenate(owners), np.concatenate(cached), np.array(shares, dtype=np.float64))


def ownership_from_presample(
    tables: Sequence[TableSpec],
    presample_counts: Optional[Sequence[torch.Tensor]],
    cache_ratio: float,
    world_size: int,
    sum_over_ranks: Callable[[torch.Tensor], torch.Tensor],
) -> Ownership:
    """Ownership from each rank's pre-sample id counts per table (None: no counts, nothing is hot),
    summed over ranks with ``sum_over_ranks`` so that every rank computes the same ownership."""
    sizes = [t.num_embeddings for t in tables]
    if presample_counts is None:
        counts = torch.zeros(sum(sizes), dtype=torch.float64)
    else:
        if len(presample_counts) != len(tables):
            raise FrugalInputError(f"presample_counts has {len(presample_counts)} tensors for {len(tables)} tables")
        for spec, c in zip(tables, presample_counts):
            if c.numel() != spec.num_embeddings:
                raise FrugalInputError(
                    f"table {spec.name!r}: presample counts have {c.numel()} entries, expected {spec.num_embeddings}"
                )
        counts = torch.cat([c.reshape(-1).to("cpu", torch.float64) for c in presample_counts])
    per_table = [part.numpy() for part in sum_over_ranks(counts).split(sizes)]
    return assign_ownership(per_table, cache_ratio, world_size)


class OwnerStore:
    """The rows a rank owns and holds on its device: static cache slots plus dynamic slots.

    Slots ``[0, num_static)`` hold this rank's cached rows for the whole run. Dynamic slots hold
    uncached owned rows whose newest value has not reached host memory yet; they are released
    once flushed. ``slot_of[row]`` is -1 for rows this rank does not hold.
    """

    def __init__(
        self, num_rows: int, cached_rows: np.ndarray, dim: int, state_width: int, device: torch.device,
        max_dynamic: Optional[int] = None,
    ) -> None:
        """``max_dynamic``: the most rows that can ever hold a dynamic slot at once (this rank's
        uncached rows), where known. On a CPU device all of them are reserved at once: pages
        are touched only as slots are used (the free list is a stack, so the ones used are the
        lowest), while growing copies the whole store, every page of it a fresh fault. Device
        memory is real where it is reserved, so elsewhere the store starts small and grows."""
        self.device = device
        self.dim = dim
        self.state_width = state_width
        self.num_static = int(cached_rows.shape[0])
        self.slot_of = np.full(num_rows, -1, dtype=np.int64)
        self.slot_of[cached_rows] = np.arange(self.num_static)
        self.cached_rows = cached_rows
        reserve = device.type == "cpu" and max_dynamic is not None
        cap = self.num_static + (max(max_dynamic, 1) if reserve else 1024)  # type: ignore[type-var]
        # A dynamic slot is filled when it is given out: the reserve is left untouched.
        self.weights = torch.empty(cap, dim, dtype=torch.float32, device=device)
        self.state = torch.empty(cap, state_width, dtype=torch.float32, device=device)
        self.weights[: self.num_static if reserve else cap].zero_()
        self.state[: self.num_static if reserve else cap].zero_()
        self._free = np.arange(cap - 1, self.num_static - 1, -1, dtype=np.int64)  # stack, top at the end
        self._nfree = cap - self.num_static

    @property
    def dynamic_in_use(self) -> int:
        return self.weights.shape[0] - self.num_static - self._nfree

    def alloc(self, rows: np.ndarray) -> np.ndarray:
        """Give dynamic slots to ``rows`` (unique, not held yet); returns the slots."""
        k = rows.shape[0]
        if k > self._nfree:
            self._grow(k - self._nfree)
        slots = self._free[self._nfree - k : self._nfree][::-1].copy()
        self._nfree -= k
        self.slot_of[rows] = slots
        return slots

    def release(self, rows: np.ndarray) -> None:
        """Return the dynamic slots of ``rows`` (uncached rows that were flushed)."""
        slots = self.slot_of[rows]
        if slots.size and slots.min() < self.num_static:
            raise ValueError("release() takes rows held in dynamic slots only")
        self.slot_of[rows] = -1
        k = slots.shape[0]
        if self._nfree + k > self._free.shape[0]:
            self._free = np.concatenate([self._free, np.empty(k, dtype=np.int64)])
        self._free[self._nfree : self._nfree + k] = slots
        self._nfree += k

    def _grow(self, need: int) -> None:
        old = self.weights.shape[0]
        extra = max(need, old - self.num_static, 1024)
        self.weights = torch.cat([self.weights, torch.zeros(extra, self.dim, device=self.device)])
        self.state = torch.cat([self.state, torch.zeros(extra, self.state_width, device=self.device)])
        new = np.arange(old + extra - 1, old - 1, -1, dtype=np.int64)
        self._free = np.concatenate([new, self._free[: self._nfree]])
        self._nfree += extra
