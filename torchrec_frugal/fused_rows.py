"""The fused row space of an engine's tables, and the checks of rows and ids that enter it.

An engine's tables share one dimension and are laid end to end: row ``offsets[t] + id`` is id
``id`` of table ``t``. Every row that comes from the caller is checked here before anything
changes, with an error naming the table (a FrugalInputError: the run goes on).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from .config import TableSpec
from .errors import FrugalInputError
from .int_sort import first_repeat


class FusedRows:
    """Row offsets of tables laid end to end, and input checks against them."""

    def __init__(self, tables: Sequence[TableSpec]) -> None:
        self.tables = list(tables)
        sizes = [t.num_embeddings for t in self.tables]
        self.num_rows = int(sum(sizes))
        self.offsets = torch.tensor([0] + list(np.cumsum(sizes)), dtype=torch.int64)
        self.sizes = torch.tensor(sizes, dtype=torch.int64)
        self._offsets = self.offsets.numpy()
        self._sizes = self.sizes.numpy()

    def of_ids(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """Fused rows of ``ids`` of table index ``table``; raises on ids out of range."""
        spec = self.tables[table]
        if ids.dtype not in (torch.int64, torch.int32):
            raise FrugalInputError(f"table {spec.name!r}: ids must be int32 or int64, got {ids.dtype}")
        ids = ids.reshape(-1).to("cpu", torch.int64)
        if ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= spec.num_embeddings:
                bad = lo if lo < 0 else hi
                raise FrugalInputError(f"table {spec.name!r}: id {bad} is out of range [0, {spec.num_embeddings})")
        return ids + self.offsets[table]

    def of_table_runs(self, tables: Sequence[int], counts: Sequence[int], ids: torch.Tensor) -> Optional[torch.Tensor]:
        """Fused rows of ``ids`` (flat, int32 or int64): the first ``counts[0]`` ids of table index
        ``tables[0]``, the next ``counts[1]`` of ``tables[1]``, and so on; one batched check for
        the ids of many tables (in numpy: PyTorch's CPU gathers and comparisons of 100k ids take 3
        to 10 times as long). None if a dtype or an id is wrong; :meth:`of_ids`, per table, then says which."""
        if ids.dtype not in (torch.int64, torch.int32):
            return None
        a = ids.reshape(-1).to("cpu", torch.int64).contiguous().numpy()
        t = np.asarray(tables, dtype=np.int64)
        # a negative id, seen unsigned, is beyond every table
        if a.size and not np.less(a.view(np.uint64), np.repeat(self._sizes[t], counts).view(np.uint64)).all():
            return None
        return torch.from_numpy(a + np.repeat(self._offsets[t], counts))

    def flat(self, rows: torch.Tensor, what: str) -> torch.Tensor:
        """``rows`` as a flat CPU int64 tensor, their range not checked; raises, naming ``what``,
        on a wrong dtype. For a caller that checks the range another way (:meth:`check`)."""
        if rows.dtype != torch.int64:
            raise FrugalInputError(f"{what}: rows must be int64, got {rows.dtype}")
        return rows.reshape(-1).to("cpu")

    def check(self, rows: torch.Tensor, what: str) -> torch.Tensor:
        """``rows`` as a flat CPU int64 tensor; raises, naming ``what``, on a wrong dtype or a row out of range."""
        rows = self.flat(rows, what)
        if rows.numel():
            ids = rows.numpy()  # numpy's min and max of 26k ids take half of torch's two reductions
            self._check_range(int(ids.min()), int(ids.max()), what)
        return rows

    def check_unique(self, rows: torch.Tensor, what: str) -> Tuple[torch.Tensor, Optional[int]]:
        """:meth:`check`, and a row that occurs more than once (None if they are unique). One pass
        where the rows increase (the unique rows a sort gave): their range is then their ends'."""
        rows = self.flat(rows, what)
        ids = rows.numpy()
        if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):
            if ids.size:
                self._check_range(int(ids[0]), int(ids[-1]), what)
            return rows, None
        return self.check(rows, what), first_repeat(ids)

    def _check_range(self, lo: int, hi: int, what: str) -> None:
        """Raises, naming ``what`` and the row, unless every row lies within [``lo``, ``hi``] inside the tables."""
        if lo < 0 or hi >= self.num_rows:
            bad = lo if lo < 0 else hi
            where = f"before the first table {self.tables[0].name!r}" if bad < 0 else f"beyond the last table {self.tables[-1].name!r}"
            raise FrugalInputError(f"{what}: row {bad} is outside the fused tables [0, {self.num_rows}) ({where})")
