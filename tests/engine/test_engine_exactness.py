"""Exactness of the engine: 2 and 4 ranks, Zipf ids, every read equals a single-process reference."""
from __future__ import annotations

import itertools
from typing import Dict, Iterator

import pytest

from rank_pool import RankPool
from torchrec_frugal.host.launch import leaked_segments
from engine_reference import Scenario, run_scenario

STEPS = 1000
TOL = 1e-5


def _matrix_2() -> list:
    return [
        Scenario(lookahead=l, cache_ratio=c, optimizer=o, steps=STEPS)
        for l, c, o in itertools.product((0, 1, 10), (0.0, 0.05, 1.0), ("sgd", "rowwise_adagrad"))
    ] + [
        # Uncached rows through dynamic slots, background flushes and the lookahead worker, as on an accelerator.
        Scenario(lookahead=l, cache_ratio=c, optimizer=o, steps=STEPS, in_host=False, worker=True)
        for l, c, o in [(0, 0.05, "sgd"), (1, 0.0, "rowwise_adagrad"), (10, 0.05, "rowwise_adagrad"), (10, 0.0, "sgd")]
    ] + [
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="adam", steps=STEPS),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="adagrad", steps=STEPS),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="rowwise_adagrad", steps=STEPS, queue="heap"),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="sgd", steps=STEPS, flush_workers=0),
        # A lookahead worker that lags behind the training thread: the gate must wait for it.
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="sgd", steps=600, in_host=False, worker=True, worker_lag_s=0.004),
        Scenario(lookahead=2, cache_ratio=0.05, optimizer="rowwise_adagrad", steps=600, worker=True, worker_lag_s=0.004),
        # Host reads deduplicated and in row order, then expanded (the CUDA default).
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="rowwise_adagrad", steps=STEPS, in_host=False, sorted_reads=True),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="rowwise_adagrad", steps=STEPS, max_deferred_rows=0, in_host=False),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="sgd", steps=STEPS, flush_workers=2, max_deferred_rows=100, in_host=False),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="sgd", steps=200, broken_lookahead=True),
        # Mailboxes that start at 2 rows and grow while peers read them (inline, and from the worker thread).
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="rowwise_adagrad", steps=600, mailbox_rows=2),
        Scenario(lookahead=3, cache_ratio=0.0, optimizer="sgd", steps=600, in_host=False, worker=True, mailbox_rows=2),
    ] + [
        # Steps planned ahead on a planner thread, as FrugalTrainPipeline runs them.
        Scenario(lookahead=l, cache_ratio=c, optimizer=o, steps=STEPS, planned=True)
        for l, c, o in [(0, 0.05, "sgd"), (1, 0.0, "rowwise_adagrad"), (10, 0.05, "rowwise_adagrad")]
    ] + [
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="adam", steps=STEPS, in_host=False, worker=True, planned=True),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="sgd", steps=STEPS, in_host=False, sorted_reads=True, planned=True),
    ]


def _matrix_4() -> list:
    # Every (lookahead, cache ratio) pair once, the optimizers alternating so that each lookahead
    # and each cache ratio meets both (the 2-rank matrix runs the whole product).
    return [
        Scenario(lookahead=l, cache_ratio=c, optimizer=("sgd", "rowwise_adagrad")[(i + j) % 2], steps=STEPS)
        for (i, l), (j, c) in itertools.product(enumerate((0, 1, 10)), enumerate((0.0, 0.05, 1.0)))
    ] + [
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="rowwise_adagrad", steps=STEPS, max_deferred_rows=0, in_host=False),
        Scenario(lookahead=1, cache_ratio=0.0, optimizer="sgd", steps=STEPS, in_host=False, worker=True),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="sgd", steps=STEPS, in_host=False, worker=True),
        Scenario(lookahead=10, cache_ratio=0.05, optimizer="rowwise_adagrad", steps=600, worker=True, mailbox_rows=2),
        Scenario(lookahead=1, cache_ratio=0.0, optimizer="sgd", steps=STEPS, in_host=False, worker=True, planned=True),
    ] + [Scenario(lookahead=10, cache_ratio=0.05, optimizer="sgd", steps=200, broken_lookahead=True)]


def _label(sc: Scenario) -> str:
    """A test id naming what the scenario sets beside its defaults."""
    default = Scenario(lookahead=0, cache_ratio=0.0, optimizer="sgd", steps=STEPS)
    parts = [f"L{sc.lookahead}", f"c{sc.cache_ratio:g}", sc.optimizer]
    parts += [f"{k}={v}" for k, v in sorted(vars(sc).items()) if k not in ("lookahead", "cache_ratio", "optimizer") and v != getattr(default, k)]
    return "-".join(parts)


def check_result(world: int, sc: Scenario, per_rank: list) -> None:
    """Every read and the final host tables match the reference; the negative control fails it."""
    label = f"world={world} {sc}"
    if sc.broken_lookahead:
        # The reference check must catch stale host reads when the gate is skipped.
        assert max(m["max_rel_read_error"] for m in per_rank) > 1e-3, label
        return
    for r, m in enumerate(per_rank):
        assert m["max_rel_read_error"] <= TOL, (label, r, m)
        assert m["host_vs_ref"] <= TOL, (label, r, m)
        assert m["cache_vs_host"] == 0.0 and m["state_vs_host"] == 0.0, (label, r, m)
        assert m["dynamic_after_flush"] == 0.0, (label, r, m)
        if sc.cache_ratio > 0 or sc.in_host is False:
            assert m["flushed_rows"] > 0, (label, r, m)  # the flush path really ran
        if sc.lookahead > 0:
            # Owners that update uncached rows in place never hold their writes: nobody
            # announces reads of them. Otherwise every host read is announced.
            if m["update_in_host"]:
                assert m["window_uncached"] == 0, (label, r, m)
            elif sc.cache_ratio < 1.0:
                assert m["window_uncached"] > 0, (label, r, m)
    step_ids = sc.ids_per_step * len(sc.table_rows)
    if sc.mailbox_rows < step_ids:  # the records really grew, and no further than a step needs
        for r, m in enumerate(per_rank):
            assert sc.mailbox_rows < m["grad_rows"] <= 2 * step_ids, (label, r, m)
            assert sc.mailbox_rows < m["ring_rows"] <= 2 * step_ids, (label, r, m)
    expected_cached = {0.0: 0, 0.05: 60 + 150, 1.0: (3000 + 1200) // world}[sc.cache_ratio]
    assert per_rank[0]["cached_rows"] == expected_cached, label


MATRIX = {2: _matrix_2(), 4: _matrix_4()}


@pytest.fixture(scope="module")
def pools() -> Iterator[Dict[int, RankPool]]:
    """One pool of ranks per world size for the module."""
    made = {world: RankPool(world, timeout=600) for world in MATRIX}
    try:
        yield made
    finally:
        for pool in made.values():
            pool.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "world, sc", [(w, sc) for w, scs in MATRIX.items() for sc in scs], ids=[f"{w}-{_label(sc)}" for w, scs in MATRIX.items() for sc in scs]
)
def test_engine_matches_reference(pools: Dict[int, RankPool], world: int, sc: Scenario) -> None:
    check_result(world, sc, pools[world].run(run_scenario, sc))
    assert leaked_segments() == []
