"""The owner's update: the optimizer applied to the rows a rank owns, wherever it holds them.

A row's owner is the only rank that updates it, with the summed gradient of all ranks. A cached
row is updated in its static slot. An uncached row is either updated in a dynamic slot (its host
copy is then written by a flush, the paper's path) or, where the owner's device memory is host
memory (a CPU device), in place in host memory. A row already in a dynamic slot (its flush still
pending) is updated there. Host writes of the updated rows are queued by the caller.

Row-wise Adagrad on a CPU device, where store and host are both host memory, runs as two compiled
passes that read and write each row where it lives, a fresh dynamic slot filled from host on the
way (:func:`~torchrec_frugal.engine.optimizers.rowwise_adagrad_begin`); the rest as whole-array
torch calls on each part.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from ..config import OptimizerSpec
from .host_tables import HostTables
from .optimizers import rowwise_adagrad_begin, rowwise_adagrad_finish, update_rows
from .owner_cache import OwnerStore
from .streams import to_device


class OwnerUpdate:
    """Applies one rank's optimizer steps to the rows it owns (store slots, or host in place)."""

    def __init__(self, optimizer: OptimizerSpec, store: OwnerStore, host: HostTables, update_in_host: bool) -> None:
        self.optimizer = optimizer
        self.store = store
        self.host = host
        self.device = host.device
        self.update_in_host = update_in_host  # uncached rows updated in host memory (a CPU device's choice)

    def apply(self, iteration: int, rows: np.ndarray, grads: torch.Tensor) -> np.ndarray:
        """Update the unique owned ``rows`` with their summed ``grads`` (CPU) at the optimizer's
        ``iteration`` (see :func:`~torchrec_frugal.engine.optimizers.update_rows`); returns
        the rows updated in the store, whose host writes are now pending (the others were
        updated in host memory), in the order of ``rows``.

        The caller holds the flusher's lock: slots are allocated here and read by the flushers.
        """
        if self.optimizer.kind == "rowwise_adagrad" and self.host.in_place:
            return self._rowwise_adagrad_on_cpu(rows, grads)
        store = self.store
        slots = store.slot_of[rows]
        if self.update_in_host:
            rows, slots, grads = self._update_in_host(iteration, rows, slots, grads)
            if rows.shape[0] == 0:  # every row was updated in host memory (no cache: every step)
                return rows
        fresh = slots < 0
        if fresh.any():
            new_rows = rows[fresh]
            new_slots = store.alloc(new_rows)
            nr = torch.from_numpy(new_rows)
            nr_dev, ns = to_device([nr, torch.from_numpy(new_slots)], self.device)
            store.weights.index_copy_(0, ns, self.host.read("weights", nr, nr_dev))
            store.state.index_copy_(0, ns, self.host.read("state", nr, nr_dev))
            slots[fresh] = new_slots
        sl = torch.from_numpy(slots).to(self.device)
        update_rows(self.optimizer, store.weights, store.state, sl, grads.to(self.device), iteration)
        return rows

    def _rowwise_adagrad_on_cpu(self, rows: np.ndarray, grads: torch.Tensor) -> np.ndarray:
        """:meth:`apply` of row-wise Adagrad where the store is in host memory (a CPU device):
        every row updated where it is, an uncached row in host in place or (not in place) in a
        dynamic slot allocated here and filled from host by the update itself."""
        store, tables = self.store, self.host.tables
        slots, m, uncached = rowwise_adagrad_begin(rows, grads, store.slot_of, store.state, tables["state"])
        new_slots = uncached[:0] if self.update_in_host else store.alloc(uncached)  # in host: none
        return rowwise_adagrad_finish(self.optimizer, rows, slots, new_slots, m, grads, store.weights, store.state,
                                      tables["weights"], tables["state"])  # fmt: skip

    def _update_in_host(
        self, iteration: int, rows: np.ndarray, slots: np.ndarray, grads: torch.Tensor
    ) -> Tuple[np.ndarray, np.ndarray, torch.Tensor]:
        """Update clean uncached rows straight in host memory; return the rows the store holds.

        Used where the owner's device memory is host memory (a CPU device): staging such a row
        in a dynamic slot and flushing it later would copy it twice for nothing. It is safe:
        nobody reads these rows from host before this rank publishes UPDATED for the step, and
        no flusher touches a row that has no pending write.
        """
        held = slots >= 0
        if held.all():
            return rows, slots, grads
        here = torch.from_numpy(rows[~held])
        host_grads = grads.index_select(0, torch.from_numpy(np.flatnonzero(~held)))
        update_rows(self.optimizer, self.host.tables["weights"], self.host.tables["state"], here, host_grads, iteration)
        keep = np.flatnonzero(held)
        return rows[keep], slots[keep], grads.index_select(0, torch.from_numpy(keep))

    def reload(self) -> None:
        """Re-read every row the store holds from host (at set-up, and after a checkpoint load)."""
        held = np.flatnonzero(self.store.slot_of >= 0)
        idx = torch.from_numpy(held)
        sl = torch.from_numpy(self.store.slot_of[held]).to(self.device)
        tables = self.host.tables
        self.store.weights.index_copy_(0, sl, tables["weights"].index_select(0, idx).to(self.device))
        self.store.state.index_copy_(0, sl, tables["state"].index_select(0, idx).to(self.device))
