"""The exchange worker: steps handed over run in order, drains wait for them, a failure on the
worker surfaces on the training thread with its cause, and on CPU it publishes the lookahead
(one rank; the engine's exactness with it is ``test_engine_exactness``'s)."""
from __future__ import annotations

import threading
import time
from typing import Any, List

import pytest
import torch

from torchrec_frugal.config import FrugalConfig, OptimizerSpec, TableSpec
from torchrec_frugal.engine.frugal_engine import FrugalEngine
from torchrec_frugal.errors import FrugalError
from torchrec_frugal.engine.exchange_worker import ExchangeWorker
from torchrec_frugal.engine.flush.flusher import Flusher
from torchrec_frugal.engine.lookahead.ring import LookaheadRing
from torchrec_frugal.engine.owner_update import OwnerUpdate


def test_steps_run_in_order_off_the_caller_and_drain_waits_for_them() -> None:
    done: List[Any] = []
    worker = ExchangeWorker("frugal-exchange-test", on_failure=lambda e: done.append(e))
    for i in range(5):
        worker.submit(lambda i=i: (time.sleep(0.01), done.append((i, threading.current_thread().name))))
    assert worker.pending > 0  # handed over, not run by the caller
    worker.drain(timeout_s=10)
    assert done == [(i, "frugal-exchange-test") for i in range(5)] and worker.pending == 0
    worker.stop(1)
    with pytest.raises(FrugalError, match="stopped"):
        worker.submit(lambda: None)


def test_a_failing_step_is_reported_and_ends_the_worker() -> None:
    seen: List[BaseException] = []
    worker = ExchangeWorker("frugal-exchange-test", on_failure=seen.append)
    worker.submit(lambda: 1 / 0)
    worker.submit(lambda: seen.append(RuntimeError("must not run")))
    worker.drain(timeout_s=10)  # returns: the worker failed
    assert len(seen) == 1 and isinstance(seen[0], ZeroDivisionError)
    worker.stop(1)


def test_a_wait_for_a_ticket_does_not_wait_for_later_hand_offs() -> None:
    worker = ExchangeWorker("frugal-exchange-test", on_failure=lambda e: None)
    later = threading.Event()
    first = worker.submit(lambda: None)
    second = worker.submit(lambda: later.wait(5))
    assert (first, second) == (1, 2)
    assert worker.wait_done(5, first) and worker.done_through(first)
    assert not worker.wait_done(0.05, second) and not worker.done_through(second)
    later.set()
    assert worker.wait_done(5, second) and worker.pending == 0
    worker.stop(1)


def test_a_step_handed_over_without_a_wake_runs_with_the_next_woken_one_or_when_woken_for_or_waited_for() -> None:
    ran: List[str] = []
    worker = ExchangeWorker("frugal-exchange-test", on_failure=lambda e: None)
    worker.submit(lambda: None)
    worker.drain(timeout_s=5)
    time.sleep(0.05)  # the worker has gone back to sleep
    quiet = worker.submit(lambda: ran.append("quiet"), wake=False)
    time.sleep(0.2)
    assert ran == [] and worker.pending == 1  # not woken for it
    worker.submit(lambda: ran.append("woken"))  # wakes the worker: both run, in order
    worker.drain(timeout_s=5)
    assert ran == ["quiet", "woken"]
    ticket = worker.submit(lambda: ran.append("waited for"), wake=False)
    assert ticket == quiet + 2 and worker.wait_done(5, ticket) and ran[-1] == "waited for"
    time.sleep(0.05)
    ticket = worker.submit(lambda: ran.append("woken through"), wake=False)
    worker.wake_through(ticket - 1)  # woken already: no wake
    time.sleep(0.2)
    assert ran[-1] == "waited for" and worker.pending == 1
    worker.wake_through(ticket)  # runs it without waiting for it
    deadline = time.monotonic() + 5
    while ran[-1] != "woken through" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran[-1] == "woken through"
    worker.submit(lambda: ran.append("drained"), wake=False)
    worker.drain(timeout_s=5)
    assert ran[-1] == "drained"
    worker.stop(1)


def test_a_drain_that_times_out_names_the_steps_left() -> None:
    worker = ExchangeWorker("frugal-exchange-test", on_failure=lambda e: None)
    gate = threading.Event()
    worker.submit(lambda: gate.wait(5))
    with pytest.raises(FrugalError, match=r"1 step\(s\) not done after 0.05 s"):
        worker.drain(timeout_s=0.05)
    gate.set()
    worker.drain(timeout_s=5)
    worker.stop(1)


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
