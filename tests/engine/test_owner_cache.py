"""Static ownership (assign_ownership) and the owner's slot store (OwnerStore)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchrec_frugal.engine.owner_cache import OwnerStore, assign_ownership


def _counts(sizes, seed):
    rng = np.random.default_rng(seed)
    # Heavy-tailed counts with many ties (including zeros) so the tie-break matters.
    return [np.minimum(rng.zipf(1.5, size=n) - 1, 50).astype(np.int64) for n in sizes]


SIZES = [100, 37, 1, 64]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("ratio", [0.0, 0.01, 0.05, 0.1, 0.25, 0.3, 0.5, 1.0])
def test_assign_ownership_invariants(world, ratio):
    counts = _counts(SIZES, seed=world * 100 + int(ratio * 100))
    own = assign_ownership(counts, ratio, world)
    total = sum(SIZES)
    assert own.owner.shape == (total,) and own.cached.shape == (total,)
    # Every row has exactly one owner, a valid rank.
    assert own.owner.min() >= 0 and own.owner.max() < world

    # Per-rank cached sets are disjoint and cover exactly the cached rows.
    per_rank = [own.cached_rows(r) for r in range(world)]
    allc = np.concatenate(per_rank)
    assert len(np.unique(allc)) == len(allc)
    np.testing.assert_array_equal(np.sort(allc), np.flatnonzero(own.cached))
    for r, rows in enumerate(per_rank):
        assert (own.owner[rows] == r).all()

    base = 0
    for n, c in zip(SIZES, counts):
        sl = slice(base, base + n)
        owner, cached = own.owner[sl], own.cached[sl]
        per = np.array([np.count_nonzero(cached & (owner == r)) for r in range(world)])
        if ratio == 1.0 or math.floor(ratio * n) * world >= n:
            # The whole table is cached, split round-robin: shares differ by at most one row.
            assert cached.all(), (n, ratio, world)
            assert per.max() - per.min() <= 1
        else:
            assert (per == math.floor(ratio * n)).all(), (n, ratio, world, per)

        if cached.any() and not cached.all():
            # Hottest rows are cached; on a tie at the boundary the lower row ids win.
            cmin, umax = c[cached].min(), c[~cached].max()
            assert cmin >= umax
            if cmin == umax:
                tied = np.flatnonzero(c == cmin)
                assert np.flatnonzero(cached[tied]).max() < np.flatnonzero(~cached[tied]).min()
        # Uncached rows are owned by (table-local) id % world.
        ids = np.flatnonzero(~cached)
        np.testing.assert_array_equal(owner[ids], ids % world)

        # Round robin in heat order: j-th hottest cached row -> rank j % world, so heat is balanced.
        order = np.lexsort((np.arange(n), -c))[: np.count_nonzero(cached)]
        np.testing.assert_array_equal(owner[order], np.arange(order.size) % world)
        heat = np.array([c[cached & (owner == r)].sum() for r in range(world)])
        assert (np.diff(heat) <= 0).all()  # rank 0 takes first pick of every round
        assert heat[0] - heat[-1] <= (c.max() if n else 0)
        base += n


def test_assign_ownership_hand_example():
    counts = [np.array([5, 0, 9, 9, 1, 7, 0, 3]), np.array([2, 4])]
    own = assign_ownership(counts, 0.25, 2)  # floor(0.25 * 8) = 2 rows per rank in table 0; 0 in table 1
    # Heat order of table 0: 2 (9), 3 (9), 5 (7), 0 (5) -> ranks 0, 1, 0, 1.
    assert np.flatnonzero(own.cached).tolist() == [0, 2, 3, 5]
    assert own.owner[[2, 3, 5, 0]].tolist() == [0, 1, 0, 1]
    assert own.cached_rows(0).tolist() == [2, 5]
    assert own.cached_rows(1).tolist() == [0, 3]
    # Uncached: 1, 4, 6, 7 by id % 2; table 1 (fused rows 8, 9) by local id % 2.
    assert own.owner[[1, 4, 6, 7, 8, 9]].tolist() == [1, 0, 0, 1, 0, 1]


def test_assign_ownership_deterministic_and_dtype_independent():
    counts = _counts(SIZES, seed=5)
    a = assign_ownership(counts, 0.1, 3)
    b = assign_ownership([c.copy() for c in counts], 0.1, 3)
    c = assign_ownership([x.astype(np.int32) for x in counts], 0.1, 3)
    for o in (b, c):
        np.testing.assert_array_equal(a.owner, o.owner)
        np.testing.assert_array_equal(a.cached, o.cached)


def test_assign_ownership_all_zero_counts_caches_lowest_ids():
    own = assign_ownership([np.zeros(10, dtype=np.int64)], 0.2, 2)
    assert np.flatnonzero(own.cached).tolist() == [0, 1, 2, 3]
    assert own.owner[:4].tolist() == [0, 1, 0, 1]


# ---------------------------------------------------------------- OwnerStore


def _check_store(store: OwnerStore, cached_rows: np.ndarray, held: set, tag) -> None:
    n_static = store.num_static
    np.testing.assert_array_equal(store.slot_of[cached_rows], np.arange(n_static))
    held_rows = np.array(sorted(held), dtype=np.int64)
    slots = store.slot_of[held_rows]
    assert (slots >= n_static).all() and (slots < store.weights.shape[0]).all()
    assert len(np.unique(slots)) == len(slots)
    assert store.dynamic_in_use == len(held)
    others = np.setdiff1d(np.arange(store.slot_of.shape[0]), np.concatenate([cached_rows, held_rows]))
    assert (store.slot_of[others] == -1).all()
    assert store.weights.shape[0] == store.state.shape[0]
    # Contents follow their rows (static ones never move; dynamic ones survive growth).
    rows = np.concatenate([cached_rows, held_rows])
    for r in rows.tolist():
        s = int(store.slot_of[r])
        assert store.weights[s].tolist() == [tag(r)] * store.dim
        if store.state_width:
            assert store.state[s].tolist() == [-tag(r)] * store.state_width


@pytest.mark.parametrize("state_width", [0, 1, 3])
def test_owner_store_random_alloc_release(state_width):
    rng = np.random.default_rng(state_width)
    num_rows, dim = 6000, 2
    cached_rows = np.sort(rng.choice(num_rows, size=50, replace=False)).astype(np.int64)
    store = OwnerStore(num_rows, cached_rows, dim, state_width, torch.device("cpu"))
    assert store.num_static == 50 and store.dynamic_in_use == 0
    gen = [0]
    tags = {}

    def tag(r):
        return float(tags[r])

    for r in cached_rows.tolist():
        tags[r] = r + 0.5
    store.weights[: store.num_static] = torch.tensor([tag(r) for r in cached_rows.tolist()]).unsqueeze(1)
    store.state[: store.num_static] = -torch.tensor([tag(r) for r in cached_rows.tolist()]).unsqueeze(1)

    uncached = np.setdiff1d(np.arange(num_rows), cached_rows)
    held: set = set()
    grew = 0
    for op in range(60):
        free_rows = np.array(sorted(set(uncached.tolist()) - held), dtype=np.int64)
        if rng.random() < 0.6 or not held:
            # Sometimes a burst larger than the free list, which forces growth.
            k = int(rng.integers(0, 3000 if rng.random() < 0.2 else 200))
            k = min(k, free_rows.size)
            rows = rng.choice(free_rows, size=k, replace=False).astype(np.int64)
            cap = store.weights.shape[0]
            slots = store.alloc(rows)
            grew += store.weights.shape[0] > cap
            np.testing.assert_array_equal(store.slot_of[rows], slots)
            for r, s in zip(rows.tolist(), slots.tolist()):
                gen[0] += 1
                tags[r] = float(gen[0])
                store.weights[s] = tags[r]
                store.state[s] = -tags[r]
            held |= set(rows.tolist())
        else:
            hl = np.array(sorted(held), dtype=np.int64)
            rows = rng.choice(hl, size=int(rng.integers(1, hl.size + 1)), replace=False)
            store.release(rows)
            assert (store.slot_of[rows] == -1).all()
            held -= set(rows.tolist())
        _check_store(store, cached_rows, held, tag)
    assert grew >= 1, "the sequence must exercise growth"


def test_owner_store_growth_preserves_contents_and_reuses_slots():
    cached = np.array([3, 7], dtype=np.int64)
    store = OwnerStore(5000, cached, 1, 1, torch.device("cpu"))
    store.weights[:2] = torch.tensor([[30.0], [70.0]])
    first = np.arange(10, 1010, dtype=np.int64)
    s1 = store.alloc(first)
    assert sorted(s1.tolist()) == list(range(2, 1002))
    store.weights[torch.from_numpy(s1)] = torch.from_numpy(first.astype(np.float32)).unsqueeze(1)
    cap = store.weights.shape[0]
    second = np.arange(2000, 2500, dtype=np.int64)
    s2 = store.alloc(second)  # more than the 26 free slots: must grow
    assert store.weights.shape[0] > cap
    assert len(set(s1.tolist()) | set(s2.tolist())) == 1500
    assert store.weights[:2, 0].tolist() == [30.0, 70.0]
    np.testing.assert_array_equal(store.weights[torch.from_numpy(s1), 0].numpy(), first.astype(np.float32))
    # Released slots are handed out again before any new growth.
    store.release(first[:100])
    cap = store.weights.shape[0]
    s3 = store.alloc(np.arange(3000, 3100, dtype=np.int64))
    assert store.weights.shape[0] == cap
    assert set(s3.tolist()) == set(s1[:100].tolist())
    assert store.slot_of[3].item() == 0 and store.slot_of[7].item() == 1


def test_ownership_from_presample_sums_counts_over_ranks_and_checks_them() -> None:
    from torchrec_frugal.config import TableSpec
    from torchrec_frugal.errors import FrugalInputError
    from torchrec_frugal.engine.owner_cache import ownership_from_presample

    tables = [TableSpec("a", 10, 2), TableSpec("b", 20, 2)]
    counts = [torch.zeros(10), torch.zeros(20)]
    counts[0][7] = 5  # hot on this rank
    counts[1][3] = 1
    other = torch.zeros(30, dtype=torch.float64)
    other[2] = 9  # the other rank's counts: row 2 of table a is the hottest over both
    own = ownership_from_presample(tables, counts, 0.1, 2, lambda c: c + other)
    assert own.cached.nonzero()[0].tolist() == [2, 7, 10, 11, 12, 13]  # 1 row of a, 2 of b per rank
    assert own.owner[[2, 7, 13, 10, 11, 12]].tolist() == [0, 1, 0, 1, 0, 1]  # hottest first, round-robin
    none = ownership_from_presample(tables, None, 0.0, 2, lambda c: c)
    assert not none.cached.any() and none.owner.tolist() == [r % 2 for r in range(10)] + [r % 2 for r in range(20)]
    with pytest.raises(FrugalInputError, match="presample_counts has 1 tensors for 2 tables"):
        ownership_from_presample(tables, counts[:1], 0.1, 2, lambda c: c)
    with pytest.raises(FrugalInputError, match="table 'b': presample counts have 3 entries, expected 20"):
        ownership_from_presample(tables, [counts[0], torch.zeros(3)], 0.1, 2, lambda c: c)


def test_owner_store_on_cpu_reserves_every_dynamic_slot_and_never_grows() -> None:
    cached = np.array([3, 7], dtype=np.int64)
    store = OwnerStore(5000, cached, 2, 1, torch.device("cpu"), max_dynamic=4998)
    assert store.weights.shape[0] == store.state.shape[0] == 5000
    assert store.weights[:2].eq(0).all() and store.state[:2].eq(0).all()  # static slots start at zero
    weights = store.weights
    rows = np.setdiff1d(np.arange(5000), cached)
    slots = store.alloc(rows[:3000])
    assert slots.tolist() == list(range(2, 3002))  # the lowest slots first: only their pages get touched
    store.release(rows[:1000])
    store.alloc(rows[3000:])
    assert store.weights is weights and store.dynamic_in_use == 3998
    # Elsewhere device memory is real: the same store starts small (and grows, as above).
    assert OwnerStore(5000, cached, 2, 1, torch.device("meta"), max_dynamic=4998).weights.shape[0] == 2 + 1024
