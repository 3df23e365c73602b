"""The Frugal engine of one rank: the facade over host tables, owner store, lookahead, queue,
flushers and gate.

One engine serves a group of tables of equal dimension, fused into one row space. Per step s:

1. ``begin_step``: announce this rank's rows of step s (unless the lookahead already did), then
   wait at the gate: every owner has applied step s - 1 and has no pending host write read at s.
2. ``lookup``: rows this rank caches come from its device store, every other row from host.
3. ``apply_gradients``: stage this rank's coalesced gradients in shared memory sorted by owner;
   once all ranks staged, each owner sums the gradients of the rows it owns over ranks, applies
   the optimizer to its copy (cache slot, or a dynamic slot for uncached rows) and queues the
   host write with priority = the next step at which any rank reads the row from host.
4. Flushers copy queued rows (weights and optimizer state) to host, lowest priority first.

Steps 1-2 take a :class:`~.step_plan.StepPlan` made ahead (``plan_step``, any thread) instead of
rows, and step 3 only launches the gradients' copy to host and hands the step to the exchange
worker (a :class:`~torchrec_frugal.worker.Worker`): staging, summing, the owner's update, priorities and flushing run
there, and the next step's gate waits for that update.

No rank is special after set-up: the gate reads every owner's progress counters in shared memory.

On CUDA (``host_tables``, ``streams``) host rows are read and written through the device's mapping of the
shared segment (or a pinned staging copy), flushes run on a side stream ordered after the
update by an event, and an owner publishes its flush progress only once the flush's event is
reached, so a peer's gate opens exactly when the host rows it reads are current.

The parts, each in its module: ``local_group`` and ``shared_tables`` (set-up), ``owner_cache``
(ownership, the store), ``lookup_plan`` (a lookup's split into store and host reads),
``lookahead_feed`` (announce, publish, ingest), ``step_update`` (a step's update on the exchange
worker: ``gradient_staging``, ``gradient_exchange``, ``owner_update``, the step's metrics),
``flusher`` (queue, flusher threads, FLUSHED), ``gate`` (counters and waits), ``checkpoint_rows``
(host rows read and loaded between steps), ``rank_faults`` (a failure marked, raised, aborted).

Which thread runs each job of the lookahead and the update, per rank, as :mod:`.placement` resolves
it from the device (each choice can be set in the config); the training thread runs none of them (its gate hands what it waits for to their threads, :meth:`.StepUpdate.wait_gate`):

=======  ========================================================================================
job      thread
=======  ========================================================================================
publish  the lookahead worker on an accelerator; the exchange worker on a CPU device
ingest   the lookahead worker on an accelerator; the exchange worker on a CPU device
update   the exchange worker
flush    the flusher threads (rows ahead of need) and the exchange worker (the rows the next step
         reads, what is due while it waits, and all of it where there are no flushers: the
         default on a CPU device, whose cores the training keeps busy)
=======  ========================================================================================
"""
from __future__ import annotations

import threading
import time
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist

from ..config import FrugalConfig, OptimizerSpec, TableSpec
from .checkpoint_rows import CheckpointRows
from ..host.control_record import CLOSED, FAILED, STATUS
from ..errors import FrugalError, FrugalInputError
from .. import quiet_exit
from ..worker import Worker
from .flush.flusher import Flusher
from .gate import sync
from ..fused_rows import FusedRows
from ..host.rows import HostRows, RowsPart
from .host_tables import HostTables
from ..host.local_group import LocalGroup
from .lookahead.window import LookaheadWindow
from .lookahead.feed import LookaheadFeed
from .lookahead.ring import LookaheadRing
from .lookup_plan import plan_lookup
from ..metrics import StepMetrics, StepRecorder
from .optimizers import state_width
from .owner_cache import OwnerStore, ownership_from_presample
from .owner_update import OwnerUpdate
from .placement import Placement
from .flush.priority_queue import PendingQueue, make_queue
from .rank_faults import RankFaults
from ..host.shared_tables import InitWeights, open_shared_tables
from .step_plan import StepPlan
from .step_reads import StepReads
from .step_update import StepUpdate
from .streams import CopyStream, Streams, resolve_device

