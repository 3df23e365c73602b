"""The gradient exchange on one process: hand-made records, and two ranks' records in one process."""
from __future__ import annotations

import numpy as np
import pytest
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


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def test_sum_owned_is_index_add_in_rank_order_bit_for_bit() -> None:
    """The merged sum is zero plus each rank's gradient in rank order, as ``index_add_`` of the
    ranks' gradients in turn into zeros (negative zeros, tiny and huge values included)."""
    rng = np.random.default_rng(5)
    for trial in range(20):
        world, owner, dim = int(rng.integers(1, 5)), 0, int(rng.choice([1, 3, 32]))
        boxes, runs = [], []
        for _ in range(world):
            rows = np.sort(rng.choice(200, int(rng.integers(0, 60)), replace=False))
            g = (rng.standard_normal((rows.shape[0], dim)) * 10.0 ** rng.uniform(-30, 30, (rows.shape[0], 1)))
            g = torch.from_numpy(g.astype(np.float32))
            g[rng.random(rows.shape[0]) < 0.2] = -0.0
            boxes.append({"g_counts": torch.tensor([rows.shape[0]]), "g_rows": torch.from_numpy(rows), "g_grads": g})
            runs.append((rows, g))
        rows, summed = sum_owned(boxes, owner, dim)
        want_rows = np.unique(np.concatenate([r for r, _ in runs]))
        assert rows.tolist() == want_rows.tolist()
        want = torch.zeros(want_rows.shape[0], dim)
        for r, g in runs:
            want.index_add_(0, torch.from_numpy(np.searchsorted(want_rows, r)), g)
        assert torch.equal(_bits(summed), _bits(want))


def test_sum_owned_refuses_runs_out_of_order() -> None:
    box = {"g_counts": torch.tensor([3]), "g_rows": torch.tensor([1, 5, 4]), "g_grads": torch.ones(3, DIM)}
    with pytest.raises(ValueError, match="strictly increasing"):
        sum_owned([box], 0, DIM)


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
        for r, ex in enumerate(exchanges):
            rows = torch.unique(torch.randint(0, ROWS, (12,), generator=gen))
            if r == 1:  # unique rows in no order: staged sorted all the same
                rows = rows[torch.randperm(rows.shape[0], generator=gen)]
            grads = torch.randn(rows.shape[0], DIM, generator=gen)
            expected.index_add_(0, rows, grads / WORLD)  # each rank's gradient divided, as TorchRec's
            ex.stage(0, rows, grads, REACHED, divide_by=WORLD)
        assert all(ex.wait_staged(0) == 0.0 for ex in exchanges)  # every rank staged: nobody waits
        for r, ex in enumerate(exchanges):
            rows, summed = ex.sum_owned()
            assert (owner[rows] == r).all() and np.all(np.diff(rows) > 0)
            assert torch.equal(summed, expected[torch.from_numpy(rows)])  # rank order, as index_add_
            untouched = np.setdiff1d(np.flatnonzero(owner == r), rows)
            assert expected[torch.from_numpy(untouched)].eq(0).all()
        assert controls[0].take_waited()["exchange"] == 0.0
    finally:
        for rec in records:  # a record grown while staging keeps its name until unlinked
            rec.unlink_own()
    assert not owned_paths()


def test_stage_divides_as_torch_does_bit_for_bit(tmp_path) -> None:
    """The staged gradients are torch's ``grads / divide_by`` in float32, grouped by owner."""
    block = SharedSegment.create(f"{PREFIX}{new_run_id()}_control", Layout([control_field(1)]), str(tmp_path))
    block.unlink()
    record = Record("grads", lambda k: grads_layout(2, k, 7), None, GRAD_ROWS, str(tmp_path), 8, 4000, 0, 1)
    control = Control(block["control"], 0, 5.0)
    record.create_own(control, f"{PREFIX}{new_run_id()}_")
    record.unlink_own()
    owner = (np.arange(4000) % 2).astype(np.int16)
    exchange = GradientExchange(record, control, owner, 7)
    rng = np.random.default_rng(2)
    try:
        for step, divide_by in enumerate([1, 2, 3, 7, 1, 6]):
            rows = torch.from_numpy(np.sort(rng.choice(4000, 1000 + 300 * step, replace=False)))
            grads = torch.from_numpy((rng.standard_normal((rows.shape[0], 7)) * 10.0 ** rng.uniform(-40, 38)).astype(np.float32))
            exchange.stage(step, rows, grads, REACHED, divide_by=divide_by)
            box = record.segment(0)
            by_owner = torch.from_numpy(np.argsort(owner[rows.numpy()], kind="stable"))
            k = rows.shape[0]
            assert box["g_counts"].tolist() == np.bincount(owner[rows.numpy()], minlength=2).tolist()
            assert torch.equal(box["g_rows"][:k], rows[by_owner])
            assert torch.equal(_bits(box["g_grads"][:k]), _bits(grads[by_owner].div_(divide_by)))
    finally:
        record.unlink_own()
    assert not owned_paths()
