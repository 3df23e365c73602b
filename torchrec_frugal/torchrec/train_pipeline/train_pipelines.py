"""FrugalTrainPipeline: TorchRec's sparse-dist pipeline plus the lookahead window.

Frugal orders its background host writes by the step that next reads each row, so it must know
the ids of the next L batches. This pipeline reads the data loader L batches ahead and announces
each batch's ids, in training order, to the engines of every frugal module it pipelines. Without
it (a plain training loop) the engines stay exact: every write is flushed before it is read.

Each batch is also copied and planned as soon as it is read (:mod:`.batch_planner`: on a planner
thread; the loader is asked for the next batch once the copy is made), and the
pipeline hands the plan to that batch's forward, which then launches its gathers and pooling
without reading the batch's ids on the host.

A batch refused while it is planned (an id out of range, a feature missing; a batch that is not
planned is checked when read) is refused on every rank (:mod:`.batch_agreement`) and dropped from
the stream: ``progress()`` raises its error at the
step that would have trained it, having done nothing, and the next ``progress()`` trains the
next batch, every rank in step, as if the refused one had never been read.
"""
from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.train_pipeline.pipeline_context import In, Out, TrainPipelineContext
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ...config import check_int
from ...errors import FrugalError, FrugalInputError
from .batch_agreement import Agree, agreed_refusal, batch_agreement
from .batch_planner import BatchPlanner, ModulePlans, PlanJob
from ..embedding_types import FrugalShardedModuleMixin


@dataclass
class _ReadBatch:
    """A batch read from the data loader, and its plan once the frugal modules are known."""

    batch: Any
    index: int  # its place in the stream read
    plans: Optional[PlanJob] = None
    checked: bool = False  # not planned: checked on the training thread, and agreed on
    refused: Optional[BaseException] = None  # not planned: why it is refused on every rank
    unchecked: bool = False  # handed to TorchRec before it could be planned or checked (the first batch)
    # Errors of the refused batches read just before it: raised, one a step, before its step
    dropped_before: List[BaseException] = field(default_factory=list)


_COPY_TIMEOUT_S = 300.0  # a batch's copy takes milliseconds: a planner this late is stuck


class _LookaheadReader(Iterator[In]):
    """The data loader as the pipeline sees it: batches come out in order, read ahead."""

    def __init__(self, pipeline: "FrugalTrainPipeline[In, Out]", source: Iterator[In]) -> None:
        self.source = source
        self._pipeline = pipeline

    def __iter__(self) -> "_LookaheadReader[In]":
        return self

    def __next__(self) -> In:
        return self._pipeline._next_read_batch()


