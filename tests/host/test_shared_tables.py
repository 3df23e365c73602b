"""Set-up on one process: the local group's all-or-none steps and the run's shared memory."""
from __future__ import annotations

import os

import pytest
import torch

from torchrec_frugal.config import FrugalConfig, TableSpec
from torchrec_frugal.host.control_record import FLUSHED, PID, PUBLISHED, RUNNING, STAGED, STATUS
from torchrec_frugal.errors import FrugalInputError
from torchrec_frugal.host.local_group import LocalGroup
from torchrec_frugal.priorities import INF
from torchrec_frugal.host.shared_tables import init_host_tables, open_shared_tables
from torchrec_frugal.host.shm import PREFIX, Field, Layout, SharedSegment, new_run_id

TABLES = [TableSpec("a", 5, 3), TableSpec("b", 7, 3)]


def test_a_group_without_a_process_group_is_rank_0_of_1(tmp_path) -> None:
    g = LocalGroup()
    assert (g.rank, g.world_size) == (0, 1)
    assert g.gather("x") == ["x"] and g.all_or_none(lambda: 7, [], "adding") == [7]
    g.check_one_machine()
    assert g.agree_on_shm_dir(str(tmp_path)) == str(tmp_path)
    counts = torch.arange(4.0)
    assert g.all_reduce_sum(counts, torch.device("cpu")) is counts


def test_a_failed_step_unlinks_what_it_created_and_raises_its_own_error(tmp_path) -> None:
    g = LocalGroup()
    seg = SharedSegment.create(f"{PREFIX}{new_run_id()}_x", Layout([Field("v", torch.int64, (1,))]), str(tmp_path))
    assert os.listdir(tmp_path) == [seg.name]

    def fail() -> None:
        raise FrugalInputError("bad")

    with pytest.raises(FrugalInputError, match="bad"):
        g.all_or_none(fail, [seg], "failing")
    assert os.listdir(tmp_path) == []


def test_shared_tables_are_initialised_and_leave_no_names(tmp_path) -> None:
    cfg = FrugalConfig(lookahead=2, mailbox_rows=4)
    init = [torch.full((5, 3), 1.0), torch.full((7, 3), 2.0)]
    shared = open_shared_tables(LocalGroup(), str(tmp_path), TABLES, 1, cfg, init, seed=0)
    assert os.listdir(tmp_path) == []  # every rank mapped every segment: the names went
    w, s = shared.segment["weights"], shared.segment["state"]
    assert w.shape == (12, 3) and s.shape == (12, 1)
    assert w[:5].eq(1.0).all() and w[5:].eq(2.0).all() and s.eq(0.0).all()
    c = shared.control
    assert int(c.get(FLUSHED)[0]) == INF and int(c.get(STAGED)[0]) == -1 and int(c.get(PUBLISHED)[0]) == -1
    assert int(c.get(STATUS)[0]) == RUNNING and int(c.get(PID)[0]) == os.getpid()
    assert shared.ring_record.rows == 4 and shared.grad_record.rows == 4
    assert shared.run_id in shared.segment.name


def test_initial_weights_by_function_or_default_and_shape_checked() -> None:
    w, s = torch.empty(12, 3), torch.ones(12, 1)
    init_host_tables(w, s, TABLES, lambda t, view: view.fill_(10.0 + t), seed=0)
    assert w[:5].eq(10.0).all() and w[5:].eq(11.0).all() and s.eq(0.0).all()
    init_host_tables(w, s, TABLES, None, seed=0)
    assert w[:5].abs().max() <= 5**-0.5 and w[5:].abs().max() <= 7**-0.5
    with pytest.raises(FrugalInputError, match=r"table 'b': initial weights have shape \(7, 2\)"):
        init_host_tables(w, s, TABLES, [torch.zeros(5, 3), torch.zeros(7, 2)], seed=0)


def test_large_tables_show_their_initialisation(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Filling host tables of more than PROGRESS_BYTES shows a progress bar; smaller ones stay quiet."""
    from torchrec_frugal.host import shared_tables

    specs = [TableSpec("a", 30, 4), TableSpec("b", 20, 4)]
    weights, state = torch.empty(50, 4), torch.empty(50, 4)
    shared_tables.init_host_tables(weights, state, specs, None, 0)
    assert "initialising host tables" not in capsys.readouterr().err
    monkeypatch.setattr(shared_tables, "PROGRESS_BYTES", 50 * 4 * 4)
    shared_tables.init_host_tables(weights, state, specs, None, 0)
    assert "initialising host tables" in capsys.readouterr().err
    assert weights.abs().max() <= (1 / 20) ** 0.5 and float(state.abs().max()) == 0.0
