"""Where each row of a lookup comes from: the rank's device store or the shared host tables.

:func:`plan_lookup` splits a lookup into rows this rank holds (read from its device store) and
rows read from host; it runs on CPU and is the same for every host path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from ..int_sort import unique_inverse_np


@dataclass
class LookupPlan:
    """Where each row of a lookup comes from, packed into one int64 tensor (one transfer).

    ``packed`` is ``[hit_pos | hit_slots | miss_pos | host_rows | expand]``: output positions and
    store slots of the rows this rank holds, output positions of the host reads, the fused rows
    read from host, and (when those were deduplicated) each host read's index into them.
    """

    packed: torch.Tensor
    n_hit: int
    n_miss: int
    n_host: int
    n_expand: int
    n_static_hits: int

    def parts(self, t: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, ...]:
        """(hit_pos, hit_slots, miss_pos, host_rows, expand) as views of ``t`` (``packed`` moved)."""
        t = self.packed if t is None else t
        h, m, u = self.n_hit, self.n_miss, self.n_host
        return t[:h], t[h : 2 * h], t[2 * h : 2 * h + m], t[2 * h + m : 2 * h + m + u], t[2 * h + m + u :]


def plan_lookup(
    slot_of: np.ndarray, num_static: int, rows: np.ndarray, sorted_reads: bool = False, static_only: bool = False
) -> LookupPlan:
    """Split ``rows`` into store reads (slot >= 0) and host reads, keeping output positions.

    With ``static_only`` only the static cache (slots below ``num_static``, fixed after set-up)
    counts as held: such a plan stays valid however long before its step it is made, and may
    be made on another thread while the owner moves rows in and out of dynamic slots (the gate
    makes their host copies current before the step reads them).

    With ``sorted_reads`` the host reads are deduplicated and sorted by row (unless they already
    are), to be expanded to their positions on the device: scattered reads of small rows use a
    fraction of a PCIe link's bandwidth, reads in row order most of it.
    """
    slots = slot_of[rows]
    hit = (slots >= 0) & (slots < num_static) if static_only else slots >= 0
    hit_pos = np.flatnonzero(hit)
    miss_pos = np.flatnonzero(~hit)
    hit_slots = slots[hit_pos]
    host_rows = rows[miss_pos]
    expand = np.zeros(0, dtype=np.int64)
    if sorted_reads and host_rows.size > 1 and not bool(np.all(host_rows[1:] > host_rows[:-1])):
        host_rows, expand = unique_inverse_np(host_rows)
    packed = np.concatenate([hit_pos, hit_slots, miss_pos, host_rows, expand])
    return LookupPlan(
        torch.from_numpy(packed),
        n_hit=int(hit_pos.shape[0]),
        n_miss=int(miss_pos.shape[0]),
        n_host=int(host_rows.shape[0]),
        n_expand=int(expand.shape[0]),
        n_static_hits=int(np.count_nonzero(hit_slots < num_static)),
    )
