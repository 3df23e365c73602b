"""A step's reads: the current values of its rows, from the owner store or from host.

One pass over the rows: the rows this rank holds are gathered from its device store and all
others from host memory (on CUDA through the mapped host tables), both straight into the output.
On a CPU device the rows' ids come unplanned and one compiled loop does it all
(:mod:`~torchrec_frugal.kernels.row_gather`). A plan made ahead (:meth:`.FrugalEngine.plan_step`) saves the split and the copy of its indices:
the training thread then only launches the gathers.
"""
from __future__ import annotations

import time
from typing import Optional, Union

import torch

from .host_tables import HostTables
from ..kernels.row_gather import GatherScratch
from .lookup_plan import plan_lookup
from ..metrics import StepRecorder
from .owner_cache import OwnerStore
from .step_plan import StepPlan
from .streams import REACHED, CopyStream, Marker, Streams


class StepReads:
    """The reads of one rank's engine; ``reads_done`` is reached once the newest read is done."""

    def __init__(
        self, store: OwnerStore, host: HostTables, streams: Streams, copies: CopyStream, recorder: StepRecorder,
        dim: int, device: torch.device,
    ) -> None:  # fmt: skip
        self._store = store
        self._host = host
        self._streams = streams
        self._copies = copies
        self._recorder = recorder
        self._dim = dim
        self._device = device
        self.reads_done: Marker = REACHED
        self._gather = GatherScratch(store.slot_of.shape[0], dim) if host.in_place else None

    @property
    def checks_range(self) -> bool:
        """Whether :meth:`read` of unplanned rows checks their range itself (the CPU device's
        one pass): it then returns None where a row is out of range, having read nothing."""
        return self._gather is not None

    def read(self, rows: Union[torch.Tensor, StepPlan]) -> Optional[torch.Tensor]:
        """Current values of ``rows`` [n] -> [n, dim] (a plan's: checked by its engine; others
        checked by the caller unless :attr:`checks_range`)."""
        t0 = time.perf_counter()
        if isinstance(rows, StepPlan):
            plan, n = rows.lookup, rows.num_rows
            self._copies.use([rows.packed], rows.ready)
            moved = rows.packed
        elif self._gather is not None:
            return self._read_on_cpu(rows, t0)
        else:
            rows = rows.reshape(-1).to("cpu")  # row ids are host-side bookkeeping (begin_step takes them so too)
            plan, n = plan_lookup(self._store.slot_of, self._store.num_static, rows.numpy(), self._host.sorted_reads), int(rows.shape[0])
            moved = plan.packed.to(self._device, non_blocking=True)
        self._recorder.lookups += n
        self._recorder.cache_hits += plan.n_static_hits
        hit_pos, hit_slots, miss_pos, host_rows, expand = parts = plan.parts(moved)
        if plan.n_miss == 0:
            out = self._store.weights.index_select(0, hit_slots)
        else:
            from_host = self._host.read("weights", (parts if moved is plan.packed else plan.parts())[3], host_rows)
            if plan.n_expand:  # each distinct host row was read once: place it where it is used
                from_host = from_host.index_select(0, expand)
            if plan.n_hit == 0:
                out = from_host
            else:
                out = torch.empty(n, self._dim, dtype=torch.float32, device=self._device)
                out.index_copy_(0, hit_pos, self._store.weights.index_select(0, hit_slots))
                out.index_copy_(0, miss_pos, from_host)
        self.reads_done = self._streams.mark()
        self._recorder.add("lookup", time.perf_counter() - t0)
        return out

    def _read_on_cpu(self, rows: torch.Tensor, t0: float) -> Optional[torch.Tensor]:
        """The read on a CPU device: store and host are both host memory, one compiled pass;
        None where a row is out of range."""
        assert self._gather is not None
        store = self._store
        out = torch.empty(rows.shape[0], self._dim, dtype=torch.float32)
        hits = self._gather.gather(
            rows.numpy(), store.slot_of, store.num_static, store.weights.numpy(), self._host.tables["weights"].numpy(),
            out.numpy(),
        )  # fmt: skip
        if hits < 0:
            return None
        self._recorder.lookups += int(rows.shape[0])
        self._recorder.cache_hits += hits
        self.reads_done = REACHED
        self._recorder.add("lookup", time.perf_counter() - t0)
        return out
