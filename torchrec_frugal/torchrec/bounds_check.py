"""``bounds_check_mode`` as FBGEMM 1.8 defines it: what a frugal table does with an id out of range.

FBGEMM's TBE checks a batch's indices before its kernel runs (``bounds_check_indices``,
``embedding_bounds_check_host_cpu.cpp``), in place, id by id, against its table's rows; offsets
that are consistent stay as they are (a KJT's always are). Checked on FBGEMM 1.8's CPU build:

- ``WARNING`` (TBE's default, and stock TorchRec's when fused_params omit the key) and ``IGNORE``:
  an id ``>= rows`` or negative is set to 0, so the bag reads row 0 of its table (with its per-id
  weight, and MEAN still divides by the bag's full length) and row 0 gets its gradient. WARNING
  logs the first such id of each call ("Out of bounds access ... Setting idx to zero."), IGNORE
  nothing. Except ``-1``, FBGEMM's pruned-row marker: the check leaves it, and the CPU kernel then
  raises ("Index ... is out of bounds: -1"): stock trains no batch holding it.
- ``FATAL``: the check raises.
- ``NONE``: no check; the CPU kernel raises on any id out of range (CUDA's reads out of bounds).
- ``V2_*``: version 2 of the same check, the same per-id rule.
- The environment variable ``FBGEMM_TBE_BOUNDS_CHECK_MODE`` (an int) overrides fused_params.

Frugal does the same, by mode: WARNING and IGNORE read and train such an id as row 0 (WARNING logs
it, rate-limited: :class:`OutOfRangeLog`); ``-1`` under them, and any such id under FATAL and NONE,
refuses the batch (``FrugalInputError`` naming feature, table and id; dropped on every rank inside
FrugalTrainPipeline). NONE is not refused at shard time: stock's CPU kernel raises on the batch,
and raising is the one outcome of CUDA's unchecked read that is safe to reproduce.

Where: every check of a frugal table's ids (the lookup's fused rows: planner thread, unplanned
forward, lookahead, eval; frugal_row_wise's before the input dist, so a bad id becomes row 0 of the
table, as table_wise reads it). A batch whose ids are all in range costs the one min/max check it
always had; the repair runs only on a batch that failed it, as batched tensor operations.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..errors import FrugalInputError

logger: logging.Logger = logging.getLogger(__name__)

ROW_ZERO = ("WARNING", "IGNORE")
"""Modes under which an id out of range is read and trained as row 0 of its table."""

MODES = ROW_ZERO + ("FATAL", "NONE")
"""The modes, with V2_* folded onto the first version's (FBGEMM's TBE folds them so)."""

ENV = "FBGEMM_TBE_BOUNDS_CHECK_MODE"
"""FBGEMM's TBE takes its mode from this variable (BoundsCheckMode's int) when it is set."""

PRUNED = -1
"""FBGEMM's pruned-row marker: its bounds check leaves it, its kernel then raises."""

FIRST_WARNINGS = 5
"""Under WARNING, the first batches with bad ids logged per table; after them, a count at each power of two."""


def bounds_check_mode(value: Any) -> str:
    """The mode (one of :data:`MODES`) of a ``bounds_check_mode`` fused param (a BoundsCheckMode or
    its name; None: FBGEMM's default WARNING), overridden by :data:`ENV` as FBGEMM's TBE does.
    Raises ValueError for anything else."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    env = os.environ.get(ENV)
    if env is not None:
        try:
            value = BoundsCheckMode(int(env))
        except ValueError:
            raise ValueError(f"{ENV}={env!r} is not a BoundsCheckMode value") from None
    if value is None:
        return "WARNING"
    name = getattr(value, "name", value)
    if isinstance(value, BoundsCheckMode) or (isinstance(name, str) and name in BoundsCheckMode.__members__):
        name = name[3:] if name.startswith("V2_") else name
        if name in MODES:
            return name
    raise ValueError(f"not a BoundsCheckMode (FBGEMM's modes: {list(BoundsCheckMode.__members__)})")


@dataclass
class RowZero:
    """Ids of one feature read as row 0 (a batch's repair, logged once the batch is accepted)."""

    table: str
    feature: str
    rows: int
    mode: str
    first: int  # the first bad id, in the batch's order
    count: int


class OutOfRangeLog:
    """Per table, the ids read as row 0 under WARNING: the first :data:`FIRST_WARNINGS` batches
    logged (table, feature, id, rows), then the running count at each power of two, so that messy
    data cannot flood the log; any thread (planner, training)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Dict[str, int] = {}  # table -> ids read as row 0 so far (WARNING and IGNORE)
        self._batches: Dict[str, int] = {}  # table -> batches logged

    def report(self, repairs: List[RowZero]) -> None:
        for r in repairs:
            with self._lock:
                before = self.counts.get(r.table, 0)
                after = self.counts[r.table] = before + r.count
                if r.mode != "WARNING":
                    continue
                logged = self._batches.get(r.table, 0)
                first = logged < FIRST_WARNINGS
                if first:
                    self._batches[r.table] = logged + 1
                crossed = after.bit_length() > before.bit_length()  # a power of two reached
            if first:
                more = "" if r.count == 1 else f" (and {r.count - 1} more of this feature in the batch)"
                last = ""
                if logged + 1 == FIRST_WARNINGS:
                    last = " (the last one logged for this table; then a count at each power of two)"
                logger.warning(
                    "table %r, feature %r: id %d is out of range [0, %d); read and trained as row 0, as FBGEMM's "
                    "bounds_check_mode WARNING sets it%s%s",
                    r.table, r.feature, r.first, r.rows, more, last,
                )  # fmt: skip
            elif crossed:
                logger.warning(
                    "table %r: %d ids out of range read and trained as row 0 so far (bounds_check_mode WARNING; "
                    "latest: id %d of feature %r)",
                    r.table, after, r.first, r.feature,
                )  # fmt: skip


def row_zero(ids: torch.Tensor, rows: int, table: str, feature: str, mode: str) -> Tuple[torch.Tensor, Optional[RowZero]]:
    """``ids`` (int32 or int64, a batch's ids of one feature of ``table``) as CPU int64 with each id out of
    [0, rows) set to 0, as FBGEMM's bounds check sets it under ``mode`` WARNING or IGNORE, and what was
    set (None: nothing). Raises FrugalInputError, naming the table and the id, for FBGEMM's
    :data:`PRUNED` marker (left by the check, refused by its kernel) or under FATAL or NONE."""
    ids = ids.reshape(-1).to("cpu", torch.int64)
    bad = (ids < 0) | (ids >= rows)
    count = int(bad.sum())
    if not count:
        return ids, None
    first = int(ids[bad][0])
    if mode not in ROW_ZERO:
        raise FrugalInputError(f"table {table!r}: id {first} is out of range [0, {rows}) (bounds_check_mode {mode})")
    if bool((ids == PRUNED).any()):
        raise FrugalInputError(
            f"table {table!r}: id {PRUNED} is out of range [0, {rows}): FBGEMM's bounds check leaves {PRUNED} (its "
            f"pruned-row marker) under bounds_check_mode {mode} and its kernel then fails, so stock trains no such batch"
        )
    return torch.where(bad, torch.zeros((), dtype=torch.int64), ids), RowZero(table, feature, rows, mode, first, count)
