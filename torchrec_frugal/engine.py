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
worker (``exchange_worker.py``): staging, summing, the owner's update, priorities and flushing run
there, and the next step's gate waits for that update.

No rank is special after set-up: the gate reads every owner's progress counters in shared memory.

On CUDA (``host_tables``, ``streams``) host rows are read and written through the device's mapping of the
shared segment (or a pinned staging copy), flushes run on a side stream ordered after the
update by an event, and an owner publishes its flush progress only once the flush's event is
reached, so a peer's gate opens exactly when the host rows it reads are current.

The parts, each in its module: ``local_group`` and ``shared_tables`` (set-up), ``owner_cache``
(ownership, the store), ``lookahead_feed`` (announce, publish, ingest), ``gradient_exchange``,
``owner_update`` (the optimizer on owned rows), ``flusher`` (queue, flusher threads, FLUSHED),
``gate`` (counters and waits).

Which thread runs each job of the lookahead and the update, per rank (the owner first, then where
the same job also runs today, serialised by a lock, until each runs on its owner only):

=======  ==============================================  ================================================
job      owner                                           also run by
=======  ==============================================  ================================================
publish  the lookahead worker on an accelerator, the     nobody
         exchange worker on a CPU device
ingest   the lookahead worker on an accelerator, the     the training thread while its gate waits, and
         exchange worker (at the update) on a CPU       a publish waiting for a ring slot (its thread)
update   the exchange worker                             nobody
flush    the flusher threads (none: the exchange        the exchange worker (the rows the next step
         worker)                                         reads, and while it waits for its peers), the
                                                         training thread at a gate without flushers and
                                                         in :meth:`FrugalEngine.flush`