Rows = Union[torch.Tensor, StepPlan]
"""A step's rows as the caller has them: a tensor (checked on every call), or a plan made ahead."""


class FrugalEngine:
    """Frugal training of a group of equal-dim embedding tables on the ranks of one machine."""

    def __init__(
        self,
        tables: Sequence[TableSpec],
        optimizer: OptimizerSpec,
        config: Optional[FrugalConfig] = None,
        pg: Optional[dist.ProcessGroup] = None,
        device: Optional[torch.device] = None,
        init_weights: InitWeights = None,
        presample_counts: Optional[Sequence[torch.Tensor]] = None,
        seed: int = 0,
    ) -> None:
        if not tables:
            raise ValueError("FrugalEngine needs at least one table")
        dims = {t.embedding_dim for t in tables}
        if len(dims) != 1:
            raise ValueError(f"tables of one engine must share embedding_dim, got {sorted(dims)}")
        quiet_exit.arm()  # before any finalizer of this engine's users: they run before the exit's wait
        self.tables = list(tables)
        self.config = cfg = config or FrugalConfig()
        self.optimizer = optimizer
        self.device = resolve_device(device)
        self.dim = d = dims.pop()
        self.fused = FusedRows(self.tables)
        self.num_rows = n = self.fused.num_rows
        self.table_offsets = self.fused.offsets
        self.state_width = state_width(optimizer, d)
        self.lookahead = cfg.lookahead  # L

        # Set-up: the local ranks, then the shared memory (host tables, control block, mailboxes).
        self.group = LocalGroup(pg)
        self.rank, self.world_size = self.group.rank, self.group.world_size
        self.group.check_one_machine()
        self.shm_dir = self.group.agree_on_shm_dir(cfg.shm_dir)
        shared = open_shared_tables(self.group, self.shm_dir, self.tables, self.state_width, cfg, init_weights, seed)
        self.run_id, self.host_segment, self.control = shared.run_id, shared.segment, shared.control
        self.ring_record, self.grad_record = shared.ring_record, shared.grad_record
        self._faults = RankFaults(self.rank, self.control, self.run_id, self.shm_dir, cfg.timeout_s)
        # The host tables as checkpoints read and write them (CPU views into the segment) ...
        self.host_rows = HostRows(self.host_segment, self.fused)
        # ... and as the device reads and writes them (mapped or staged), and the flush stream.
        self.host = HostTables(
            {"weights": self.host_rows.weights, "state": self.host_rows.state},
            self.host_segment.base, self.device, cfg.host_path, self.host_segment,
        )  # fmt: skip
        self.streams = Streams(self.device)
        self.copies = CopyStream(self.device)  # a planned step's indices, moved ahead of the step

        # Ownership and the owner store (static cache of hot rows), filled from host.
        self.ownership = ownership_from_presample(
            self.tables, presample_counts, cfg.cache_ratio, self.world_size,
            lambda counts: self.group.all_reduce_sum(counts, self.device),
        )  # fmt: skip
        owner = self.ownership.owner
        self.placement = place = Placement.resolve(self.device, cfg)
        in_place = place.update_uncached_in_host
        # Dynamic slots hold this rank's uncached rows, unless those are updated in host in place.
        uncached_owned = None if in_place else int(np.count_nonzero((owner == self.rank) & ~self.ownership.cached))
        self.store = OwnerStore(n, self.ownership.cached_rows(self.rank), d, self.state_width, self.device, uncached_owned)
        self.owner_update = OwnerUpdate(optimizer, self.store, self.host, in_place)
        self.owner_update.reload()

        # The lookahead, the pending host writes of the rows this rank owns, the exchange.
        # The host reads a rank announces are those of rows an owner may hold a pending write of:
        # every row it does not cache itself, or, where owners update their uncached rows in place
        # in host memory (never pending), only the rows the other ranks cache.
        cached, mine = self.ownership.cached, owner == self.rank
        announced = cached & ~mine if in_place else ~(cached & mine)
        self.ring = LookaheadRing(self.ring_record, self.lookahead + 2, self.control, owner, announced)
        self.window = LookaheadWindow(n) if self.lookahead > 0 else None
        self.flusher = Flusher(
            make_queue(cfg.queue, n, self.lookahead), self.store, self.host, self.streams, self.control, self.window,
            cfg.flush_chunk_rows, cfg.max_deferred_rows, place.flush_workers, self._faults.fail_from_thread,
        )  # fmt: skip
        # Where backward hands a step's gradients over.
        self.exchange_worker = Worker(f"frugal-exchange-{self.rank}", self._faults.fail_from_thread)
        # The lookahead's publishing: a thread of its own on an accelerator, else the exchange worker.
        self.lookahead_feed = LookaheadFeed(
            self.lookahead, self.ring, self.window, self.flusher, self.control, place.lookahead_thread,
            self.exchange_worker,
            self._faults.guard, self._faults.raise_if_failed, self._faults.fail_from_thread,
        )  # fmt: skip
        self._faults.stopping(self.exchange_worker, self.flusher, self.lookahead_feed)
        self._recorder = StepRecorder()
        self._reads = StepReads(self.store, self.host, self.streams, self.copies, self._recorder, d, self.device)
        self._update = StepUpdate(
            self.rank, self.grad_record, self.control, owner, d, self.device, self.owner_update, self.store, self.flusher,
            self.lookahead_feed, self.streams, self.exchange_worker, self._recorder, self._faults.guard,
        )  # fmt: skip
        self._checkpoint = CheckpointRows(self.host_rows, self.owner_update, self.control, self.flush, self._faults.guard)
        self.step = 0
        # The optimizer's iteration (FBGEMM's ``iter``: forwards of the table's kernel) less the
        # steps: reads outside the steps count as forwards, and set_optimizer_iteration moves it.
        self._iteration_offset = 0
        self._in_step = False

    @property
    def queue(self) -> PendingQueue:
        """The pending host writes of the rows this rank owns (guarded by ``flusher.lock``)."""
        return self.flusher.queue

    @property
    def total_rows_flushed(self) -> int:
        return self.flusher.total_rows

    @property
    def total_bytes_flushed(self) -> int:
        return self.flusher.total_bytes

    @property
    def background_threads(self) -> List[threading.Thread]:
        """The threads working for this rank beside the training thread (flushers, lookahead and
        exchange workers)."""
        lookahead = self.lookahead_feed.worker
        return self.flusher.threads + [self.exchange_worker.thread] + ([] if lookahead is None else [lookahead.thread])

    # ------------------------------------------------------------------ input checks
    def rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """Fused rows of ``ids`` of table index ``table``; raises on ids out of range."""
        return self.fused.of_ids(table, ids)

    def rows_of_tables(self, tables: Sequence[int], counts: Sequence[int], ids: torch.Tensor) -> Optional[torch.Tensor]:
        """Fused rows of ``ids``, ``counts[k]`` consecutive ids of table index ``tables[k]``; None
        if an id is out of range or of a wrong dtype (:meth:`rows`, per table, names it)."""
        return self.fused.of_table_runs(tables, counts, ids)

    # ------------------------------------------------------------------ planning ahead
    def plan_step(self, rows: torch.Tensor) -> StepPlan:
        """Check a future step's unique ``rows`` and plan its lookup; any thread, any time before
        the step (the plan reads only what is fixed after set-up). The plan owns ``rows``."""
        rows = self.fused.check(rows, "planned batch")
        plan = plan_lookup(self.store.slot_of, self.store.num_static, rows.numpy(), self.host.sorted_reads, static_only=True)
        packed = plan.packed.pin_memory() if self.device.type == "cuda" else plan.packed
        (moved,), ready = self.copies.to_device([packed])
        assert moved is not None
        return StepPlan(rows, plan, moved, ready, id(self))

    def _rows(self, rows: Rows, what: str) -> Tuple[torch.Tensor, bool]:
        """(the rows, whether they came planned): a plan's rows were checked when it was made."""
        if isinstance(rows, StepPlan):
            if rows.engine != id(self):
                raise FrugalError(f"rank {self.rank}: {what}: a step plan made by another engine")
            return rows.rows, True
        return self.fused.check(rows, what), False

    # ------------------------------------------------------------------ the step
    def push_lookahead(self, rows: Rows) -> None:
        """Announce the rows of this rank's next future step (steps are pushed in order).

        The rows are checked here (a plan's when it was made); publishing them to the owners
        happens in the background.
        """
        self._faults.raise_if_failed()
        t0 = time.perf_counter()
        t = self.lookahead_feed.room(self.step)
        checked, planned = self._rows(rows, f"lookahead batch of step {t}")
        self.lookahead_feed.push(checked if planned else checked.clone())
        self._recorder.add("announce", time.perf_counter() - t0)

    @property
    def steps_ahead(self) -> int:
        """Steps announced by push_lookahead and not begun yet."""
        return self.lookahead_feed.steps_ahead

    def begin_step(self, rows: Rows) -> int:
        """Start the next step with this rank's rows; returns the step number once the gate opens."""
        self._faults.raise_if_failed()
        if self._in_step:
            raise FrugalError(f"rank {self.rank}: begin_step of step {self.step + 1} before apply_gradients of step {self.step}")
        s = self.step
        t0 = time.perf_counter()
        what = f"batch of step {s}"
        pushed = None if isinstance(rows, StepPlan) else self.lookahead_feed.pushed(s)
        if pushed is not None:  # the rows pushed for the step were checked then: the same ones need no check
            flat = self.fused.flat(rows, what)
            checked, planned = (pushed, False) if torch.equal(pushed, flat) else (self.fused.check(flat, what), False)
        else:
            checked, planned = self._rows(rows, what)
        ticket = self.lookahead_feed.begin(s, checked, owned=planned)
        if ticket is not None:
            self._update.ticket = ticket
        rec = self._recorder
        rec.step_t0 = time.perf_counter()
        rec.add("announce", rec.step_t0 - t0)
        rec.gate_wait_s = self._faults.guard(lambda: self._update.wait_gate(s))  # type: ignore[assignment]
        self._in_step = True
        return s

    @property
    def optimizer_iteration(self) -> int:
        """Forwards so far as FBGEMM's kernel counts them (its ``iter``): every step, and every read
        outside the steps; Adam's bias correction of the next step uses t = this + 1."""
        return self.step + self._iteration_offset

    def set_optimizer_iteration(self, iteration: int) -> None:
        """Make the next step's update run as the ``iteration + 1``-th forward (as FBGEMM's
        ``set_optimizer_step``), e.g. after loading a checkpoint of a run that had done ``iteration``."""
        self._iteration_offset = iteration - self.step

    def lookup(self, rows: Rows) -> torch.Tensor:
        """Current values of ``rows`` [n] -> [n, dim] (:mod:`.step_reads`). One outside a step (an
        evaluation between steps, after :meth:`flush`) counts as a forward in
        :attr:`optimizer_iteration`, as every forward of FBGEMM's kernel does."""
        self._faults.raise_if_failed()
        if not self._in_step:
            self._iteration_offset += 1
        if isinstance(rows, StepPlan) or not self._reads.checks_range:
            checked, _ = self._rows(rows, "lookup")
            out = self._reads.read(rows if isinstance(rows, StepPlan) else checked)
        else:  # the read's own pass over the rows checks their range
            flat = self.fused.flat(rows, "lookup")
            out = self._reads.read(flat)
            if out is None:
                self.fused.check(flat, "lookup")  # raises, naming the row
        return out

    def apply_gradients(self, unique_rows: Rows, grads: torch.Tensor, divide_by: int = 1) -> None:
        """This rank's summed gradient per unique row of the step; collective; ends the step.

        ``divide_by``: the gradients are divided by it first (TorchRec divides embedding gradients
        by the world size): on an accelerator before their copy to host, else where the update
        runs (the exchange worker), the same division either way."""
        self._faults.raise_if_failed()
        s = self.step
        if not self._in_step:
            raise FrugalError(f"rank {self.rank}: apply_gradients without begin_step (step {s})")
        what = f"gradients of step {s}"
        if isinstance(unique_rows, StepPlan):
            rows, _ = self._rows(unique_rows, what)
            repeated = None
        else:
            rows, repeated = self.fused.check_unique(unique_rows, what)
        if grads.shape != (rows.shape[0], self.dim):
            raise FrugalInputError(f"{what}: expected shape {(rows.shape[0], self.dim)}, got {tuple(grads.shape)}")
        if repeated is not None:  # the exchange sums one gradient a row and rank
            raise FrugalInputError(f"gradients of step {s}: row {repeated} appears more than once (sum a row's gradients first)")
        # Launch the copy to host, hand the step over (:mod:`.step_update`), and go on.
        self._update.hand_over(s, self.optimizer_iteration, rows, grads, self._reads.reads_done, divide_by)
        self._in_step = False
        self.step = s + 1

    def drain(self) -> None:
        """Wait until the exchange worker has done every step handed over; raises its failure."""
        self.exchange_worker.drain(self.config.timeout_s)
        self._faults.raise_if_failed()

    def take_metrics(self) -> List[StepMetrics]:
        """The metrics of every step whose update finished since the last call, oldest first.

        With the exchange worker a step's update finishes after ``apply_gradients`` returns, so
        :attr:`last_metrics` may still be the previous step's; this misses none."""
        return self._update.take_metrics()

    @property
    def last_metrics(self) -> Optional[StepMetrics]:
        """The metrics of the newest step whose update is done."""
        return self._update.last_metrics

    @property
    def in_step(self) -> bool:
        """Whether a step has begun whose gradients are not applied yet."""
        return self._in_step

    def flush(self, within_step: bool = False) -> None:
        """Collective: apply every pending host write of every rank; host then equals the caches.

        ``within_step``: inside a begun step, before a second read of it (a forward whose rows the
        gate did not cover): the step's own update has not run, so every write pending is older.
        """
        self.drain()
        if self._in_step and not within_step:
            raise FrugalError(f"rank {self.rank}: flush inside step {self.step}")
        self.exchange_worker.submit(lambda: self._faults.guard(self.flusher.drain))  # flushes run on their threads
        self.drain()
        self._faults.guard(lambda: sync(self.control, "flush"))

    # ------------------------------------------------------------------ checkpoints
    def read_rows(self, rows: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(weights, optimizer state) of ``rows`` (all rows if None) from host; call after flush()."""
        return self._checkpoint.read(rows)

    def host_block(self, lo: int, hi: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Live views of host rows [lo, hi) (:meth:`.CheckpointRows.block`); call after flush()."""
        return self._checkpoint.block(lo, hi)

    def reload_from_host(self) -> None:
        """Collective: the caches re-read from host (:meth:`.CheckpointRows.reload`)."""
        self._checkpoint.reload()

    def write_rows(self, parts: Sequence[RowsPart]) -> None:
        """Collective load of this rank's (rows, weights or None, state or None) parts
        (:meth:`.CheckpointRows.write`)."""
        self._checkpoint.write(parts)

    # ------------------------------------------------------------------ failure and shutdown
    def close(self) -> None:
        """Stop the flushers; pending writes are dropped unless flush() ran first."""
        if self._faults.closed:
            return
        if self._faults.failure is None:
            try:  # the steps handed over finish first (their peers wait for them)
                self.exchange_worker.drain(self.config.timeout_s)
            except FrugalError:
                pass  # closing anyway: whatever the worker still holds is dropped
        self._faults.stop_background()
        self.host.close()
        self.ring_record.unlink_own()  # a record grown during the run still has its name
        self.grad_record.unlink_own()
        if self.control.get(STATUS)[self.rank] != FAILED:
            self.control.set(STATUS, CLOSED)
        self._faults.closed = True

    def __enter__(self) -> "FrugalEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

