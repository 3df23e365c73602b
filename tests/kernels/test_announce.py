"""A step's announcement grouped by owner: compiled loops, their plain-Python run and the numpy twin agree."""
from __future__ import annotations

import numpy as np
import pytest

from first_seen import first_seen_unique
from torchrec_frugal.kernels.announce import AnnounceScratch, group_announced
from torchrec_frugal.kernels.compiled import numba_available, running_as
from torchrec_frugal.kernels.unique_rows import unique_rows

KERNELS = (unique_rows, group_announced)


def _case(seed: int, num_rows: int = 3000, world: int = 3, n: int = 2000, announced_share: float = 0.6):
    rng = np.random.default_rng(seed)
    # Fields of one record, as the ring keeps them (strided views).
    per_row = np.empty(num_rows, dtype=np.dtype([("owner", np.int16), ("announced", np.bool_)]))
    per_row["owner"] = rng.integers(0, world, num_rows)
    per_row["announced"] = rng.random(num_rows) < announced_share
    ids = (rng.zipf(1.2, n).astype(np.int64) * 7919) % num_rows
    return ids, per_row["announced"], per_row["owner"]


def _expected(ids: np.ndarray, announced: np.ndarray, owner: np.ndarray, world: int):
    """What the ring published before the kernels: first-seen marking, then a stable sort by owner."""
    u = first_seen_unique(ids[announced[ids]], owner.shape[0])
    own = owner[u]
    return u[np.argsort(own, kind="stable")], np.bincount(own, minlength=world)


@pytest.fixture(params=["compiled", "loops", "twin"])
def run_as(request):
    """Run every kernel as ``request.param`` says (the scratch calls them through the module)."""
    if request.param == "compiled":
        yield request.param
        return
    with running_as(request.param, KERNELS):
        yield request.param


@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("seed", range(3))
def test_announce_groups_the_distinct_announced_rows_by_owner(run_as: str, seed: int, share: float) -> None:
    ids, announced, owner = _case(seed, announced_share=share, n=400 if run_as == "loops" else 2000)
    scratch = AnnounceScratch(owner.shape[0])
    counts = np.full(3, -1, dtype=np.int64)
    for part in (ids, ids[:1], ids[:0], ids[::-1]):  # the scratch is reused
        grouped = scratch.announce(part, announced, owner, counts)
        want, want_counts = _expected(part, announced, owner, 3)
        assert grouped.tolist() == want.tolist()
        assert counts.tolist() == want_counts.tolist()


def test_unique_of_parts(run_as: str) -> None:
    ids, _, owner = _case(7, n=600)
    scratch = AnnounceScratch(owner.shape[0])
    parts = [ids[:250], ids[100:400], ids[400:]]
    assert scratch.unique(parts).tolist() == first_seen_unique(np.concatenate(parts), owner.shape[0]).tolist()
    assert scratch.unique([ids[:5]]).tolist() == first_seen_unique(ids[:5], owner.shape[0]).tolist()


def test_compiled_where_numba_is_installed() -> None:
    assert group_announced.compiled == numba_available()
