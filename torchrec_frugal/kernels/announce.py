"""A rank's announcement of a lookahead step: its distinct rows whose reads are announced, grouped by owner.

After :func:`~.unique_rows.unique_rows`, one pass reads each distinct row's flag and owner (both
in one per-row record, so one cache miss a row) and nothing else, so that the misses of
successive rows overlap; then, in cache, each owner's rows are counted and placed: no sort.
Each group keeps the order of the rows' last ids.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .compiled import kernel
from .unique_rows import bitmap, unique_rows


class AnnounceScratch:
    """One thread's scratch of :func:`unique_rows` and :func:`group_announced`, grown as steps need."""

    def __init__(self, num_rows: int) -> None:
        self.bits = bitmap(num_rows)
        self._grow(0)

    def _grow(self, n: int) -> None:
        self.distinct = np.empty(n, dtype=np.int64)
        self.owners = np.empty(n, dtype=np.int64)
        self.grouped = np.empty(n, dtype=np.int64)

    def _room(self, n: int) -> None:
        if self.distinct.shape[0] < n:
            self._grow(max(n, 2 * self.distinct.shape[0]))

    def announce(self, ids: np.ndarray, announced: np.ndarray, owner: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The distinct ``ids`` whose ``announced`` is set, grouped by ``owner`` (a view of the
        scratch, valid until the next call); ``counts`` (int64, one per owner) receives each
        owner's count."""
        self._room(ids.shape[0])
        k = unique_rows(ids, self.bits, self.distinct)
        kept = group_announced(self.distinct[:k], announced, owner, self.owners, self.grouped, counts)
        return self.grouped[:kept]

    def unique(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        """The distinct rows of ``parts`` (a new array), in the order of their last occurrence."""
        ids = np.concatenate(parts) if len(parts) != 1 else parts[0]
        self._room(ids.shape[0])
        k = unique_rows(ids, self.bits, self.distinct)
        return self.distinct[:k].copy()


def _group_twin(
    rows: np.ndarray, announced: np.ndarray, owner: np.ndarray, owners: np.ndarray, grouped: np.ndarray,
    counts: np.ndarray,
) -> int:  # fmt: skip
    kept = rows[announced[rows]]
    own = owner[kept]
    k = kept.shape[0]
    grouped[:k] = kept[np.argsort(own, kind="stable")]
    counts[:] = np.bincount(own, minlength=counts.shape[0])
    return k


@kernel(_group_twin)
def group_announced(
    rows: np.ndarray, announced: np.ndarray, owner: np.ndarray, owners: np.ndarray, grouped: np.ndarray,
    counts: np.ndarray,
) -> int:  # fmt: skip
    """Writes the ``rows`` whose ``announced`` is set into ``grouped``, grouped by ``owner``
    (owner 0's first), each group in the rows' order; ``counts[o]``: owner o's rows. Returns
    how many rows were written.

    ``owners``: int64 scratch of ``len(rows)``; ``grouped``: as long (the rows not announced
    go, as one more group, after the owners'). The gradients' counting sort by owner
    (:func:`~.owner_groups.group_by_owner`) carries a payload and needs increasing rows; this
    one filters, and its rows come in any order.
    """
    world = counts.shape[0]
    n = rows.shape[0]
    for j in range(n):  # the misses only: no store whose address waits for one
        r = rows[j]
        o = owner[r]
        a = announced[r]
        owners[j] = o if a else world
    sizes = np.zeros(world + 1, dtype=np.int64)
    for j in range(n):
        sizes[owners[j]] += 1
    ends = np.empty(world + 1, dtype=np.int64)
    at = 0
    for o in range(world + 1):
        ends[o] = at
        at += sizes[o]
    for j in range(n):
        o = owners[j]
        grouped[ends[o]] = rows[j]
        ends[o] += 1
    counts[:] = sizes[:world]
    return n - sizes[world]
