"""Fused rows and host rows on one process: input checks, reads, views and in-place loads."""
from __future__ import annotations

import pytest
import torch

from torchrec_frugal.config import TableSpec
from torchrec_frugal.errors import FrugalInputError
from torchrec_frugal.fused_rows import FusedRows
from torchrec_frugal.host.rows import HostRows, aliases
from torchrec_frugal.host.shm import PREFIX, Field, Layout, SharedSegment, new_run_id

FUSED = FusedRows([TableSpec("small", 4, 2), TableSpec("large", 6, 2)])


def test_fused_rows_offsets_and_checks() -> None:
    assert FUSED.num_rows == 10 and FUSED.offsets.tolist() == [0, 4, 10]
    assert FUSED.of_ids(1, torch.tensor([0, 5], dtype=torch.int32)).tolist() == [4, 9]
    with pytest.raises(FrugalInputError, match="table 'large': id 6 is out of range"):
        FUSED.of_ids(1, torch.tensor([6]))
    assert FUSED.check(torch.tensor([[9, 0]]), "x").tolist() == [9, 0]
    with pytest.raises(FrugalInputError, match=r"x: row 10 .*beyond the last table 'large'"):
        FUSED.check(torch.tensor([10]), "x")
    with pytest.raises(FrugalInputError, match=r"x: row -1 .*before the first table 'small'"):
        FUSED.check(torch.tensor([[3, 2], [-1, 9]]).t(), "x")  # strided: read as it lies
    with pytest.raises(FrugalInputError, match="x: rows must be int64"):
        FUSED.check(torch.tensor([1], dtype=torch.int32), "x")


def test_batched_id_check_of_many_tables() -> None:
    """One check for the ids of several tables: the rows of_ids gives table by table, or None on
    an id out of its own table (though inside the fused tables) or a wrong dtype."""
    tables, counts = [0, 1], [2, 3]
    ids = torch.tensor([3, 0, 5, 0, 2], dtype=torch.int32)
    assert FUSED.of_table_runs(tables, counts, ids).tolist() == [3, 0, 9, 4, 6]
    assert FUSED.of_table_runs([1, 0, 1], [1, 2, 2], torch.tensor([3, 0, 1, 0, 5])).tolist() == [7, 0, 1, 4, 9]
    assert FUSED.of_table_runs(tables, [0, 0], ids[:0]).tolist() == []
    assert FUSED.of_table_runs(tables, counts, torch.tensor([4, 0, 5, 0, 2])) is None  # id 4 of 'small' is row 4: 'large'
    assert FUSED.of_table_runs(tables, counts, torch.tensor([0, 0, 5, -1, 2])) is None
    assert FUSED.of_table_runs(tables, counts, torch.tensor([0, 0, 5, 6, 2])) is None  # 'large' has rows 0..5
    assert FUSED.of_table_runs(tables, counts, ids.to(torch.float32)) is None


def test_host_rows_read_view_and_load_in_place(tmp_path) -> None:
    layout = Layout([Field("weights", torch.float32, (10, 2)), Field("state", torch.float32, (10, 1))])
    seg = SharedSegment.create(f"{PREFIX}{new_run_id()}_host", layout, str(tmp_path))
    seg.unlink()
    host = HostRows(seg, FUSED)
    host.weights.copy_(torch.arange(20.0).reshape(10, 2))
    w, s = host.read(torch.tensor([3, 1]))
    assert w.tolist() == [[6, 7], [2, 3]] and s.shape == (2, 1)
    bw, bs = host.block(4, 7)
    assert bw.data_ptr() == host.weights[4].data_ptr() and bs.shape == (3, 1)
    with pytest.raises(FrugalInputError, match=r"host_block: rows \[4, 11\)"):
        host.block(4, 11)
    with pytest.raises(FrugalInputError, match="write_rows: weights of shape"):
        host.check([(torch.tensor([1]), torch.zeros(1, 3), None)])
    parts = host.check([(torch.tensor([2, 3]), torch.full((2, 2), -1.0), None), (torch.tensor([4, 5, 6]), bw, torch.ones(3, 1))])
    assert aliases(host.weights, parts[1][0], bw) and not aliases(host.weights, parts[0][0], parts[0][1])
    host.write(parts)
    assert host.weights[2:4].eq(-1.0).all() and host.weights[4].tolist() == [8, 9]  # a view onto itself: kept
    assert host.state[4:7].eq(1.0).all() and host.state[2:4].eq(0.0).all()  # None keeps the state
