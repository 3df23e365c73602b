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


def _setup(kind: str, update_in_host: bool):
    spec = OptimizerSpec(kind=kind, lr=0.1)
    width = state_width(spec, DIM)
    gen = torch.Generator().manual_seed(1)
    weights, state = torch.randn(ROWS, DIM, generator=gen), torch.rand(ROWS, width, generator=gen)
    host = HostTables({"weights": weights, "state": state}, torch.empty(0, dtype=torch.uint8), CPU, "auto", None)
    store = OwnerStore(ROWS, np.array([0, 5, 9]), DIM, width, CPU)
    upd = OwnerUpdate(spec, store, host, update_in_host)
    upd.reload()
    return spec, upd, weights, state


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad", "adam"])
@pytest.mark.parametrize("update_in_host", [False, True])
def test_every_copy_gets_the_reference_update(kind: str, update_in_host: bool) -> None:
    spec, upd, host_w, host_s = _setup(kind, update_in_host)
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
        expect_held = rows[np.isin(rows, [0, 5, 9])] if update_in_host else rows
        assert held.tolist() == expect_held.tolist()
        sl = torch.from_numpy(store.slot_of[held])  # bit for bit, wherever the row is
        assert torch.equal(store.weights[sl], ref_w[torch.from_numpy(held)])
        assert torch.equal(store.state[sl], ref_s[torch.from_numpy(held)])
        in_host = torch.from_numpy(np.setdiff1d(rows, held))
        assert torch.equal(host_w[in_host], ref_w[in_host])
        assert torch.equal(host_s[in_host], ref_s[in_host])
    assert store.dynamic_in_use == (0 if update_in_host else 3)


def test_reload_reads_every_held_row_from_host() -> None:
    _, upd, host_w, host_s = _setup("rowwise_adagrad", update_in_host=False)
    upd.apply(0, np.array([5, 17]), torch.ones(2, DIM))  # 17 takes a dynamic slot
    host_w.add_(100.0)
    upd.reload()
    held = torch.tensor([0, 5, 9, 17])
    sl = torch.from_numpy(upd.store.slot_of[held.numpy()])
    assert torch.equal(upd.store.weights[sl], host_w[held]) and torch.equal(upd.store.state[sl], host_s[held])


@pytest.mark.parametrize("update_in_host", [False, True])
def test_rowwise_adagrad_on_cpu_is_the_reference_bit_for_bit(update_in_host: bool) -> None:
    """Row-wise Adagrad's compiled passes on a CPU device, over steps of rows in static slots,
    dynamic slots and host, leave every copy as the gathered reference update does, bit for bit."""
    rows_n, dim = 3000, 32
    spec = OptimizerSpec(kind="rowwise_adagrad", lr=0.03, eps=1e-8)
    rng = np.random.default_rng(4)
    weights = torch.from_numpy(rng.standard_normal((rows_n, dim)).astype(np.float32))
    state = torch.from_numpy((rng.random((rows_n, 1)) * 1e-6).astype(np.float32))
    host = HostTables({"weights": weights, "state": state}, torch.empty(0, dtype=torch.uint8), CPU, "auto", None)
    store = OwnerStore(rows_n, rng.choice(rows_n, 300, replace=False), dim, 1, CPU)
    upd = OwnerUpdate(spec, store, host, update_in_host)
    upd.reload()
    ref_w, ref_s = weights.clone(), state.clone()
    for step in range(6):
        rows = np.sort(rng.choice(rows_n, 1500, replace=False))
        grads = torch.from_numpy((rng.standard_normal((rows.shape[0], dim)) * 1e-2).astype(np.float32))
        grads[:100] = 0.0
        held = upd.apply(step, rows, grads)
        r = torch.from_numpy(rows)
        w, s = ref_w[r], ref_s[r]
        apply_update(spec, w, s, grads, step)
        ref_w[r], ref_s[r] = w, s
        assert held.tolist() == (rows[store.slot_of[rows] >= 0] if update_in_host else rows).tolist()
        h = torch.from_numpy(held)
        sl = torch.from_numpy(store.slot_of[held])
        assert torch.equal(store.weights[sl], ref_w[h]) and torch.equal(store.state[sl], ref_s[h])
        if step % 2:  # flush and release some dynamic slots, as the flusher does
            dyn = held[store.slot_of[held] >= store.num_static][::2]
            dsl = torch.from_numpy(store.slot_of[dyn])
            weights[torch.from_numpy(dyn)], state[torch.from_numpy(dyn)] = store.weights[dsl], store.state[dsl]
            store.release(dyn)
    pending = torch.from_numpy(np.flatnonzero(store.slot_of >= 0))
    sl = torch.from_numpy(store.slot_of[pending.numpy()])
    weights[pending], state[pending] = store.weights[sl], store.state[sl]
    assert torch.equal(weights, ref_w) and torch.equal(state, ref_s)
