"""Pre-sample counting: how often each row of each table is read in a few batches of a rank.

Frugal caches each rank's hot rows, chosen from these counts (the authors count ids in a pre-sample
of the data). One helper serves every source of ids (synthetic workloads, the DLRM example's
KeyedJaggedTensors, the graph example's entities); it takes plain tensors, so it needs no TorchRec.
"""
from __future__ import annotations

from typing import Iterable, List, Sequence

import torch

# Ids buffered before one bincount at the least: few bincounts over the tables' rows, bounded memory.
MIN_FLUSH_IDS = 1 << 20


def count_ids(
    batches: Iterable[Sequence[torch.Tensor]], rows: Sequence[int], min_flush_ids: int = MIN_FLUSH_IDS
) -> List[torch.Tensor]:
    """Per-table id counts over ``batches``: int64 ``[rows[t]]`` for table ``t``.

    Each batch is a sequence of id tensors, one per table, in table order (duplicates count
    again), e.g. a ``[tables, B]`` tensor or a KJT's ``values().split(length_per_key())``.
    Ids of all tables go through one bincount over the tables' concatenated rows, once at least
    ``min_flush_ids`` (and one batch's worth) are buffered. Raises
    ``ValueError`` on an id outside its table or a batch with another number of tables.
    """
    sizes = torch.tensor([int(n) for n in rows], dtype=torch.int64)
    offsets = torch.cumsum(sizes, 0) - sizes
    total = int(sizes.sum())
    counts = torch.zeros(total, dtype=torch.int64)
    pending: List[torch.Tensor] = []
    buffered = 0

    def flush() -> None:
        nonlocal buffered
        if pending:
            counts.add_(torch.bincount(torch.cat(pending), minlength=total))
        pending.clear()
        buffered = 0

    for batch in batches:
        if len(batch) != len(sizes):
            raise ValueError(f"a batch has ids of {len(batch)} tables, expected {len(sizes)}")
        lengths = torch.tensor([t.numel() for t in batch], dtype=torch.int64)
        ids = torch.cat([t.reshape(-1) for t in batch]).to("cpu", torch.int64)
        bad = (ids < 0) | (ids >= sizes.repeat_interleave(lengths))
        if bool(bad.any()):
            t = int(torch.searchsorted(torch.cumsum(lengths, 0), int(bad.nonzero()[0]), right=True))
            raise ValueError(f"table {t}: id {int(ids[bad][0])} is outside its {int(sizes[t])} rows")
        pending.append(ids + offsets.repeat_interleave(lengths))
        buffered += ids.numel()
        if buffered >= max(total, min_flush_ids):
            flush()
    flush()
    return [c.clone() for c in counts.split(sizes.tolist())]  # own storage each, as separate tables
