"""torchrec_frugal.presample.count_ids: the one pre-sample counter of the workload and the examples."""
from __future__ import annotations

from typing import List, Sequence

import numpy as np
import pytest
import torch

from torchrec_frugal import presample
from torchrec_frugal.synthetic_ids import ZipfWorkload


def _per_table_bincount(batches: Sequence[Sequence[torch.Tensor]], rows: Sequence[int]) -> List[np.ndarray]:
    """What every copy of the counter did: one bincount per table and batch, summed."""
    out = [np.zeros(n, dtype=np.int64) for n in rows]
    for batch in batches:
        for c, ids in zip(out, batch):
            c += np.bincount(ids.reshape(-1).numpy(), minlength=c.shape[0])
    return out


@pytest.mark.parametrize("flush_ids", [1, 50, 1 << 20])  # a bincount per batch, every few batches, once
def test_counts_equal_per_table_bincounts(flush_ids: int) -> None:
    rows = [1000, 7, 300]
    wl = ZipfWorkload(rows, ids_per_step=64, s=1.2, seed=3)
    batches = [wl.batch(1, s) for s in range(9)]
    got = presample.count_ids(iter(batches), rows, min_flush_ids=flush_ids)
    assert [c.dtype for c in got] == [torch.int64] * 3
    assert [c.tolist() for c in got] == [c.tolist() for c in _per_table_bincount(batches, rows)]
    assert [c.tolist() for c in wl.counts(1, 9)] == [c.tolist() for c in got]


def test_tables_of_different_lengths_and_shapes() -> None:
    """Per table any shape and length (a KJT's values split by key), int32 ids too; no batch: zeros."""
    rows = [5, 3]
    batch = [torch.tensor([[0, 4], [4, 4]], dtype=torch.int32), torch.tensor([2])]
    a, b = presample.count_ids([batch, batch], rows)
    assert a.tolist() == [2, 0, 0, 0, 6] and b.tolist() == [0, 0, 2]
    assert [c.tolist() for c in presample.count_ids([], rows)] == [[0] * 5, [0] * 3]


def test_ids_outside_their_table_are_refused() -> None:
    with pytest.raises(ValueError, match="table 1: id 3 is outside its 3 rows"):
        presample.count_ids([[torch.tensor([0, 4]), torch.tensor([1, 3])]], [5, 3])
    with pytest.raises(ValueError, match="table 0: id -1"):
        presample.count_ids([[torch.tensor([-1]), torch.tensor([0])]], [5, 3])
    with pytest.raises(ValueError, match="ids of 1 tables, expected 2"):
        presample.count_ids([[torch.tensor([0])]], [5, 3])