class FrugalTrainPipeline(TrainPipelineSparseDist[In, Out]):
    """TrainPipelineSparseDist that feeds the ids of the next L batches to the Frugal engines.

    ``progress(dataloader_iter)`` returns what ``TrainPipelineSparseDist.progress`` returns.

    Args:
        model: the DistributedModelParallel model.
        optimizer: as for TrainPipelineSparseDist (e.g. a CombinedOptimizer).
        device: as for TrainPipelineSparseDist.
        lookahead: batches read ahead, at most the engines' ``FrugalConfig.lookahead``
            (default: that value). 0 reads no further ahead than TorchRec does.
        **kwargs: passed to TrainPipelineSparseDist.

    Each batch read is planned on a planner thread, except where a frugal_row_wise table's
    announcement (a collective) makes each forward check its batch and compute its rows instead.
    A loop that wants no planning at all uses TorchRec's TrainPipelineSparseDist, which trains the
    same model, bit for bit (with no lookahead).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        lookahead: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        if lookahead is not None:  # refused here, before the model is touched
            check_int("lookahead", lookahead, 0)
        # TorchRec's public hook for the step's forward: each batch's plans go to the frugal modules
        # around it (around the user's own custom_model_fwd, if one is given).
        forward = kwargs.pop("custom_model_fwd", None) or model
        super().__init__(
            model, optimizer, device, custom_model_fwd=lambda batch: self._planned_forward(forward, batch), **kwargs
        )
        self._planner = BatchPlanner()
        self._planning = False  # whether batches are planned: known with the frugal modules
        self._pin = torch.device(device).type == "cuda"
        # Batches handed to TorchRec whose forward has not run, oldest first: the last
        # len(self.batches) of them are TorchRec's batches, in order.
        self._handed: Deque[_ReadBatch] = deque()
        self._requested_lookahead = lookahead
        self._window: Optional[int] = None  # resolved once the frugal modules are known
        self._reader: Optional[_LookaheadReader[In]] = None
        self._ahead: Deque[_ReadBatch] = deque()  # read from the source, not yet handed to the pipeline
        self._unannounced: Deque[_ReadBatch] = deque()  # read, ids not yet announced (a suffix of all read)
        self._source_exhausted = False
        self._last_read: Optional[_ReadBatch] = None  # the newest batch read from the source
        self._read_count = 0
        self._dropped_at_end: List[BaseException] = []  # refused batches after the last good one
        self._agree: Optional[Agree] = None  # the ranks' agreement on each batch read (None: one rank)
        self._frugal: Optional[List[FrugalShardedModuleMixin]] = None
        self._warned_stock = False  # warned once that the model has no frugal table

    def progress(self, dataloader_iter: Iterator[In]) -> Out:
        if self._reader is None or self._reader.source is not dataloader_iter:
            self._reader = _LookaheadReader(self, dataloader_iter)
            self._source_exhausted = False
            self._dropped_at_end.clear()
        return super().progress(self._reader)

    def fill_pipeline(self, dataloader_iter: Iterator[In]) -> None:
        super().fill_pipeline(dataloader_iter)
        # Runs at the start of every progress(): the step about to run gets announced, and the
        # step of a refused batch raises here, before anything of it has run.
        self._announce()
        self._raise_dropped()

    def start_sparse_data_dist(self, batch: Optional[In], context: TrainPipelineContext) -> None:
        # A batch is announced before its input dist starts (frugal_row_wise's reuses what the
        # announcement sent); this matters for the first batch, whose dist starts as the model is traced.
        self._announce()
        super().start_sparse_data_dist(batch, context)

    def detach(self) -> torch.nn.Module:
        """TorchRec's detach, once the planner has copied every batch read (a copy reads the
        batch through the pipelined modules' traced arguments, which detach takes away)."""
        self._wait_copied()
        return super().detach()

    def attach(self, *args: Any, **kwargs: Any) -> None:
        super().attach(*args, **kwargs)  # (model=None, sparse_dist=True) in the supported releases
        if not self._pipelined_modules:  # TorchRec traces the model again at the next progress()
            self._frugal = None

    # ------------------------------------------------------------------ reading ahead
    def _frugal_modules(self) -> Optional[List[FrugalShardedModuleMixin]]:
        """The pipelined frugal modules, once TrainPipelineSparseDist has rewritten the model."""
        if self._frugal is None and self._pipelined_modules:
            self._frugal = [
                m for m in self._pipelined_modules if isinstance(m, FrugalShardedModuleMixin) and m.frugal_lookups()
            ]
            if not self._frugal and not self._warned_stock:
                self._warned_stock = True
                warnings.warn(
                    "FrugalTrainPipeline: the model has no frugal table (every table is on a stock sharding), so it "
                    "trains as TrainPipelineSparseDist. FrugalShardingPlanner(hardware=...) chooses stock shardings "
                    "where it predicts them faster or where it does not offer Frugal (one rank on CPU; its "
                    "plan report says so); otherwise give "
                    "FrugalEmbeddingBagCollectionSharder (or FrugalEmbeddingCollectionSharder) to "
                    "DistributedModelParallel for frugal tables",
                    stacklevel=2,
                )
            window = min((m.lookahead() for m in self._frugal), default=0)
            if self._requested_lookahead is not None and self._frugal:  # no frugal table: nothing to read ahead for
                if self._requested_lookahead > window:
                    raise ValueError(
                        f"FrugalTrainPipeline(lookahead={self._requested_lookahead}) exceeds the engines' "
                        f"window FrugalConfig.lookahead={window}"
                    )
                window = self._requested_lookahead
            self._window = window
            self._planning = bool(self._frugal) and all(m.plans_anywhere() for m in self._frugal)
            if self._frugal and self._agree is None:
                pg, config = self._frugal[0].agreement_group()
                if pg is not None and dist.get_world_size(pg) > 1:
                    self._agree = batch_agreement(pg, config.timeout_s, config.shm_dir)
            for entry in list(self._handed) + list(self._ahead):  # read while TorchRec traced the model
                self._start_plan(entry)
        return self._frugal

    def _next_read_batch(self) -> In:
        assert self._reader is not None
        self._frugal_modules()
        # Keep the current step's batch and the next L read (TorchRec itself holds up to 3), and
        # with planned batches one more: the batch announced next is then planned during the
        # step before, not waited for when it is read.
        ahead = 1 if self._planning else 0
        dropped: List[BaseException] = []
        while True:
            need = max(1, (self._window or 0) + 1 + ahead - len(self.batches))
            while len(self._ahead) < need and not self._source_exhausted:
                self._wait_copied()  # the loader may refill the last batch's buffers once asked again
                batch = next(self._reader.source, None)
                if batch is None:
                    self._source_exhausted = True
                    break
                entry = self._last_read = _ReadBatch(batch, self._read_count)
                self._read_count += 1
                self._start_plan(entry)
                self._ahead.append(entry)
                if self._window is None or self._window > 0:  # None: model not traced yet
                    self._unannounced.append(entry)
            self._announce()
            if not self._ahead:
                self._dropped_at_end.extend(dropped)
                raise StopIteration
            entry = self._ahead.popleft()
            error = self._refusal(entry)
            if error is None:
                break
            dropped.append(error)  # refused on every rank: never handed to TorchRec
        entry.dropped_before.extend(dropped)
        entry.unchecked = self._frugal is None
        self._handed.append(entry)
        return entry.batch

    # ------------------------------------------------------------------ plans
    def _start_plan(self, entry: _ReadBatch) -> None:
        """Hand ``entry`` to the planner (copied, then planned), or check it here if batches are not
        planned, once the frugal modules are known (batches read before the model was traced are
        planned or checked when first needed); either way the ranks then agree on it."""
        modules = self._frugal_modules()
        if entry.plans is not None or entry.checked or not modules:
            return
        agree = self._agree
        if self._planning:
            entry.plans = self._planner.submit(modules, entry.batch, entry.index, self._module_features, self._pin, agree)
            return
        error: Optional[BaseException] = None
        try:
            for m in modules:
                m.check_batch(self._module_features(m, entry.batch))
        except FrugalInputError as e:
            error = e
        entry.checked = True
        entry.refused = agreed_refusal(entry.index, error, agree)

    def _wait_copied(self) -> None:
        """Wait until the planner has copied the newest batch read (its plan may come later)."""
        newest = self._last_read.plans if self._last_read is not None else None
        if newest is not None and not newest.copied.wait(_COPY_TIMEOUT_S):
            raise FrugalError(f"FrugalTrainPipeline: the planner did not copy a batch read within {_COPY_TIMEOUT_S:g} s")

    def _refusal(self, entry: _ReadBatch) -> Optional[BaseException]:
        """Why ``entry`` is refused on every rank (waiting for its plan), or None."""
        self._start_plan(entry)
        return entry.refused if entry.plans is None else entry.plans.plans.exception()

    def _raise_dropped(self) -> None:
        """Raise the error of a refused batch at the step that would have trained it."""
        if self._handed and self._handed[0].unchecked:
            first = self._handed[0]
            first.unchecked = False
            error = self._refusal(first)
            if error is not None:  # handed to TorchRec before the model was traced: take it all back
                self.batches.clear()
                self.contexts.clear()
                self._handed.popleft()
                self._ahead.extendleft(reversed(self._handed))
                self._handed.clear()
                raise error
        n = len(self.batches)
        if n == 0:
            pending = self._dropped_at_end
        elif n <= len(self._handed):
            pending = self._handed[-n].dropped_before
        else:
            return
        if pending:
            raise pending.pop(0)

    def _plans(self, entry: _ReadBatch) -> ModulePlans:
        """``entry``'s plans (waiting for the planner if it is behind); raises its planning error."""
        self._start_plan(entry)
        assert entry.plans is not None
        return entry.plans.plans.result()

    def _planned_forward(self, model_forward: Callable[[Any], Tuple[torch.Tensor, Out]], batch: Any) -> Tuple[torch.Tensor, Out]:
        """TorchRec's forward of batches[0], with that batch's plans handed to the frugal modules."""
        entry = self._take_handed()
        modules = self._frugal_modules()
        if entry is None or not self._planning or not modules:
            return model_forward(batch)
        for m, p in zip(modules, self._plans(entry)):
            m.use_plans(p)
        try:
            return model_forward(batch)
        finally:  # a module the forward did not call must not take this plan for another batch
            for m in modules:
                m.use_plans(None)

    def _take_handed(self) -> Optional[_ReadBatch]:
        """The read batch TorchRec forwards now (its batches[0]), dropping older ones TorchRec dropped."""
        n = len(self.batches)
        if n == 0 or len(self._handed) < n:
            self._handed.clear()
            return None
        while len(self._handed) > n:
            self._handed.popleft()
        return self._handed.popleft()

    def _announce(self) -> None:
        """Announce read batches, in order, as far as the engines' windows take them."""
        modules = self._frugal_modules()
        if modules is None:  # not traced yet: announce once the modules are known
            return
        if not modules or not self._window:
            self._unannounced.clear()
            return
        while self._unannounced and min(m.lookahead_capacity() for m in modules) > 0:
            # Every module's rows first: a bad batch raises before any engine is told about it.
            entry = self._unannounced[0]
            if self._refusal(entry) is not None:  # refused on every rank: never a step of the engines
                self._unannounced.popleft()
                continue
            if self._planning:
                for m, plans in zip(modules, self._plans(entry)):
                    m.announce_plans(plans)
            else:
                rows = [m.lookahead_rows(self._module_features(m, entry.batch)) for m in modules]
                for m, r in zip(modules, rows):
                    m.announce(r)
            self._unannounced.popleft()

    @staticmethod
    def _module_features(module: FrugalShardedModuleMixin, batch: Any) -> KeyedJaggedTensor:
        """The KJT ``module`` receives for ``batch``, found by TorchRec's traced arguments."""
        args, kwargs = module.forward.args.build_args_kwargs(batch)  # type: ignore[attr-defined]
        args, kwargs = module.preprocess_input(args, kwargs)  # type: ignore[attr-defined]
        found = [a for a in list(args) + list(kwargs.values()) if isinstance(a, KeyedJaggedTensor)]
        if len(found) != 1:
            raise RuntimeError(
                f"{type(module).__name__}: expected one KeyedJaggedTensor argument, found {len(found)}"
            )
        return found[0]