=======  ==============================================  ================================================
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Deque, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from . import shm
from .config import FrugalConfig, OptimizerSpec, TableSpec
from .control_record import CLOSED, FAILED, FLUSHED, STATUS, UPDATED
from .errors import FrugalError, FrugalInputError, RankLostError
from .exchange_worker import ExchangeWorker
from .flusher import Flusher
from .gate import lagging_owners, sync
from .fused_rows import FusedRows
from .gradient_exchange import GradientExchange
from .gradient_staging import GradientStaging
from .host_rows import HostRows, RowsPart
from .host_tables import HostTables
from .local_group import LocalGroup
from .lookahead import LookaheadWindow
from .lookahead_feed import LookaheadFeed
from .lookahead_ring import LookaheadRing
from .lookup_plan import plan_lookup
from .metrics import WAIT_GATE, StepMetrics, StepRecorder
from .optimizers import state_width
from .owner_cache import OwnerStore, ownership_from_presample
from .owner_update import OwnerUpdate
from .priority_queue import PendingQueue, make_queue
from .shared_tables import InitWeights, open_shared_tables
from .step_plan import StepPlan
from .streams import REACHED, CopyStream, Marker, Streams, resolve_device

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
        # The host tables as checkpoints read and write them (CPU views into the segment) ...
        self.host_rows = HostRows(self.host_segment, self.fused)
        # ... and as the device reads and writes them (mapped or staged), and the flush stream.
        self.host = HostTables(
            {"weights": self.host_rows.weights, "state": self.host_rows.state},
            self.host_segment.base, self.device, cfg.host_path, self.host_segment,
        )  # fmt: skip
        self.streams = Streams(self.device)
        self.copies = CopyStream(self.device)  # a planned step's indices, moved ahead of the step
        self._reads_done: Marker = REACHED  # reached once this step's host reads are done

        # Ownership and the owner store (static cache of hot rows), filled from host.
        self.ownership = ownership_from_presample(
            self.tables, presample_counts, cfg.cache_ratio, self.world_size,
            lambda counts: self.group.all_reduce_sum(counts, self.device),
        )  # fmt: skip
        owner = self.ownership.owner
        self.store = OwnerStore(n, self.ownership.cached_rows(self.rank), d, self.state_width, self.device)
        in_place = self.device.type == "cpu" if cfg.update_uncached_in_host is None else cfg.update_uncached_in_host
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
        self._failure: Optional[BaseException] = None
        self._closed = False
        on_cpu = self.device.type == "cpu"  # the training threads keep the cores busy: no helper threads
        workers = (0 if on_cpu else 1) if cfg.flush_workers is None else cfg.flush_workers
        self.flusher = Flusher(
            make_queue(cfg.queue, n, self.lookahead), self.store, self.host, self.streams, self.control, self.window,
            cfg.flush_chunk_rows, cfg.max_deferred_rows, workers, self._fail_from_thread,
        )  # fmt: skip
        # Where backward hands a step's gradients over.
        self.exchange_worker = ExchangeWorker(f"frugal-exchange-{self.rank}", self._fail_from_thread)
        # The lookahead's publishing: a thread of its own on an accelerator, else the exchange worker.
        self.lookahead_feed = LookaheadFeed(
            self.lookahead, self.ring, self.window, self.flusher, self.control, self.device,
            self.exchange_worker,
            self._guard, self._raise_if_failed, self._fail_from_thread,
        )  # fmt: skip
        self.exchange = GradientExchange(self.grad_record, self.control, owner, d)
        # The exchange worker's last hand-off the next step's gate waits for: the previous step's
        # update, or the step's own publish when begin_step announces it.
        self._gate_ticket = 0
        self._grad_staging = GradientStaging(d, self.device)

        self.step = 0
        # The optimizer's iteration (FBGEMM's ``iter``: forwards of the table's kernel) less the
        # steps: reads outside the steps count as forwards, and set_optimizer_iteration moves it.
        self._iteration_offset = 0
        self._in_step = False
        self._recorder = StepRecorder()
        self.last_metrics: Optional[StepMetrics] = None  # of the newest step whose update is done
        self._finished: Deque[StepMetrics] = deque(maxlen=4096)  # since the last take_metrics()

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

    def _raise_if_failed(self) -> None:
        failure = self._failure
        if failure is not None:
            message = f"rank {self.rank}: a background thread (flusher, lookahead or exchange) failed: {failure!r}"
            if isinstance(failure, RankLostError):  # a peer was lost: say so, as the training thread would
                raise RankLostError(message, failure.lost_rank) from failure
            raise FrugalError(message) from failure
        if self._closed:
            raise FrugalError(f"rank {self.rank}: the engine is closed")

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
        self._raise_if_failed()
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
        self._raise_if_failed()
        if self._in_step:
            raise FrugalError(f"rank {self.rank}: begin_step of step {self.step + 1} before apply_gradients of step {self.step}")
        s = self.step
        t0 = time.perf_counter()
        checked, planned = self._rows(rows, f"batch of step {s}")
        ticket = self.lookahead_feed.begin(s, checked, owned=planned)
        if ticket is not None:
            self._gate_ticket = ticket
        rec = self._recorder
        rec.step_t0 = time.perf_counter()
        rec.add("announce", rec.step_t0 - t0)
        rec.gate_wait_s = self._guard(lambda: self._gate(s))  # type: ignore[assignment]
        self._in_step = True
        return s

    def _gate(self, s: int) -> float:
        worker = self.exchange_worker

        def idle() -> bool:
            ingested = self.lookahead_feed.ingest_while_waiting()
            ticket = self._gate_ticket  # this rank's own update of step s - 1 (and its flush)
            if not worker.done_through(ticket):
                return worker.wait_done(2e-3, ticket) or ingested
            if self.flusher.threads or self.control.get(FLUSHED)[self.rank] >= s:
                return ingested  # the flushers write what step s reads (or none of it is pending here)
            return self.flusher.flush_once(max_priority=s, wait=False) or ingested

        return self.control.wait(WAIT_GATE, lambda: lagging_owners(self.control, s), f"the gate of step {s}", idle)

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
        """Current values of ``rows`` [n] -> [n, dim]: own store where held, host otherwise.

        One pass over the rows: the rows this rank holds are gathered from its device store and
        all others from host memory (on CUDA through the mapped host tables), both straight
        into the output. A plan made ahead (:meth:`plan_step`) saves the split and the copy of
        its indices: the training thread then only launches the gathers.

        A lookup outside a step (an evaluation between steps, after :meth:`flush`) counts as a
        forward in :attr:`optimizer_iteration`, as every forward of FBGEMM's kernel does.
        """
        self._raise_if_failed()
        if not self._in_step:
            self._iteration_offset += 1
        t0 = time.perf_counter()
        if isinstance(rows, StepPlan):
            self._rows(rows, "lookup")
            plan, n = rows.lookup, rows.num_rows
            self.copies.use([rows.packed], rows.ready)
            moved = rows.packed
        else:
            rows = rows.reshape(-1).to("cpu")  # row ids are host-side bookkeeping (begin_step takes them so too)
            plan, n = plan_lookup(self.store.slot_of, self.store.num_static, rows.numpy(), self.host.sorted_reads), int(rows.shape[0])
            moved = plan.packed.to(self.device, non_blocking=True)
        self._recorder.lookups += n
        self._recorder.cache_hits += plan.n_static_hits
        hit_pos, hit_slots, miss_pos, host_rows, expand = parts = plan.parts(moved)
        if plan.n_miss == 0:
            out = self.store.weights.index_select(0, hit_slots)
        else:
            from_host = self.host.read("weights", (parts if moved is plan.packed else plan.parts())[3], host_rows)
            if plan.n_expand:  # each distinct host row was read once: place it where it is used
                from_host = from_host.index_select(0, expand)
            if plan.n_hit == 0:
                out = from_host
            else:
                out = torch.empty(n, self.dim, dtype=torch.float32, device=self.device)
                out.index_copy_(0, hit_pos, self.store.weights.index_select(0, hit_slots))
                out.index_copy_(0, miss_pos, from_host)
        self._reads_done = self.streams.mark()
        self._recorder.add("lookup", time.perf_counter() - t0)
        return out

    def apply_gradients(self, unique_rows: Rows, grads: torch.Tensor, divide_by: int = 1) -> None:
        """This rank's summed gradient per unique row of the step; collective; ends the step.

        ``divide_by``: the gradients are divided by it first (TorchRec divides embedding gradients
        by the world size): on an accelerator before their copy to host, else where the update
        runs (the exchange worker), the same division either way."""
        self._raise_if_failed()
        s = self.step
        if not self._in_step:
            raise FrugalError(f"rank {self.rank}: apply_gradients without begin_step (step {s})")
        rows, _ = self._rows(unique_rows, f"gradients of step {s}")
        if grads.shape != (rows.shape[0], self.dim):
            raise FrugalInputError(
                f"gradients of step {s}: expected shape {(rows.shape[0], self.dim)}, got {tuple(grads.shape)}"
            )
        reads_done, iteration = self._reads_done, self.optimizer_iteration
        if grads.requires_grad:
            grads = grads.detach()
        if divide_by != 1 and grads.device.type != "cpu":
            grads, divide_by = grads / divide_by, 1
        # Launch the copy to host, hand the step over, and go on.
        host_grads, copied = self._grad_staging.to_host(grads)
        self._gate_ticket = self.exchange_worker.submit(
            lambda: self._update_handed_over(s, iteration, rows, host_grads, copied, reads_done, divide_by)
        )
        self._in_step = False
        self.step = s + 1

    def _update_handed_over(
        self, s: int, iteration: int, rows: torch.Tensor, grads: torch.Tensor, copied: Marker, reads_done: Marker,
        divide_by: int,
    ) -> None:
        """Step ``s``'s update on the exchange worker, once its gradients are on the host."""
        copied.synchronize()
        self._guard(lambda: self._update(s, iteration, rows, grads, reads_done, divide_by))

    def drain(self) -> None:
        """Wait until the exchange worker has done every step handed over; raises its failure."""
        self.exchange_worker.drain(self.config.timeout_s)
        self._raise_if_failed()

    def _update(
        self, s: int, iteration: int, rows: torch.Tensor, grads: torch.Tensor, reads_done: Marker, divide_by: int
    ) -> None:
        flusher, feed, rec = self.flusher, self.lookahead_feed, self._recorder
        t0 = time.perf_counter()
        if divide_by != 1:
            grads = grads / divide_by
        self.exchange.stage(s, rows, grads, reads_done)
        t1 = time.perf_counter()
        rec.exchange_wait_s = self.exchange.wait_staged(
            s, idle=lambda: flusher.flush_once(max_priority=flusher.background_bound(), wait=False)
        )
        t2 = time.perf_counter()
        owned, summed = self.exchange.sum_owned()
        t3 = time.perf_counter()
        rec.add("exchange", (t1 - t0) + (t3 - t2))

        feed.ingest_through(s)
        with flusher.lock:
            feed.retire(s)
            flusher.queue.advance(s + 1)
            t4 = time.perf_counter()
            held = self.owner_update.apply(iteration, owned, summed)
            updated = self.streams.mark()
            t5 = time.perf_counter()
            flusher.queue_writes(held, feed.priorities(held, s), updated)
            self.control.set(UPDATED, s)
        t6 = time.perf_counter()
        rec.add("update", t5 - t4)
        rec.add("bookkeeping", (t4 - t3) + (t6 - t5))
        flusher.flush_due(s)
        rec.add("flush", time.perf_counter() - t6)
        self.last_metrics = rec.finish(s, flusher.take_counts(), self.store.dynamic_in_use, self.control.take_waited())
        self._finished.append(self.last_metrics)

    def take_metrics(self) -> List[StepMetrics]:
        """The metrics of every step whose update finished since the last call, oldest first.

        With the exchange worker a step's update finishes after ``apply_gradients`` returns, so
        :attr:`last_metrics` may still be the previous step's; this misses none."""
        out = []
        while self._finished:
            out.append(self._finished.popleft())
        return out

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
        self._guard(self.flusher.drain)
        self._guard(lambda: sync(self.control, "flush"))

    # ------------------------------------------------------------------ checkpoints
    def read_rows(self, rows: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(weights, optimizer state) of ``rows`` (all rows if None) from host; call after flush()."""
        return self.host_rows.read(rows)

    def host_block(self, lo: int, hi: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views (no copy) of host rows [lo, hi): weights and optimizer state; call after flush().

        Live memory, like a parameter: the next step's updates show in it, and what is written into
        it between steps reaches the caches at :meth:`reload_from_host`.
        """
        return self.host_rows.block(lo, hi)

    def reload_from_host(self) -> None:
        """Collective, between steps, with no step since the last flush: every rank re-reads the rows
        its store holds from host once all ranks got here, so that host rows written in place
        through the views :meth:`host_block` handed out (a checkpoint loaded into a state_dict)
        reach the caches. Costs a read of the rank's cached rows and a barrier."""
        self.flush()  # the barrier: every rank has written its rows (nothing is pending)
        self.owner_update.reload()

    def write_rows(self, parts: Sequence[RowsPart]) -> None:
        """Collective load of this rank's (rows, weights or None, state or None) parts: each rank
        writes its own rows (no row from two ranks) to host, then every rank refreshes the rows its
        store holds. None keeps the current values.

        Host memory is shared: once flushed, any rank may write any row in place, so a load never
        moves a row between ranks (a rank loads its block of a checkpoint, nothing more). A part
        whose values already are those host rows (a checkpoint loaded into the views that
        :meth:`host_block` handed out) is not copied onto itself.
        """
        checked = self.host_rows.check(parts)
        self.flush()  # nothing pending, no flusher writing: host is free to write
        self.host_rows.write(checked)
        self._guard(lambda: sync(self.control, "write_rows"))
        self.owner_update.reload()
        self._guard(lambda: sync(self.control, "write_rows refresh"))

    # ------------------------------------------------------------------ failure and shutdown
    def _guard(self, fn: Callable[[], object]) -> object:
        """Run a step of the protocol; any failure marks this rank failed so peers stop waiting."""
        try:
            return fn()
        except FrugalInputError:
            raise
        except RankLostError as e:
            self._abort(e.lost_rank)
            raise
        except BaseException:
            self._abort(self.rank)
            raise

    def _fail_from_thread(self, e: BaseException) -> None:
        """A background thread failed: the training thread raises it at its next call."""
        self._failure = e
        self.control.fail(self.rank)

    def _abort(self, cause_rank: int) -> None:
        self.control.fail(cause_rank)
        self._stop_background()
        shm.remove_run_segments(self.run_id, self.shm_dir)

    def _stop_background(self) -> None:
        self.exchange_worker.stop(self.config.timeout_s)
        self.flusher.stop(self.config.timeout_s)
        self.lookahead_feed.stop(self.config.timeout_s)

    def close(self) -> None:
        """Stop the flushers; pending writes are dropped unless flush() ran first."""
        if self._closed:
            return
        if self._failure is None:
            try:  # the steps handed over finish first (their peers wait for them)
                self.exchange_worker.drain(self.config.timeout_s)
            except FrugalError:
                pass  # closing anyway: whatever the worker still holds is dropped
        self._stop_background()
        self.host.close()
        self.ring_record.unlink_own()  # a record grown during the run still has its name
        self.grad_record.unlink_own()
        if self.control.get(STATUS)[self.rank] != FAILED:
            self.control.set(STATUS, CLOSED)
        self._closed = True

    def __enter__(self) -> "FrugalEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

