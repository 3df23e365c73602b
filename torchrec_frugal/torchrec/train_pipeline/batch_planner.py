"""The planner of FrugalTrainPipeline: each batch read ahead is copied and planned off the training thread.

A batch's plan (per frugal module, :meth:`FrugalShardedModuleMixin.plan_batch`: unique rows, id
checks, static-cache hits, host reads, bag offsets, pooling weights, all moved to the device)
depends only on the batch and on what is fixed once the engines are set up. So it is made as soon
as the batch is read, steps before its forward, by one planner thread that takes batches in the
order they were read. The thread first copies each batch's ids (a loader may refill its buffers
once it is asked for the next batch: the pipeline waits for that copy before it asks), and copies
come before plans, so a planner busy with earlier plans does not hold the loader up. The
training thread only hands the batch over and later hands the finished plan to the batch's
forward. With peers, each batch's outcome is agreed after it is planned (:mod:`.batch_agreement`):
a batch that fails to plan on any rank (an id refused by its bounds_check_mode) fails on every rank, with its cause,
where the training thread asks for its plan, and the pipeline drops it.
"""
from __future__ import annotations

import threading
import weakref
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, List, Optional, Sequence

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ...errors import FrugalError
from .batch_agreement import Agree, agreed_refusal
from ..embedding_lookup import BatchPlan
from ..embedding_types import FrugalShardedModuleMixin

ModulePlans = List[List[BatchPlan]]
"""Per frugal module (in the pipeline's order), per frugal lookup, the plan of one batch."""

FeaturesOf = Callable[[FrugalShardedModuleMixin, Any], KeyedJaggedTensor]
"""The KJT a frugal module receives of a batch as the data loader yields it."""


def snapshot(features: KeyedJaggedTensor, pin: bool) -> KeyedJaggedTensor:
    """A copy of ``features``' ids, lengths and weights that the loader cannot change (page-locked
    for an asynchronous copy to an accelerator). Tensors already on a device are kept as they are:
    the planner reads them back itself, off the training thread."""

    def own(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if t is None or t.device.type != "cpu":
            return t
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=pin).copy_(t)

    return KeyedJaggedTensor(
        keys=features.keys(),
        values=own(features.values()),  # type: ignore[arg-type]
        weights=own(features.weights_or_none()),
        lengths=own(features.lengths()),
        stride=features.stride(),
    )


def _on_cpu(features: KeyedJaggedTensor) -> KeyedJaggedTensor:
    if features.values().device.type == "cpu":
        return features
    w = features.weights_or_none()
    return KeyedJaggedTensor(
        keys=features.keys(),
        values=features.values().cpu(),
        weights=None if w is None else w.cpu(),
        lengths=features.lengths().cpu(),
        stride=features.stride(),
    )


def plan_modules(modules: Sequence[FrugalShardedModuleMixin], features: Sequence[KeyedJaggedTensor]) -> ModulePlans:
    """Each module's plans of one batch, ``features[i]`` being what module i receives of it."""
    return [m.plan_batch(_on_cpu(f)) for m, f in zip(modules, features)]


@dataclass
class PlanJob:
    """One batch handed to the planner: ``copied`` is set once its ids are copied (or failed to
    be), ``plans`` holds its plans or the error copying, planning or agreeing on it raised."""

    batch: Any
    index: int  # the batch's place in the stream read (what errors name)
    modules: List[FrugalShardedModuleMixin]
    features_of: FeaturesOf
    pin: bool
    agree: Optional[Agree] = None
    copied: threading.Event = field(default_factory=threading.Event)
    plans: "Future[ModulePlans]" = field(default_factory=Future)
    features: Optional[List[KeyedJaggedTensor]] = None
    error: Optional[BaseException] = None

    def copy(self) -> None:
        """Copy the batch's ids (:func:`snapshot`); a failure is kept for :meth:`plan`."""
        try:
            self.features = [snapshot(self.features_of(m, self.batch), self.pin) for m in self.modules]
        except BaseException as e:
            self.error = e
        finally:
            self.batch = None  # the loader's batch is not held a moment longer than needed
            self.copied.set()

    def plan(self) -> None:
        """Plan the copied batch, then agree on it with the peers: a batch any rank failed to
        plan fails on every rank (the pipeline drops it)."""
        result, error = None, self.error
        if error is None:
            assert self.features is not None
            try:
                result = plan_modules(self.modules, self.features)
            except BaseException as e:
                error = e
        self.features = None
        error = agreed_refusal(self.index, error, self.agree)
        if error is None:
            self.plans.set_result(result)  # type: ignore[arg-type]
        else:
            self.plans.set_exception(error)


class _PlannerThread:
    """The planner's thread and its two queues: batches to copy first, then batches to plan."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._copies: Deque[PlanJob] = deque()
        self._plans: Deque[PlanJob] = deque()
        self._stopped = False
        self.thread = threading.Thread(target=self._loop, name="frugal-planner", daemon=True)
        self.thread.start()

    def put(self, job: PlanJob) -> None:
        with self._cv:
            if self._stopped:
                raise FrugalError("the batch planner is closed")
            self._copies.append(job)
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._copies or self._plans or self._stopped):
                    self._cv.wait()
                if self._stopped:
                    return
                copy = bool(self._copies)
                job = self._copies.popleft() if copy else self._plans.popleft()
            if not copy:
                job.plan()
            else:
                job.copy()  # a failed copy is planned too: its failure is agreed on with the peers
                with self._cv:
                    self._plans.append(job)

    def stop(self, wait: bool) -> None:
        """Drop the batches not copied or planned yet (their plans are cancelled)."""
        with self._cv:
            self._stopped = True
            for job in list(self._copies) + list(self._plans):
                job.plans.cancel()
                job.copied.set()
            self._copies.clear()
            self._plans.clear()
            self._cv.notify_all()
        if wait and self.thread is not threading.current_thread():
            self.thread.join()


class BatchPlanner:
    """Copies and plans batches in the order they are submitted, on a thread of its own."""

    def __init__(self) -> None:
        self._thread = _PlannerThread()
        self._finalizer = weakref.finalize(self, self._thread.stop, False)

    def submit(
        self,
        modules: Sequence[FrugalShardedModuleMixin],
        batch: Any,
        index: int,
        features_of: FeaturesOf,
        pin: bool,
        agree: Optional[Agree] = None,
    ) -> PlanJob:
        """Copy and plan batch ``index`` of the stream, ``features_of(m, batch)`` being what
        module ``m`` receives of it (copies page-locked if ``pin``), then ``agree`` on it."""
        job = PlanJob(batch, index, list(modules), features_of, pin, agree)
        self._thread.put(job)
        return job

    def close(self) -> None:
        """Stop the thread once the job it runs is done (those not done are dropped)."""
        self._thread.stop(wait=True)
