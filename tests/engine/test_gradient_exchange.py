"""The gradient exchange on one process: hand-made records, and two ranks' records in one process."""
from __future__ import annotations

import numpy as np
import torch

from torchrec_frugal.host.control_record import GRAD_ROWS, STAGED, Control, control_field
from torchrec_frugal.engine.gradient_exchange import GradientExchange, sum_owned
from torchrec_frugal.host.mailbox import Record, grads_layout
from torchrec_frugal.host.shm import PREFIX, Layout, SharedSegment, new_run_id, owned_paths
from torchrec_frugal.engine.streams import REACHED

WORLD, DIM, ROWS = 3, 2, 30


def _box(rows_by_owner, grads_by_owner) -> dict:
    """A staged record: rows and gradients grouped by owner, with the count per owner."""
    return {
        "g_counts": torch.tensor([len(r) for r in rows_by_owner], dtype=torch.int64),
        "g_rows": torch.tensor([x for r in rows_by_owner for x in r], dtype=torch.int64),
        "g_grads": torch.tensor([g for gs in grads_by_owner for g in gs], dtype=torch.float32).reshape(-1, DIM),
    }


def test_sum_owned_takes_the_owner_group_of_every_rank_and_sums_per_row() -> None:
    boxes = [
        _box([[0], [1, 4], []], [[[1, 1]], [[2, 2], [3, 3]], []]),
        _box([[3], [4], [5]], [[[9, 9]], [[10, 20]], [[7, 7]]]),
        _box([[], [1, 7], [2]], [[], [[0.5, 0.5], [1, -1]], [[6, 6]]]),
    ]
    rows, summed = sum_owned(boxes, owner=1, dim=DIM)
    assert rows.tolist() == [1, 4, 7]
    assert summed.tolist() == [[2.5, 2.5], [13, 23], [1, -1]]
    rows, summed = sum_owned(boxes, owner=2, dim=DIM)
    assert rows.tolist() == [2, 5] and summed.tolist() == [[6, 6], [7, 7]]


def test_sum_owned_puts_the_rows_asked_for_first_with_the_same_sums() -> None:
    """``first`` only moves rows: each keeps its sum, each part its order."""
    gen = torch.Generator().manual_seed(3)
    boxes = []
    for rows in ([1, 2, 4, 8, 9], [2, 3, 8, 11]):
        g = torch.randn(len(rows), DIM, generator=gen)
        boxes.append({"g_counts": torch.tensor([0, len(rows), 0]), "g_rows": torch.tensor(rows), "g_grads": g})
    rows, summed = sum_owned(boxes, owner=1, dim=DIM)
    moved, moved_summed = sum_owned(boxes, owner=1, dim=DIM, first=lambda r: r % 4 == 0)
    assert moved.tolist() == [4, 8, 1, 2, 3, 9, 11]
    at = {int(r): i for i, r in enumerate(rows)}
    assert torch.equal(moved_summed, summed[torch.tensor([at[int(r)] for r in moved])])


def test_ranks_stage_and_each_owner_sums_its_rows(tmp_path) -> None:
    """Three ranks' exchanges in one process, sharing one control block; records grow on the way."""
    block = SharedSegment.create(f"{PREFIX}{new_run_id()}_control", Layout([control_field(WORLD)]), str(tmp_path))
    block.unlink()
    prefix = f"{PREFIX}{new_run_id()}_"
    owner = (np.arange(ROWS) % WORLD).astype(np.int16)
    records = [
        Record("grads", lambda k: grads_layout(WORLD, k, DIM), None, GRAD_ROWS, str(tmp_path), 2, ROWS, r, WORLD)
        for r in range(WORLD)
    ]
    controls = [Control(block["control"], r, 5.0) for r in range(WORLD)]
    for rec, c in zip(records, controls):
        rec.create_own(c, prefix)
        c.set(STAGED, -1)
    for rec in records:
        rec.attach_peers()
    for rec in records:
        rec.unlink_own()
    try:
        exchanges = [GradientExchange(rec, c, owner, DIM) for rec, c in zip(records, controls)]
        gen = torch.Generator().manual_seed(0)
        expected = torch.zeros(ROWS, DIM)
        for ex in exchanges:
            rows = torch.unique(torch.randint(0, ROWS, (12,), generator=gen))
            grads = torch.randn(rows.shape[0], DIM, generator=gen)
            expected.index_add_(0, rows, grads / WORLD)  # each rank's gradient divided, as TorchRec's
            ex.stage(0, rows, grads, REACHED, divide_by=WORLD)
        assert all(ex.wait_staged(0) == 0.0 for ex in exchanges)  # every rank staged: nobody waits
        for r, ex in enumerate(exchanges):
            rows, summed = ex.sum_owned()
            assert (owner[rows] == r).all() and np.all(np.diff(rows) > 0)
            torch.testing.assert_close(summed, expected[torch.from_numpy(rows)])
            untouched = np.setdiff1d(np.flatnonzero(owner == r), rows)
            assert expected[torch.from_numpy(untouched)].eq(0).all()
        assert controls[0].take_waited()["exchange"] == 0.0
    finally:
        for rec in records:  # a record grown while staging keeps its name until unlinked
            rec.unlink_own()
    assert not owned_paths()
