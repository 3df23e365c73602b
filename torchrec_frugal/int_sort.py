"""Sorted sets of non-negative integer ids on CPU: stable radix sorts, unique ids with their
inverse, and the check that rows are unique. The engine's per-step deduplications run compiled
(:mod:`~torchrec_frugal.kernels`); every other one in the package goes through here.

numpy's stable sort of 16-bit integers is a radix sort, O(n); of wider integers it is a timsort.
PyTorch's CPU sort uses its radix sort only from 32,768 values up and a comparison sort below,
where the 26,624 row indices of a DLRM batch of 1024 fall (docs/performance.md, "Sorting row ids
by radix"). Ids below 2^16 take one pass, below 2^32 two, least significant half first (each pass
is stable, so ties keep the order of the pass before). The permutation is the one any stable sort
gives: results do not depend on which sort made it.

``np.unique`` is not used: numpy 2 dedupes unsorted integers by hashing, slower than a sort and
a mask at a batch's few thousand rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

_HALF = 1 << 16


def stable_argsort_np(keys: np.ndarray) -> np.ndarray:
    """Indices (int64) that sort the 1-D integer ``keys``, equal keys in their order."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    top = int(keys.max())
    if top >= _HALF * _HALF or int(keys.min()) < 0:
        return np.argsort(keys, kind="stable")
    order = np.argsort((keys & (_HALF - 1)).astype(np.uint16), kind="stable")
    if top >= _HALF:
        order = order[np.argsort((keys[order] >> 16).astype(np.uint16), kind="stable")]
    return order


def stable_argsort(keys: torch.Tensor) -> torch.Tensor:
    """:func:`stable_argsort_np` of a CPU tensor; ``torch.argsort(stable=True)`` on a device."""
    if keys.device.type != "cpu":
        return torch.argsort(keys, stable=True)
    return torch.from_numpy(stable_argsort_np(keys.numpy()))


def unique_inverse(ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(ids, sorted=True, return_inverse=True)`` of 1-D int64 ids, by a radix sort on CPU."""
    if ids.device.type != "cpu":
        return torch.unique(ids, sorted=True, return_inverse=True)
    u = sorted_unique(ids)
    return u.values, u.inverse


@dataclass
class SortedUnique:
    """1-D ids deduplicated, with the stable sort that did it: ``ids[order]`` lists each unique
    value's occurrences, in the ids' order, at ``order[starts[r]:starts[r + 1]]``."""

    values: torch.Tensor  # the sorted unique ids
    inverse: torch.Tensor  # each id's index into ``values``
    order: torch.Tensor  # the stable permutation that sorts the ids
    starts: torch.Tensor  # [len(values) + 1]: where each unique value's run begins in ``order``


def sorted_unique(ids: torch.Tensor) -> SortedUnique:
    """:class:`SortedUnique` of 1-D int64 CPU ``ids`` (radix sorted): the unique rows of a batch
    and, for free, its values grouped by row (what the pooling's backward sums per row)."""
    a = ids.numpy()
    order = stable_argsort_np(a)
    values, inverse, first = _runs(a, order)
    starts = np.empty(values.shape[0] + 1, dtype=np.int64)
    starts[:-1] = np.flatnonzero(first)
    starts[-1] = a.shape[0]
    return SortedUnique(*(torch.from_numpy(x) for x in (values, inverse, order, starts)))


def unique_by_order(values: np.ndarray, order: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The sorted unique ``values`` and each value's index (int64) into them, ``order`` being a
    permutation that sorts ``values``."""
    unique, inverse, _ = _runs(values, order)
    return unique, inverse


def unique_inverse_np(values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of 1-D integer ``values`` (same dtypes, same
    order), by a radix sort."""
    return unique_by_order(values, stable_argsort_np(values))


def first_repeat(values: np.ndarray) -> Optional[int]:
    """A value that occurs more than once in 1-D integer ``values``, or None if they are unique;
    one comparison a value where they increase already (the unique rows a sort gave)."""
    if values.size < 2 or bool(np.all(values[1:] > values[:-1])):
        return None
    srt = values[stable_argsort_np(values)]
    same = np.flatnonzero(srt[1:] == srt[:-1])
    return int(srt[same[0]]) if same.size else None


def _runs(values: np.ndarray, order: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the sorted unique ``values``, each value's index into them, whether each position of
    ``values[order]`` begins a run of equal values)."""
    first = np.empty(values.shape[0], dtype=bool)
    if values.size == 0:
        return values.copy(), np.zeros(0, dtype=np.int64), first
    srt = values[order]
    first[0] = True
    np.not_equal(srt[1:], srt[:-1], out=first[1:])
    inverse = np.empty(values.shape[0], dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return srt[first], inverse, first
