"""The exchange worker in the engine: on CPU it publishes and ingests the lookahead and flushes, off
the training thread (one rank; the engine's exactness with it is ``test_engine_exactness``'s; the worker itself,
ordering, tickets, drains and failures, is ``tests/test_worker.py``'s)."""
from __future__ import annotations

import threading
import time
from typing import Any, List

import pytest
import torch

from torchrec_frugal.config import FrugalConfig, OptimizerSpec, TableSpec
from torchrec_frugal.engine.frugal_engine import FrugalEngine
from torchrec_frugal.errors import FrugalError
from torchrec_frugal.engine.flush.flusher import Flusher
from torchrec_frugal.engine.lookahead.feed import LookaheadFeed
from torchrec_frugal.engine.lookahead.ring import LookaheadRing
from torchrec_frugal.engine.owner_update import OwnerUpdate


def _train(
    tmp_path: Any, lookahead: int, steps: int = 30, push: bool = True, **config: Any
) -> torch.Tensor:
    cfg = FrugalConfig(lookahead=lookahead, cache_ratio=0.1, shm_dir=str(tmp_path), **config)
    counts = [torch.arange(500, 0, -1, dtype=torch.float32), torch.ones(300)]
    tables = [TableSpec("a", 500, 8), TableSpec("b", 300, 8)]
    with FrugalEngine(tables, OptimizerSpec("rowwise_adagrad", lr=0.1), cfg, presample_counts=counts, seed=1) as eng:
        gen = torch.Generator().manual_seed(2)
        batches = [torch.unique(torch.randint(0, 800, (120,), generator=gen)) for _ in range(steps)]
        for s in range(min(lookahead, steps) if push else 0):
            eng.push_lookahead(eng.plan_step(batches[s]))
        for s in range(steps):
            if s + lookahead < steps and lookahead and push:
                eng.push_lookahead(eng.plan_step(batches[s + lookahead]))
            rows = batches[s]
            eng.begin_step(rows)
            vals = eng.lookup(rows)
            eng.apply_gradients(rows, torch.sin(vals) + 0.01 * s)
        eng.flush()  # drains the worker first
        assert sum(m.step == s for m in eng.take_metrics() for s in [steps - 1]) == 1
        return eng.read_rows()[0].clone()


@pytest.mark.parametrize("push", [True, False])  # False: begin_step announces each step itself
def test_the_worker_publishes_the_lookahead_off_the_training_thread(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, push: bool
) -> None:
    threads: List[str] = []
    publish = LookaheadRing.publish

    def recorded(self: LookaheadRing, *args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return publish(self, *args)

    monkeypatch.setattr(LookaheadRing, "publish", recorded)
    _train(tmp_path, 3, push=push)
    assert len(threads) == 30 and set(threads) == {"frugal-exchange-0"}


@pytest.mark.parametrize("flush_workers", [1, 0])  # 0: the default on CPU
def test_the_training_thread_flushes_and_ingests_nothing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, flush_workers: int
) -> None:
    """The exchange worker flushes what the next step reads, the flushers the rest (or the
    exchange worker, where there are none); the exchange worker ingests (no lookahead worker on
    CPU). A gate that waits for them only waits, handing what it waits for to the exchange worker."""
    flushed: List[str] = []
    ingested: List[str] = []
    flush_once = Flusher.flush_once
    ingest = LookaheadFeed.ingest_available

    def recorded_flush(self: Flusher, max_priority: Any, wait: bool = True) -> Any:
        flushed.append(threading.current_thread().name)
        return flush_once(self, max_priority, wait)

    def recorded_ingest(self: LookaheadFeed, through: Any = None) -> Any:
        ingested.append(threading.current_thread().name)
        return ingest(self, through)

    monkeypatch.setattr(Flusher, "flush_once", recorded_flush)
    monkeypatch.setattr(LookaheadFeed, "ingest_available", recorded_ingest)
    # The worker leaves what the next step reads pending (as when its flush ran before a late
    # ingest made a deferred row due): the gate of that step then finds it pending.
    monkeypatch.setattr(Flusher, "flush_due", lambda self, step: None)
    bound = Flusher.background_bound  # and the flusher thread is slow to get to it

    def slow(self: Flusher) -> int:
        if threading.current_thread().name.startswith("frugal-flusher"):
            time.sleep(2e-3)
        return bound(self)

    monkeypatch.setattr(Flusher, "background_bound", slow)
    # Uncached rows updated in dynamic slots: host reads of them wait for their flush.
    tables = _train(tmp_path, 3, steps=100, flush_workers=flush_workers, update_uncached_in_host=False)
    assert flushed and ingested
    # (the flusher threads flush through their own idle task, not flush_once)
    assert set(flushed) == {"frugal-exchange-0"} and set(ingested) == {"frugal-exchange-0"}, (set(flushed), set(ingested))
    flushed.clear()
    monkeypatch.undo()
    assert torch.equal(tables, _train(tmp_path, 3, steps=100, flush_workers=flush_workers, update_uncached_in_host=False))


def test_a_failure_on_the_worker_is_raised_on_the_training_thread_with_its_cause(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: OwnerUpdate, *args: Any) -> Any:
        raise RuntimeError("owner update broke")

    cfg = FrugalConfig(lookahead=0, shm_dir=str(tmp_path))
    with FrugalEngine([TableSpec("t", 100, 4)], OptimizerSpec(), cfg) as eng:
        rows = torch.arange(10)
        eng.begin_step(rows)
        monkeypatch.setattr(OwnerUpdate, "apply", broken)
        eng.apply_gradients(rows, torch.ones(10, 4))  # handed over: returns
        with pytest.raises(FrugalError, match="exchange") as info:
            eng.drain()
        assert isinstance(info.value.__cause__, RuntimeError) and "owner update broke" in str(info.value.__cause__)
        with pytest.raises(FrugalError, match="exchange"):  # and at every later call
            eng.begin_step(rows)
