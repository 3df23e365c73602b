"""Synthetic skewed id streams: Zipf(s) over a random permutation of each table's rows.

Real embedding traffic is heavy-tailed (about 1% of rows take 92% of accesses on Criteo-like
data, Zipf s ~ 1.2 on 1M-row tables). Ids are permuted so that hotness is not row order.
Streams are deterministic per (seed, rank, step), so any process can regenerate any rank's batch.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np
import torch

from torchrec_frugal.presample import count_ids


class ZipfIds:
    """Ids of one table drawn from Zipf(s) over a fixed random permutation of its rows."""

    def __init__(self, num_rows: int, s: float = 1.2, seed: int = 0) -> None:
        ranks = np.arange(1, num_rows + 1, dtype=np.float64)
        cdf = np.cumsum(ranks ** (-s))
        self._cdf = cdf / cdf[-1]
        self._perm = np.random.default_rng(seed).permutation(num_rows)

    @property
    def num_rows(self) -> int:
        return self._perm.shape[0]

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        k = np.searchsorted(self._cdf, rng.random(n), side="right")
        return self._perm[np.minimum(k, self._perm.shape[0] - 1)]


class ZipfWorkload:
    """Per-rank, per-step batches of ids for several tables."""

    def __init__(self, table_rows: Sequence[int], ids_per_step: int, s: float = 1.2, seed: int = 0) -> None:
        self.tables = [ZipfIds(n, s, seed * 1000 + t) for t, n in enumerate(table_rows)]
        self.ids_per_step = ids_per_step
        self.seed = seed

    def batch(self, rank: int, step: int) -> List[torch.Tensor]:
        """Ids of every table for ``rank`` at ``step`` (int64, with duplicates)."""
        rng = np.random.default_rng([self.seed, rank, step])
        return [torch.from_numpy(t.sample(self.ids_per_step, rng)) for t in self.tables]

    def counts(self, rank: int, steps: int) -> List[torch.Tensor]:
        """Id counts of each table over this rank's first ``steps`` batches (the pre-sample)."""
        return count_ids((self.batch(rank, s) for s in range(steps)), [t.num_rows for t in self.tables])
