"""The planner of FrugalTrainPipeline: each batch read ahead is planned off the training thread.

A batch's plan (per frugal module, :meth:`FrugalShardedModuleMixin.plan_batch`: unique rows, id
checks, static-cache hits, host reads, bag offsets, pooling weights, all moved to the device)
depends only on the batch and on what is fixed once the engines are set up. So it is made as soon
as the batch is read, steps before its forward, by one planner thread that takes batches in the
order they were read. The training thread only copies the batch's ids (a loader may refill its
buffers) and later hands the finished plan to the batch's forward. A batch that fails to plan
(an id out of range) raises, with its cause, where the training thread asks for its plan.

Modes: ``"thread"`` (the default), ``"inline"`` (the same plans made on the training thread when
the batch is read, for comparison), ``"none"`` (no plans: each forward checks its batch against
the one announced and computes its rows, as a plain training loop does).
"""
from __future__ import annotations

import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import List, Optional, Sequence

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from .embedding_lookup import BatchPlan
from .embedding_types import FrugalShardedModuleMixin

PLANNERS = ("thread", "inline", "none")

ModulePlans = List[List[BatchPlan]]
"""Per frugal module (in the pipeline's order), per frugal lookup, the plan of one batch."""


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


class BatchPlanner:
    """Plans batches in the order they are submitted: on one thread of its own, or inline."""

    def __init__(self, mode: str = "thread") -> None:
        if mode not in PLANNERS:
            raise ValueError(f"planner must be one of {PLANNERS}, got {mode!r}")
        self.mode = mode
        self._pool: Optional[ThreadPoolExecutor] = None
        if mode == "thread":
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="frugal-planner")
            self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    def submit(self, modules: Sequence[FrugalShardedModuleMixin], features: Sequence[KeyedJaggedTensor]) -> "Future[ModulePlans]":
        """Plan one batch (``features``: snapshots, see :func:`snapshot`); the future holds the
        plans, or the error planning raised."""
        if self._pool is not None:
            return self._pool.submit(plan_modules, list(modules), list(features))
        done: "Future[ModulePlans]" = Future()
        try:
            done.set_result(plan_modules(modules, features))
        except Exception as e:  # raised where the plan is asked for, as the thread's would be
            done.set_exception(e)
        return done

    def close(self) -> None:
        """Stop the thread once the plans submitted are made (they are dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
