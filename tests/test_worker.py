"""The one background worker: jobs handed over run in order off the caller, with tickets to wait
for; drains wait for them; the idle task runs between jobs and sleeps when it finds nothing; a
failure ends the worker and reaches ``on_failure``, even from a job that stopped its own worker;
a long job leaves early once the worker is stopped."""
from __future__ import annotations

import threading
import time
from typing import Any, List

import pytest

from torchrec_frugal.errors import FrugalError
from torchrec_frugal.worker import Worker


def _until(cond: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)
    return bool(cond())


def test_jobs_run_in_order_off_the_caller_and_drain_waits_for_them() -> None:
    done: List[Any] = []
    worker = Worker("frugal-worker-test", on_failure=lambda e: done.append(e))
    for i in range(5):
        worker.submit(lambda i=i: (time.sleep(0.01), done.append((i, threading.current_thread().name))))
    assert worker.pending > 0  # handed over, not run by the caller
    worker.drain(timeout_s=10)
    assert done == [(i, "frugal-worker-test") for i in range(5)] and worker.pending == 0
    worker.stop(1)
    with pytest.raises(FrugalError, match="stopped"):
        worker.submit(lambda: None)


def test_a_failing_job_is_reported_and_ends_the_worker() -> None:
    seen: List[BaseException] = []
    worker = Worker("frugal-worker-test", on_failure=seen.append)
    worker.submit(lambda: 1 / 0)
    worker.submit(lambda: seen.append(RuntimeError("must not run")))
    worker.drain(timeout_s=10)  # returns: the worker failed
    assert len(seen) == 1 and isinstance(seen[0], ZeroDivisionError)
    assert _until(lambda: not worker.thread.is_alive())
    worker.stop(1)


def test_a_wait_for_a_ticket_does_not_wait_for_later_hand_offs() -> None:
    worker = Worker("frugal-worker-test", on_failure=lambda e: None)
    later = threading.Event()
    first = worker.submit(lambda: None)
    second = worker.submit(lambda: later.wait(5))
    assert (first, second) == (1, 2)
    assert worker.wait_done(5, first) and worker.done_through(first)
    assert not worker.wait_done(0.05, second) and not worker.done_through(second)
    later.set()
    assert worker.wait_done(5, second) and worker.pending == 0
    worker.stop(1)


def test_a_job_handed_over_without_a_wake_runs_with_the_next_woken_one_or_when_woken_for_or_waited_for() -> None:
    ran: List[str] = []
    worker = Worker("frugal-worker-test", on_failure=lambda e: None)
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
    assert _until(lambda: ran[-1] == "woken through")
    worker.submit(lambda: ran.append("drained"), wake=False)
    worker.drain(timeout_s=5)
    assert ran[-1] == "drained"
    worker.stop(1)


def test_a_drain_that_times_out_names_the_jobs_left() -> None:
    worker = Worker("frugal-worker-test", on_failure=lambda e: None)
    gate = threading.Event()
    worker.submit(lambda: gate.wait(5))
    with pytest.raises(FrugalError, match=r"frugal-worker-test: 1 job\(s\) not done after 0.05 s"):
        worker.drain(timeout_s=0.05)
    gate.set()
    worker.drain(timeout_s=5)
    worker.stop(1)


def test_the_idle_task_runs_between_jobs_until_it_finds_nothing_then_on_a_wake() -> None:
    work: List[int] = []
    log: List[str] = []

    def idle() -> bool:
        if not work:
            log.append("nothing")
            return False
        log.append(f"idle {work.pop(0)}")
        return True

    worker = Worker("frugal-worker-test", on_failure=lambda e: None, idle=idle)
    assert _until(lambda: log == ["nothing"])  # once at start, then asleep: no poll without poll_s
    time.sleep(0.1)
    assert log == ["nothing"]
    work.extend([1, 2])
    worker.submit(lambda: log.append("job"))  # the job first, then the idle task until it finds nothing
    assert _until(lambda: log[-1] == "nothing" and len(log) == 5)
    assert log == ["nothing", "job", "idle 1", "idle 2", "nothing"]
    work.append(3)
    worker.wake()
    assert _until(lambda: log[-2:] == ["idle 3", "nothing"])
    worker.stop(1)


def test_jobs_come_before_the_idle_task() -> None:
    log: List[str] = []
    started, release = threading.Event(), threading.Event()
    pending: List[int] = []

    def idle() -> bool:
        if not pending:
            return False
        log.append(f"idle {pending.pop(0)}")
        return True

    worker = Worker("frugal-worker-test", on_failure=lambda e: None, idle=idle)
    worker.submit(lambda: (started.set(), release.wait(5)))
    worker.submit(lambda: log.append("job a"))
    worker.submit(lambda: log.append("job b"))
    assert started.wait(5)
    pending.extend([1, 2])  # idle work appears while the worker runs a job, with two more queued
    release.set()
    assert _until(lambda: len(log) == 4)
    assert log[:2] == ["job a", "job b"]  # both jobs before the idle task's work
    worker.stop(1)


def test_an_idle_task_that_finds_nothing_is_polled_with_back_off() -> None:
    calls: List[float] = []
    worker = Worker("frugal-worker-test", on_failure=lambda e: None, idle=lambda: calls.append(time.monotonic()) and False,
                    poll_s=(0.001, 0.02))  # fmt: skip
    time.sleep(0.3)
    worker.stop(1)
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert 5 <= len(calls) <= 60  # polled, never spinning (the longest sleep is 20 ms)
    assert min(gaps[-3:]) >= 0.015  # backed off to the longest sleep


def test_a_failing_idle_task_is_reported_and_ends_the_worker() -> None:
    seen: List[BaseException] = []
    worker = Worker("frugal-worker-test", on_failure=seen.append, idle=lambda: 1 / 0)
    assert _until(lambda: not worker.thread.is_alive())
    assert len(seen) == 1 and isinstance(seen[0], ZeroDivisionError)
    worker.stop(1)


def test_a_long_job_leaves_early_once_stopped() -> None:
    seen: List[BaseException] = []
    started, left = threading.Event(), threading.Event()
    worker = Worker("frugal-worker-test", on_failure=seen.append)

    def long_job() -> None:
        started.set()
        while not worker.stopped:
            time.sleep(0.005)
        left.set()

    worker.submit(long_job)
    worker.submit(lambda: seen.append(RuntimeError("dropped at stop, must not run")))
    assert started.wait(5)
    worker.stop(5)
    assert left.is_set() and not worker.thread.is_alive() and seen == []


def test_a_job_that_stops_its_own_worker_and_raises_is_still_reported() -> None:
    seen: List[BaseException] = []
    worker = Worker("frugal-worker-test", on_failure=seen.append)

    def aborting_job() -> None:
        worker.stop(1)  # as a rank's abort stops its background threads, this one included
        raise RuntimeError("the update broke")

    worker.submit(aborting_job)
    assert _until(lambda: not worker.thread.is_alive())
    assert len(seen) == 1 and "the update broke" in str(seen[0])
