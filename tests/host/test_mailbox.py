"""Mailbox records: sized by a step, grown by their writer, re-mapped by readers (one process)."""
from __future__ import annotations

import os

import pytest
import torch

from torchrec_frugal.host.control_record import GRAD_ROWS, RING_ROWS, Control, control_field
from torchrec_frugal.errors import FrugalError
from torchrec_frugal.host.mailbox import Record, grads_layout, keep_ring, ring_layout
from torchrec_frugal.host.shm import PREFIX, Layout, SharedSegment, new_run_id

RING, WORLD, DIM = 4, 2, 3


def _pair(tmp_path, kind: str, first: int, most: int):
    """Rank 0's and rank 1's view of one kind of record, sharing one control block."""
    block = SharedSegment.create(f"{PREFIX}{new_run_id()}_control", Layout([control_field(WORLD)]), str(tmp_path))
    block.unlink()
    prefix = f"{PREFIX}{new_run_id()}_"
    if kind == "ring":
        args = (lambda k: ring_layout(RING, WORLD, k), keep_ring, RING_ROWS)
    else:
        args = (lambda k: grads_layout(WORLD, k, DIM), None, GRAD_ROWS)
    recs = [Record(kind, *args, str(tmp_path), first, most, r, WORLD) for r in range(WORLD)]
    created = [rec.create_own(Control(block["control"], r, 5.0), prefix) for r, rec in enumerate(recs)]
    for rec in recs:
        rec.attach_peers()
    for rec in recs:
        rec.unlink_own()
    assert os.listdir(tmp_path) == [] and all(c.name.endswith(f"n{min(first, most)}") for c in created)
    return recs


def test_ring_grows_keeping_the_announced_slots(tmp_path) -> None:
    r0, r1 = _pair(tmp_path, "ring", 4, 1000)
    box = r1.own(3)
    box["la_rows"][1, :3] = torch.tensor([5, 6, 7])
    box["la_step"][1] = 9
    assert r0.segment(1)["la_rows"][1, :3].tolist() == [5, 6, 7]
    grown = r1.own(5)  # a step of 5 rows: doubles to 8
    assert r1.rows == 8 and grown["la_rows"].shape == (RING, 8)
    assert grown["la_rows"][1, :3].tolist() == [5, 6, 7] and int(grown["la_step"][1]) == 9  # kept
    grown["la_rows"][2, :5] = torch.arange(5)
    seen = r0.segment(1)  # the reader sees the size counter move and maps the new record
    assert seen["la_rows"].shape == (RING, 8) and seen["la_rows"][2, :5].tolist() == list(range(5))
    assert seen["la_rows"][1, :3].tolist() == [5, 6, 7]
    assert os.listdir(tmp_path) == [f"{r1.segment_name(1, 8)}"]  # only the grown record is named
    r1.own(30)  # grows past doubling when a step needs it, and drops the older name
    assert r1.rows == 30 and os.listdir(tmp_path) == [r1.segment_name(1, 30)]
    r1.unlink_own()
    assert os.listdir(tmp_path) == []


def test_reader_follows_two_growths_in_a_row(tmp_path) -> None:
    r0, r1 = _pair(tmp_path, "grads", 2, 64)
    r1.own(3)
    r1.own(9)  # the reader never mapped the record of 4 rows, whose name is gone
    r1.segment(1)["g_rows"][:9] = torch.arange(9)
    assert r0.segment(1)["g_rows"][:9].tolist() == list(range(9))
    r1.unlink_own()


def test_growth_stops_at_the_tables_rows(tmp_path) -> None:
    r0, r1 = _pair(tmp_path, "grads", 16, 20)
    assert r1.own(17)["g_grads"].shape == (20, DIM)  # doubling capped at the tables' rows
    with pytest.raises(FrugalError, match="a step of 21 grads rows exceeds the tables' 20 rows"):
        r1.own(21)
    r1.unlink_own()


def test_a_missing_record_is_an_error_naming_the_rank(tmp_path) -> None:
    r0, r1 = _pair(tmp_path, "grads", 2, 64)
    r1.own(3)
    r1.unlink_own()  # gone before the reader mapped it, and the counter still names it
    with pytest.raises(FrugalError, match="rank 1's grads mailbox of 4 rows is gone"):
        r0.segment(1)
