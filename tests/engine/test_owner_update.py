"""The owner's update on one process: the same values in a cache slot, a dynamic slot or host in place."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchrec_frugal.config import OptimizerSpec
from torchrec_frugal.engine.host_tables import HostTables
from torchrec_frugal.engine.optimizers import apply_update, state_width
from torchrec_frugal.engine.owner_cache import OwnerStore
from torchrec_frugal.engine.owner_update import OwnerUpdate

ROWS, DIM = 40, 3
CPU = torch.device("cpu")


def _setup(kind: str, in_place: bool):
    spec = OptimizerSpec(kind=kind, lr=0.1)
    width = state_width(spec, DIM)
    gen = torch.Generator().manual_seed(1)
    weights, state = torch.randn(ROWS, DIM, generator=gen), torch.rand(ROWS, width, generator=gen)
    host = HostTables({"weights": weights, "state": state}, torch.empty(0, dtype=torch.uint8), CPU, "auto", None)
    store = OwnerStore(ROWS, np.array([0, 5, 9]), DIM, width, CPU)
    upd = OwnerUpdate(spec, store, host, in_place)
    upd.reload()
    return spec, upd, weights, state


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad", "adam"])
@pytest.mark.parametrize("in_place", [False, True])
def test_every_copy_gets_the_reference_update(kind: str, in_place: bool) -> None:
    spec, upd, host_w, host_s = _setup(kind, in_place)
    ref_w, ref_s = host_w.clone(), host_s.clone()
    store = upd.store
    for step, rows in enumerate([np.array([0, 5, 11, 20]), np.array([5, 11, 30])]):
        grads = torch.full((rows.shape[0], DIM), 0.5 + step)
        held = upd.apply(step, rows, grads)
        r = torch.from_numpy(rows)
        w, s = ref_w[r], ref_s[r]
        apply_update(spec, w, s, grads, step)
        ref_w[r], ref_s[r] = w, s
        # In place: uncached rows are written to host and not held; else they take dynamic slots.
        expect_held = rows[np.isin(rows, [0, 5, 9])] if in_place else rows
        assert held.tolist() == expect_held.tolist()
        sl = torch.from_numpy(store.slot_of[held])
        torch.testing.assert_close(store.weights[sl], ref_w[torch.from_numpy(held)])
        torch.testing.assert_close(store.state[sl], ref_s[torch.from_numpy(held)])
        in_host = torch.from_numpy(np.setdiff1d(rows, held))
        torch.testing.assert_close(host_w[in_host], ref_w[in_host])
        torch.testing.assert_close(host_s[in_host], ref_s[in_host])
    assert store.dynamic_in_use == (0 if in_place else 3)


def test_reload_reads_every_held_row_from_host() -> None:
    _, upd, host_w, host_s = _setup("rowwise_adagrad", in_place=False)
    upd.apply(0, np.array([5, 17]), torch.ones(2, DIM))  # 17 takes a dynamic slot
    host_w.add_(100.0)
    upd.reload()
    held = torch.tensor([0, 5, 9, 17])
    sl = torch.from_numpy(upd.store.slot_of[held.numpy()])
    assert torch.equal(upd.store.weights[sl], host_w[held]) and torch.equal(upd.store.state[sl], host_s[held])


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad", "adam"])
def test_held_rows_first_update_as_sorted_rows_do(kind: str) -> None:
    """In place, rows laid out as :attr:`OwnerUpdate.held_first` asks (the held rows first, as the
    gradient exchange lays its sum out) are updated bit for bit as the same rows sorted."""
    results = []
    for laid_out in (False, True):
        _, upd, host_w, host_s = _setup(kind, in_place=True)
        assert upd.held_first is not None
        for step, rows in enumerate([np.array([0, 3, 5, 11, 20]), np.array([5, 9, 11, 30, 31])]):
            grads = torch.linspace(-1, 1, rows.shape[0] * DIM).reshape(-1, DIM) * (step + 1)
            if laid_out:
                front = upd.held_first(rows)
                order = np.concatenate([np.flatnonzero(front), np.flatnonzero(~front)])
                rows, grads = rows[order], grads[torch.from_numpy(order)]
            held = upd.apply(step, rows, grads)
            assert held.tolist() == sorted(set(rows.tolist()) & {0, 5, 9})
        results.append((host_w.clone(), host_s.clone(), upd.store.weights.clone(), upd.store.state.clone()))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    assert _setup("sgd", in_place=False)[1].held_first is None
