"""The exchange worker in the engine: on CPU it publishes the lookahead off the training thread
(one rank; the engine's exactness with it is ``test_engine_exactness``'s; the worker itself,
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


def test_with_flusher_threads_the_training_thread_flushes_nothing(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exchange worker flushes what the next step reads, the flushers the rest; a gate that
    waits for them only waits (on CPU without flushers, the default, the training thread helps)."""
    threads: List[str] = []
    flush_once = Flusher.flush_once

    def recorded(self: Flusher, max_priority: Any, wait: bool = True) -> Any:
        if max_priority is not None:  # not the final drain (flush(), on the caller by design)
            threads.append(threading.current_thread().name)
        return flush_once(self, max_priority, wait)

    monkeypatch.setattr(Flusher, "flush_once", recorded)
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
    tables = _train(tmp_path, 3, steps=100, flush_workers=1, update_uncached_in_host=False)
    assert "MainThread" not in threads, sorted(set(threads))
    threads.clear()
    assert torch.equal(tables, _train(tmp_path, 3, steps=100, flush_workers=0, update_uncached_in_host=False))
    assert "MainThread" in threads  # the default on CPU: no flusher, the training thread helps


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
