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
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, List, Optional, Sequence

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ... import quiet_exit
from ...errors import FrugalError
from .batch_agreement import Agree, agreed_refusal
from ..embedding_lookup import BatchPlan
from ..embedding_types import FrugalShardedModuleMixin
from ...worker import Worker

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


class _Planning:
    """What the planner's worker works on: batches copied and not planned (its thread only), and
    batches submitted and not known planned (dropped or failed together). Apart from
    :class:`BatchPlanner`, so that the worker's thread does not keep the planner alive."""

    def __init__(self) -> None:
        self.copied: Deque[PlanJob] = deque()
        self.open: Deque[PlanJob] = deque()
        self.lock = threading.Lock()

    def add(self, job: PlanJob) -> None:
        with self.lock:
            while self.open and self.open[0].plans.done():
                self.open.popleft()
            self.open.append(job)

    def copy(self, job: PlanJob) -> None:
        """The worker's job for a batch: copy it, to be planned once no copy waits."""
        job.copy()  # a failed copy is planned too: its failure is agreed on with the peers
        self.copied.append(job)

    def plan_next(self) -> bool:
        """The worker's idle task: plan the oldest copied batch (False: none waits)."""
        if not self.copied:
            return False
        self.copied.popleft().plan()
        return True

    def fail(self, error: BaseException) -> None:
        """The planner itself failed (not a batch: an agreement with the peers): every batch not
        planned fails with it, where the training thread asks for its plan."""
        for job in self._take_open():
            if not job.plans.done():
                try:
                    job.plans.set_exception(error)
                except InvalidStateError:  # planned meanwhile
                    pass
            job.copied.set()

    def drop(self) -> None:
        """The batches not planned are dropped (their plans cancelled)."""
        for job in self._take_open():
            job.plans.cancel()
            job.copied.set()

    def _take_open(self) -> List[PlanJob]:
        with self.lock:
            jobs = list(self.open)
            self.open.clear()
        return jobs


def _stop(worker: Worker, planning: _Planning, timeout_s: Optional[float]) -> None:
    """Stop the worker once the job it runs is done (at most ``timeout_s``); drop the rest."""
    worker.stop(timeout_s)
    planning.drop()


class BatchPlanner:
    """Copies and plans batches in the order they are submitted, on a worker of its own.

    Copies are the worker's jobs and plans its idle task, so a batch handed over is copied before
    any plan still waiting is made: the loader is never held up by the planner's backlog."""

    def __init__(self) -> None:
        quiet_exit.arm()  # before our finalizer, which must run before the exit's wait
        self._planning = _Planning()
        self._worker = Worker("frugal-planner", self._planning.fail, idle=self._planning.plan_next)
        # Collected or at exit, the planner waits for the job it runs, as close() does: a thread
        # still inside a torch op when the interpreter finalizes aborts the process (the op's
        # release of the GIL cannot unwind), and the engines it reads close after it.
        self._finalizer = weakref.finalize(self, _stop, self._worker, self._planning, None)

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
        self._planning.add(job)
        planning = self._planning
        try:
            self._worker.submit(lambda: planning.copy(job))
        except FrugalError as e:
            raise FrugalError("the batch planner is closed") from e
        return job

    def close(self) -> None:
        """Stop the worker once the job it runs is done (the batches not planned are dropped)."""
        self._finalizer.detach()
        _stop(self._worker, self._planning, None)
