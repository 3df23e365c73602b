"""The Frugal engine of one rank: host tables, owner store, lookahead, queue, flushers and gate.

One engine serves a group of tables of equal dimension, fused into one row space. Per step s:

1. ``begin_step``: publish this rank's rows of step s (unless the lookahead already did), then
   wait at the gate: every owner has applied step s - 1 and has no pending host write read at s.
2. ``lookup``: rows this rank caches come from its device store, every other row from host.
3. ``apply_gradients``: stage this rank's coalesced gradients in shared memory sorted by owner;
   once all ranks staged, each owner sums the gradients of the rows it owns over ranks, applies
   the optimizer to its copy (cache slot, or a dynamic slot for uncached rows) and queues the
   host write with priority = the next step at which any rank reads the row from host.
4. Flushers copy queued rows (weights and optimizer state) to host, lowest priority first.

No rank is special after set-up: the gate reads every owner's progress counters in shared memory.

On CUDA (``device.py``) host rows are read and written through the device's mapping of the
shared segment (or a pinned staging copy), flushes run on a side stream ordered after the
update by an event, and an owner publishes its flush progress only once the flush's event is
reached, so a peer's gate opens exactly when the host rows it reads are current.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np
import torch
import torch.distributed as dist

from . import shm
from .config import FrugalConfig, OptimizerSpec, TableSpec
from .device import REACHED, HostTables, Streams, plan_lookup, resolve_device, to_device
from .errors import FrugalError, FrugalInputError, RankLostError
from .gate import (
    CLOSED,
    FAILED,
    FLUSHED,
    GRAD_ROWS,
    INF_STEP,
    INGESTED,
    PID,
    PUBLISHED,
    RING_ROWS,
    RUNNING,
    STAGED,
    STATUS,
    SYNC,
    UPDATED,
    Control,
    control_field,
    flushed_through,
)
from .host_memory import HostMemoryError, check_fits
from .lookahead import LookaheadWindow
from .lookahead_ring import LookaheadRing, merge_unique
from .lookahead_worker import LookaheadWorker
from .mailbox import Record, grads_layout, keep_ring, ring_layout
from .metrics import PHASES, StepMetrics
from .optimizers import apply_update, state_width
from .owner_cache import Ownership, OwnerStore, assign_ownership
from .priority_queue import INF, make_queue

T = TypeVar("T")
# Errors of set-up that every rank raises alike when one rank hits them.
_SETUP_ERRORS = {c.__name__: c for c in (FrugalError, FrugalInputError, HostMemoryError, shm.SharedMemoryFullError)}
InitWeights = Union[Sequence[torch.Tensor], Callable[[int, torch.Tensor], None], None]


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
        self.config = config or FrugalConfig()
        self.optimizer = optimizer
        self.device = resolve_device(device)
        self.dim = dims.pop()
        sizes = [t.num_embeddings for t in self.tables]
        self.num_rows = int(sum(sizes))
        self.table_offsets = torch.tensor([0] + list(np.cumsum(sizes)), dtype=torch.int64)
        self._offsets_np = self.table_offsets.numpy()
        self.state_width = state_width(optimizer, self.dim)
        self.lookahead = self.config.lookahead
        self._ring = self.lookahead + 2

        self._pg = pg
        self.rank, self.world_size = self._rank_world()
        self._check_one_machine()
        self.shm_dir = self._agree_on_shm_dir()

        # Shared memory: host tables + control block (rank 0), one mailbox per rank.
        n, d, s = self.num_rows, self.dim, self.state_width
        self._host_layout = shm.Layout(
            [
                shm.Field("weights", torch.float32, (n, d)),
                shm.Field("state", torch.float32, (n, s)),
                control_field(self.world_size),
            ]
        )
        # Mailbox records start at mailbox_rows rows (announced rows only with a lookahead).
        first = self.config.mailbox_rows
        self.ring_record = Record(
            "ring", lambda k: ring_layout(self._ring, self.world_size, k), keep_ring, RING_ROWS,
            self.shm_dir, first, n if self.lookahead > 0 else 0, self.rank, self.world_size,
        )
        self.grad_record = Record(
            "grads", lambda k: grads_layout(self.world_size, k, d), None, GRAD_ROWS,
            self.shm_dir, first, n, self.rank, self.world_size,
        )
        self.run_id = self._start_run(self.ring_record.nbytes() + self.grad_record.nbytes())
        self._create_shared_memory(init_weights, seed)
        self._host_w = self._host["weights"]
        self._host_s = self._host["state"]
        # Host rows as the device reads and writes them (mapped or staged), and the flush stream.
        self.host = HostTables(
            {"weights": self._host_w, "state": self._host_s},
            self._host.base,
            self.device,
            self.config.host_path,
            self._host,
        )
        self.streams = Streams(self.device)
        self._read_mark = REACHED  # reached once this step's host reads are done
        self._updated_mark = REACHED  # reached once the store holds every update applied so far

        # Ownership and the owner store (static cache of hot rows).
        self.ownership = self._ownership(presample_counts)
        self._owner_np = self.ownership.owner
        self._mine_cached = self.ownership.cached & (self._owner_np == self.rank)
        self.ring = LookaheadRing(
            self.ring_record,
            self._ring,
            self.control,
            self._owner_np,
            self._mine_cached,
        )
        cached_rows = self.ownership.cached_rows(self.rank)
        self.store = OwnerStore(self.num_rows, cached_rows, d, s, self.device)
        idx = torch.from_numpy(cached_rows)
        self.store.weights[: len(cached_rows)] = self._host_w.index_select(0, idx).to(self.device)
        self.store.state[: len(cached_rows)] = self._host_s.index_select(0, idx).to(self.device)

        # Pending host writes of the rows this rank owns.
        self._in_place = (
            self.device.type == "cpu" if self.config.update_uncached_in_host is None else self.config.update_uncached_in_host
        )
        self.queue = make_queue(self.config.queue, self.num_rows, self.lookahead)
        self.window = LookaheadWindow(self.num_rows) if self.lookahead > 0 else None
        self._version = np.zeros(self.num_rows, dtype=np.int64)
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._flush_mutex = threading.Lock()
        self._ingest_mutex = threading.Lock()  # one ingester at a time: steps arrive in order
        self._inflight: Optional[int] = None  # progress bound of the chunk being copied

        self.step = 0
        self._in_step = False
        self._next_push = 0
        self._pushed: Deque[Tuple[int, torch.Tensor]] = deque()
        self._gate_wait = 0.0
        self._exchange_wait = 0.0
        self._step_t0 = 0.0
        self._phase: Dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._lookups = 0
        self._hits = 0
        self._rows_flushed = 0
        self._bytes_flushed = 0
        self.total_rows_flushed = 0
        self.total_bytes_flushed = 0
        self.last_metrics: Optional[StepMetrics] = None

        self._failure: Optional[BaseException] = None
        self._stop = False
        self._closed = False
        self._flushers = [
            threading.Thread(target=self._flusher_loop, name=f"frugal-flusher-{self.rank}-{i}", daemon=True)
            for i in range(self.config.flush_workers)
        ]
        for t in self._flushers:
            t.start()
        use_worker = self.device.type != "cpu" if self.config.lookahead_worker is None else self.config.lookahead_worker
        self._worker = (
            LookaheadWorker(f"frugal-lookahead-{self.rank}", self.ring.publish, self._ingest_available, self._fail_from_thread)
            if self.lookahead > 0 and use_worker
            else None
        )

    @property
    def background_threads(self) -> List[threading.Thread]:
        """The threads working for this rank beside the training thread (flushers, lookahead worker)."""
        return self._flushers + ([self._worker.thread] if self._worker is not None else [])

    # ------------------------------------------------------------------ set-up helpers
    def _rank_world(self) -> Tuple[int, int]:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(self._pg), dist.get_world_size(self._pg)
        return 0, 1

    def _collective(self) -> bool:
        return self.world_size > 1

    def _gather_objects(self, obj: object) -> List[object]:
        if not self._collective():
            return [obj]
        out: List[object] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._pg)
        return out

    def _check_one_machine(self) -> None:
        hosts = self._gather_objects(socket.gethostname())
        if len(set(hosts)) > 1:
            raise FrugalError(
                "Frugal keeps the tables in the host memory of one machine, but the ranks run on "
                f"different hosts: {dict(enumerate(hosts))}"
            )

    def _agree_on_shm_dir(self) -> str:
        """The shared-memory directory, the same on every local rank (or an error naming both)."""
        dirs = self._all_or_none(lambda: shm.resolve_dir(self.config.shm_dir), [], "resolving the shared-memory directory")
        if len(set(dirs)) > 1:
            r = next(i for i, x in enumerate(dirs) if x != dirs[0])
            raise FrugalError(
                f"local ranks disagree on the shared-memory directory: rank 0 uses {dirs[0]!r}, rank {r} uses "
                f"{dirs[r]!r}; set the same FrugalConfig.shm_dir (or ${shm.ENV_DIR}) on every rank"
            )
        return str(dirs[0])

    def _start_run(self, mailbox_bytes: int) -> str:
        """Rank 0 sweeps stale segments, checks that the run fits the machine and names the run."""
        def name() -> Optional[str]:
            if self.rank != 0:
                return None
            shm.sweep_stale_segments(self.shm_dir)
            check_fits(self.tables, self.state_width, self._host_layout.nbytes, mailbox_bytes, self.world_size, self.shm_dir)
            return shm.new_run_id()

        return str(self._all_or_none(name, [], "checking the room for the host tables")[0])

    def _create_shared_memory(self, init_weights: InitWeights, seed: int) -> None:
        """Create and map every segment, then drop the names; a failure on any rank fails all, leaving nothing."""
        created: List[shm.SharedSegment] = []

        def host() -> None:
            if self.rank == 0:
                self._host = shm.SharedSegment.create(self._seg("host"), self._host_layout, self.shm_dir)
                created.append(self._host)
                self._init_host(init_weights, seed)

        def mailboxes() -> None:
            if self.rank != 0:
                self._host = shm.SharedSegment.attach(self._seg("host"), self._host_layout, self.shm_dir)
            self.control = c = Control(self._host["control"], self.rank, self.config.timeout_s)
            c.set(STAGED, -1)
            c.set(UPDATED, -1)
            c.set(FLUSHED, int(INF_STEP))
            c.set(PUBLISHED, -1)
            c.set(INGESTED, -1)
            c.set(SYNC, 0)
            c.set(STATUS, RUNNING)
            c.set(PID, os.getpid())
            created.append(self.ring_record.create_own(c, self._seg("")))
            created.append(self.grad_record.create_own(c, self._seg("")))

        def attach() -> None:
            self.ring_record.attach_peers()
            self.grad_record.attach_peers()

        self._all_or_none(host, created, "creating the host tables")
        self._all_or_none(mailboxes, created, "creating the mailboxes")
        self._all_or_none(attach, created, "mapping the mailboxes")
        for seg in created:  # every local rank has mapped it: the name can go
            seg.unlink()

    def _all_or_none(self, fn: Callable[[], T], created: List[shm.SharedSegment], what: str) -> List[T]:
        """Run a set-up step on every rank; returns each rank's result, or, if it failed anywhere,
        unlinks what this rank created and raises (the rank's own error, else one naming the rank)."""
        err: Optional[BaseException] = None
        result: Optional[T] = None
        try:
            result = fn()
        except Exception as e:  # every rank must learn of it, or the others wait at the next collective
            err = e
        outcomes = self._gather_objects(("ok", result) if err is None else (type(err).__name__, str(err)))
        failed = [r for r, (kind, _) in enumerate(outcomes) if kind != "ok"]
        if failed:
            for seg in created:
                seg.unlink()
            if err is not None:
                raise err
            kind, message = outcomes[failed[0]]
            cls = _SETUP_ERRORS.get(str(kind), FrugalError)
            raise cls(f"rank {self.rank}: {what} failed on rank {failed[0]}: {kind}: {message}")
        return [value for _, value in outcomes]

    def _seg(self, kind: str) -> str:
        return f"{shm.PREFIX}{self.run_id}_{kind}"

    def _init_host(self, init_weights: InitWeights, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self._host["state"].zero_()
        for t, spec in enumerate(self.tables):
            lo, hi = int(self._offsets_np[t]), int(self._offsets_np[t + 1])
            view = self._host["weights"][lo:hi]
            if init_weights is None:
                bound = (1.0 / spec.num_embeddings) ** 0.5
                view.uniform_(-bound, bound, generator=gen)
            elif callable(init_weights):
                init_weights(t, view)
            else:
                w = init_weights[t]
                if tuple(w.shape) != (spec.num_embeddings, spec.embedding_dim):
                    raise FrugalInputError(
                        f"table {spec.name!r}: initial weights have shape {tuple(w.shape)}, "
                        f"expected {(spec.num_embeddings, spec.embedding_dim)}"
                    )
                view.copy_(w.detach().to("cpu", torch.float32))

    def _ownership(self, presample_counts: Optional[Sequence[torch.Tensor]]) -> Ownership:
        if presample_counts is None:
            counts = torch.zeros(self.num_rows, dtype=torch.float64)
        else:
            if len(presample_counts) != len(self.tables):
                raise FrugalInputError(
                    f"presample_counts has {len(presample_counts)} tensors for {len(self.tables)} tables"
                )
            for spec, c in zip(self.tables, presample_counts):
                if c.numel() != spec.num_embeddings:
                    raise FrugalInputError(
                        f"table {spec.name!r}: presample counts have {c.numel()} entries, "
                        f"expected {spec.num_embeddings}"
                    )
            counts = torch.cat([c.reshape(-1).to(torch.float64) for c in presample_counts])
        if self._collective():
            if dist.get_backend(self._pg) == "nccl":  # NCCL reduces device tensors only
                counts = counts.to(self.device)
                dist.all_reduce(counts, group=self._pg)
                counts = counts.cpu()
            else:
                dist.all_reduce(counts, group=self._pg)
        per_table = [counts[int(self._offsets_np[t]) : int(self._offsets_np[t + 1])].numpy() for t in range(len(self.tables))]
        return assign_ownership(per_table, self.config.cache_ratio, self.world_size)

    # ------------------------------------------------------------------ input checks
    def rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """Fused rows of ``ids`` of table index ``table``; raises on ids out of range."""
        spec = self.tables[table]
        if ids.dtype not in (torch.int64, torch.int32):
            raise FrugalInputError(f"table {spec.name!r}: ids must be int32 or int64, got {ids.dtype}")
        ids = ids.reshape(-1).to("cpu", torch.int64)
        if ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= spec.num_embeddings:
                bad = lo if lo < 0 else hi
                raise FrugalInputError(
                    f"table {spec.name!r}: id {bad} is out of range [0, {spec.num_embeddings})"
                )
        return ids + self.table_offsets[table]

    def _check_rows(self, rows: torch.Tensor, what: str) -> torch.Tensor:
        if rows.dtype != torch.int64:
            raise FrugalInputError(f"{what}: rows must be int64, got {rows.dtype}")
        rows = rows.reshape(-1).to("cpu")
        if rows.numel():
            lo, hi = int(rows.min()), int(rows.max())
            if lo < 0 or hi >= self.num_rows:
                bad = lo if lo < 0 else hi
                where = (
                    f"before the first table {self.tables[0].name!r}"
                    if bad < 0
                    else f"beyond the last table {self.tables[-1].name!r}"
                )
                raise FrugalInputError(f"{what}: row {bad} is outside the fused tables [0, {self.num_rows}) ({where})")
        return rows

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise FrugalError(f"rank {self.rank}: a background thread (flusher or lookahead) failed: {self._failure!r}") from self._failure
        if self._closed:
            raise FrugalError(f"rank {self.rank}: the engine is closed")

    # ------------------------------------------------------------------ lookahead
    def push_lookahead(self, rows: torch.Tensor) -> None:
        """Announce the rows of this rank's next future step (steps are pushed in order).

        The rows are checked here; publishing them to the owners happens in the background.
        """
        self._raise_if_failed()
        t0 = time.perf_counter()
        t = self._next_push
        if t > self.step + self.lookahead:
            raise FrugalInputError(
                f"lookahead window full: step {t} pushed while step {self.step} runs with lookahead={self.lookahead}"
            )
        rows = self._check_rows(rows, f"lookahead batch of step {t}").clone()
        self._next_push = t + 1
        self._pushed.append((t, rows))
        self._announce(t, rows)
        self._phase["announce"] += time.perf_counter() - t0

    def _announce(self, t: int, rows: torch.Tensor) -> None:
        """Publish step t's rows to their owners: through the worker, or here and now."""
        if self._worker is not None:
            self._worker.announce(t, rows.numpy())
        elif self.lookahead > 0:
            self._guard(lambda: self.ring.publish(t, rows.numpy(), self._ingest_available))

    def _ingest_available(self, through: Optional[int] = None) -> bool:
        """Ingest every step all ranks have published (at least through ``through``); True if any."""
        if self.window is None:
            return False
        did = False
        with self._ingest_mutex:
            while True:
                t = self.window.last_step + 1  # only ingesters move it, and we are the one
                with self._lock:
                    room = t <= self.queue.base + self.lookahead + 1
                if not room:
                    return did
                if self.ring.published_through() < t:
                    if through is not None and t <= through:
                        raise FrugalError(f"rank {self.rank}: step {t} must be ingested but is not published")
                    return did
                rows_t = self.ring.collect(t)
                with self._lock:
                    newly = self.window.add_step(t, rows_t)
                    if newly.size:
                        deferred = newly[self.queue.priority_of(newly) == INF]
                        if deferred.size:
                            self.queue.upsert(deferred, t)
                    self.control.set(INGESTED, t)
                    self._publish_flushed()
                    self._work.notify_all()
                did = True

    def _ingest_while_waiting(self) -> bool:
        """What a wait of the training thread does meanwhile: fail if our own worker failed (the
        peers may be waiting for it), else ingest what is published."""
        self._raise_if_failed()
        return self._ingest_available()

    def _ingest_through(self, s: int) -> None:
        """Ingest at least through step s, which every rank announced; without a worker, all there is.

        The owner's window must run ahead of the steps its peers start: with deferred rows pending
        its progress counter says "current through the newest ingested step". The worker keeps it
        ahead in the background; without one, the update does, once per step.
        """
        if self.window is None:
            return
        behind = self.window.last_step < s
        if behind:
            self.control.wait(
                lambda: [r for r, p in enumerate(self.control.get(PUBLISHED)) if p < s],
                f"the lookahead of step {s} to be published",
                self._ingest_while_waiting,
            )
        if behind or self._worker is None:
            self._ingest_available(through=s)

    # ------------------------------------------------------------------ the step
    def begin_step(self, rows: torch.Tensor) -> int:
        """Start the next step with this rank's rows; returns the step number once the gate opens."""
        self._raise_if_failed()
        if self._in_step:
            raise FrugalError(f"rank {self.rank}: begin_step of step {self.step + 1} before apply_gradients of step {self.step}")
        s = self.step
        t0 = time.perf_counter()
        rows = self._check_rows(rows, f"batch of step {s}")
        if self._pushed:
            t, expected = self._pushed[0]
            if t != s:
                raise FrugalError(f"rank {self.rank}: lookahead holds step {t} while step {s} starts")
            if not torch.equal(expected, rows):
                raise FrugalInputError(
                    f"step {s}: the batch trained differs from the lookahead batch pushed for it "
                    f"({rows.numel()} rows trained, {expected.numel()} pushed)"
                )
            self._pushed.popleft()
        else:
            self._next_push = s + 1
            self._announce(s, rows.clone())
        self._step_t0 = time.perf_counter()
        self._phase["announce"] += self._step_t0 - t0
        self._gate_wait = self._guard(lambda: self._gate(s))
        self._in_step = True
        return s

    def _gate(self, s: int) -> float:
        def lagging() -> List[int]:
            updated = self.control.get(UPDATED)
            flushed = self.control.get(FLUSHED)
            return [o for o in range(self.world_size) if updated[o] < s - 1 or flushed[o] < s]

        def idle() -> bool:
            ingested = self._ingest_while_waiting()
            return self._flush_once(max_priority=s, wait=False) or ingested

        return self.control.wait(lagging, f"the gate of step {s}", idle)

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        """Current values of ``rows`` [n] -> [n, dim]: own store where held, host otherwise.

        One pass over the rows: the rows this rank holds are gathered from its device store and
        all others from host memory (on CUDA through the mapped host tables), both straight
        into the output.
        """
        self._raise_if_failed()
        t0 = time.perf_counter()
        rows = rows.reshape(-1)
        plan = plan_lookup(self.store.slot_of, self.store.num_static, rows.numpy(), self.host.sorted_reads)
        self._lookups += int(rows.shape[0])
        self._hits += plan.n_static_hits
        hit_pos, hit_slots, miss_pos, host_rows, expand = plan.parts(plan.packed.to(self.device, non_blocking=True))
        if plan.n_miss == 0:
            out = self.store.weights.index_select(0, hit_slots)
        else:
            from_host = self.host.read("weights", plan.parts()[3], host_rows)
            if plan.n_expand:  # each distinct host row was read once: place it where it is used
                from_host = from_host.index_select(0, expand)
            if plan.n_hit == 0:
                out = from_host
            else:
                out = torch.empty(rows.shape[0], self.dim, dtype=torch.float32, device=self.device)
                out.index_copy_(0, hit_pos, self.store.weights.index_select(0, hit_slots))
                out.index_copy_(0, miss_pos, from_host)
        self._read_mark = self.streams.mark()
        self._phase["lookup"] += time.perf_counter() - t0
        return out

    def apply_gradients(self, unique_rows: torch.Tensor, grads: torch.Tensor) -> None:
        """This rank's summed gradient per unique row of the step; collective; ends the step."""
        self._raise_if_failed()
        s = self.step
        if not self._in_step:
            raise FrugalError(f"rank {self.rank}: apply_gradients without begin_step (step {s})")
        rows = self._check_rows(unique_rows, f"gradients of step {s}")
        if grads.shape != (rows.shape[0], self.dim):
            raise FrugalInputError(
                f"gradients of step {s}: expected shape {(rows.shape[0], self.dim)}, got {tuple(grads.shape)}"
            )
        self._guard(lambda: self._update(s, rows, grads.detach().to("cpu", torch.float32)))
        self._in_step = False
        self.step = s + 1

    def _update(self, s: int, rows: torch.Tensor, grads: torch.Tensor) -> None:
        # Stage: this rank's gradients, sorted by owner, into its mailbox.
        t0 = time.perf_counter()
        r_np = rows.numpy()
        own = self._owner_np[r_np]
        order = torch.from_numpy(np.argsort(own, kind="stable"))
        k = r_np.shape[0]
        box = self.grad_record.own(k)
        torch.index_select(rows, 0, order, out=box["g_rows"][:k])
        torch.index_select(grads, 0, order, out=box["g_grads"][:k])
        box["g_counts"].copy_(torch.from_numpy(np.bincount(own, minlength=self.world_size)))
        # Owners write this step's updates to host once every rank staged: our host reads of the
        # step (device kernels on CUDA) must be done by then.
        self._read_mark.synchronize()
        self.control.set(STAGED, s)
        t1 = time.perf_counter()
        self._exchange_wait = self.control.wait(
            lambda: [r for r, v in enumerate(self.control.get(STAGED)) if v < s],
            f"gradients of step {s}",
            idle=lambda: self._flush_once(max_priority=self._background_bound(), wait=False),
        )
        # Sum the gradients of the rows this rank owns over all ranks (rank order: deterministic).
        t2 = time.perf_counter()
        parts_r, parts_g = [], []
        for r in range(self.world_size):
            b = self.grad_record.segment(r)
            counts = b["g_counts"].numpy()
            lo = int(counts[: self.rank].sum())
            hi = lo + int(counts[self.rank])
            parts_r.append(b["g_rows"][lo:hi].numpy())
            parts_g.append(b["g_grads"][lo:hi])
        # Sorted runs (one per rank) when the callers pass sorted rows, as the TorchRec glue does.
        u_np, inv = merge_unique(parts_r)
        summed = torch.zeros(u_np.shape[0], self.dim, dtype=torch.float32).index_add_(
            0, torch.from_numpy(inv), torch.cat(parts_g)
        )
        t3 = time.perf_counter()
        self._phase["exchange"] += (t1 - t0) + (t3 - t2)

        self._ingest_through(s)
        with self._lock:
            if self.window is not None:
                self.window.retire(s)
            self.queue.advance(s + 1)
            t4 = time.perf_counter()
            store = self.store
            slots = store.slot_of[u_np]
            if self._in_place:
                u_np, slots, summed = self._update_in_place(s, u_np, slots, summed)
            fresh = slots < 0
            if fresh.any():
                new_rows = u_np[fresh]
                new_slots = store.alloc(new_rows)
                nr = torch.from_numpy(new_rows)
                nr_dev, ns = to_device([nr, torch.from_numpy(new_slots)], self.device)
                store.weights.index_copy_(0, ns, self.host.read("weights", nr, nr_dev))
                store.state.index_copy_(0, ns, self.host.read("state", nr, nr_dev))
                slots[fresh] = new_slots
            sl = torch.from_numpy(slots).to(self.device)
            w = store.weights.index_select(0, sl)
            st = store.state.index_select(0, sl)
            apply_update(self.optimizer, w, st, summed.to(self.device), s)
            store.weights.index_copy_(0, sl, w)
            store.state.index_copy_(0, sl, st)
            self._updated_mark = self.streams.mark()
            t5 = time.perf_counter()
            self._version[u_np] += 1
            if self.window is None:
                prio: Union[int, np.ndarray] = s + 1
            else:
                prio = self.window.priorities(u_np)
            if u_np.size:
                self.queue.upsert(u_np, prio)
            self._publish_flushed()
            self.control.set(UPDATED, s)
        t6 = time.perf_counter()
        self._phase["update"] += t5 - t4
        self._phase["bookkeeping"] += (t4 - t3) + (t6 - t5)
        # Rows the very next step reads from host are due at once: write them on this thread
        # instead of waiting for a flusher to be scheduled; the flushers take what can wait.
        while self._flush_once(max_priority=s + 1):
            pass
        with self._work:
            m = self.queue.min_priority()
            if m is not None and m != INF:
                self._work.notify()
        self._phase["flush"] += time.perf_counter() - t6
        self._record_metrics(s)

    def _update_in_place(
        self, s: int, rows: np.ndarray, slots: np.ndarray, grads: torch.Tensor
    ) -> Tuple[np.ndarray, np.ndarray, torch.Tensor]:
        """Update clean uncached rows straight in host memory; return the rows the store holds.

        Used where the owner's device memory is host memory (a CPU device): staging such a row
        in a dynamic slot and flushing it later would copy it twice for nothing. It is safe:
        nobody reads these rows from host before this rank publishes UPDATED for step s, and
        no flusher touches a row that has no pending write.
        """
        held = slots >= 0
        if held.all():
            return rows, slots, grads
        here = torch.from_numpy(rows[~held])
        w = self._host_w.index_select(0, here)
        st = self._host_s.index_select(0, here)
        apply_update(self.optimizer, w, st, grads.index_select(0, torch.from_numpy(np.flatnonzero(~held))), s)
        self._host_w.index_copy_(0, here, w)
        if self.state_width:
            self._host_s.index_copy_(0, here, st)
        keep = np.flatnonzero(held)
        return rows[keep], slots[keep], grads.index_select(0, torch.from_numpy(keep))

    def _record_metrics(self, s: int) -> None:
        with self._lock:
            depth = self.queue.bucket_sizes()
            pending = len(self.queue)
            rows_f, bytes_f = self._rows_flushed, self._bytes_flushed
            self._rows_flushed = self._bytes_flushed = 0
        self.last_metrics = StepMetrics(
            step=s,
            gate_wait_s=self._gate_wait,
            exchange_wait_s=self._exchange_wait,
            step_time_s=time.perf_counter() - self._step_t0,
            queue_depth=depth,
            pending_rows=pending,
            rows_flushed=rows_f,
            bytes_flushed=bytes_f,
            lookups=self._lookups,
            cache_hits=self._hits,
            dynamic_rows=self.store.dynamic_in_use,
            phase_s=self._phase,
        )
        self._lookups = self._hits = 0
        self._phase = dict.fromkeys(PHASES, 0.0)

    # ------------------------------------------------------------------ flushing
    def _publish_flushed(self) -> None:
        """Publish the step through which this owner's host rows are current (lock held)."""
        last = self.window.last_step if self.window is not None else self.step
        self.control.set(FLUSHED, flushed_through(self.queue.min_priority(), last, self._inflight))

    def _flush_once(self, max_priority: Optional[int], wait: bool = True) -> bool:
        """Copy one chunk of the lowest-priority pending rows to host; False if nothing was due.

        Chunks of one rank are copied one at a time: a row re-queued while its older copy is in
        flight must not have its newer copy overtaken by the older one.
        """
        if not self._flush_mutex.acquire(blocking=wait):
            return False
        try:
            with self._lock:
                m = self.queue.min_priority()
                if m is None or (max_priority is not None and m > max_priority):
                    return False
                # One priority per chunk: while in flight a chunk bounds the published progress,
                # and one that also took rows due later would hold back the rows due next.
                rows, prio = self.queue.pop_min(self.config.flush_chunk_rows)
                rows.sort()  # written in row order: the order host memory and the link like
                # While in flight these rows are still stale on host: a finite chunk bounds the
                # published progress by prio - 1, an INF chunk by the window as it is now.
                self._inflight = prio - 1 if prio != INF else self.window.last_step  # type: ignore[union-attr]
                slots = self.store.slot_of[rows]
                snapshot = self._version[rows].copy()
                src_w, src_s = self.store.weights, self.store.state
                after = self._updated_mark
            r = torch.from_numpy(rows)
            # On CUDA: a side stream, after the updates on the device, never behind the step's
            # kernels; only this thread waits for the copy (the rows are on host once it returns).
            with self.streams.side(after):
                r_dev, sl = to_device([r, torch.from_numpy(slots)], self.device)
                self.host.write("weights", r, src_w.index_select(0, sl), r_dev)
                if self.state_width:
                    self.host.write("state", r, src_s.index_select(0, sl), r_dev)
                copied = self.streams.mark()
            copied.synchronize()
            with self._lock:
                # Rows updated meanwhile were re-queued by the update and stay pending.
                done = rows[self._version[rows] == snapshot]
                dynamic = done[self.store.slot_of[done] >= self.store.num_static]
                if dynamic.size:
                    self.store.release(dynamic)
                self._inflight = None
                self._publish_flushed()
                nbytes = int(rows.shape[0]) * (self.dim + self.state_width) * 4
                self._rows_flushed += int(rows.shape[0])
                self._bytes_flushed += nbytes
                self.total_rows_flushed += int(rows.shape[0])
                self.total_bytes_flushed += nbytes
            return True
        finally:
            self._flush_mutex.release()

    def _background_bound(self) -> int:
        """Highest priority worth flushing ahead of need: any finite one, INF only past the bound.

        Rows nobody reads within the window stay deferred, so that further updates of the same
        row coalesce into one host write, until too many of them wait.
        """
        with self._lock:
            deferred = self.queue.deferred
        return INF if deferred > self.config.max_deferred_rows else INF - 1

    def _flusher_loop(self) -> None:
        try:
            while not self._stop:
                if not self._flush_once(max_priority=self._background_bound()):
                    with self._work:
                        if not self._stop:
                            self._work.wait(timeout=0.01)
        except BaseException as e:  # surfaced to the training thread at its next call
            self._fail_from_thread(e)

    def _fail_from_thread(self, e: BaseException) -> None:
        """A background thread failed: the training thread raises it at its next call."""
        self._failure = e
        self.control.fail(self.rank)

    def flush(self) -> None:
        """Collective: apply every pending host write of every rank; host then equals the caches."""
        self._raise_if_failed()
        if self._in_step:
            raise FrugalError(f"rank {self.rank}: flush inside step {self.step}")

        def drain() -> None:
            while True:
                while self._flush_once(max_priority=None):
                    pass
                with self._lock:
                    if len(self.queue) == 0 and self._inflight is None:
                        return
                time.sleep(1e-4)

        self._guard(drain)
        self._guard(lambda: self._sync("flush"))

    def _sync(self, what: str) -> None:
        mine = int(self.control.get(SYNC)[self.rank]) + 1
        self.control.set(SYNC, mine)
        self.control.wait(lambda: [r for r, v in enumerate(self.control.get(SYNC)) if v < mine], what)

    # ------------------------------------------------------------------ checkpoints
    def read_rows(self, rows: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(weights, optimizer state) of ``rows`` (all rows if None) from host; call after flush()."""
        if rows is None:
            return self._host_w.clone(), self._host_s.clone()
        rows = self._check_rows(rows, "read_rows")
        return self._host_w[rows], self._host_s[rows]

    def host_block(self, lo: int, hi: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views (no copy) of host rows [lo, hi): weights and optimizer state; call after flush().

        Live memory, like a parameter: the next step's updates show in it.
        """
        if not 0 <= lo <= hi <= self.num_rows:
            raise FrugalInputError(f"host_block: rows [{lo}, {hi}) outside the fused tables [0, {self.num_rows})")
        return self._host.rows("weights", lo, hi), self._host.rows("state", lo, hi)

    def write_rows(self, parts: Sequence[Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]]) -> None:
        """Collective load of this rank's (rows, weights or None, state or None) parts: each rank
        writes its own rows (no row from two ranks) to host, then every rank refreshes the rows its
        store holds. None keeps the current values.

        Host memory is shared: once flushed, any rank may write any row in place, so a load never
        moves a row between ranks (a rank loads its block of a checkpoint, nothing more). A part
        whose values already are those host rows (a checkpoint loaded into the views that
        :meth:`host_block` handed out) is not copied onto itself.
        """
        checked = []
        for rows, weights, state in parts:
            rows = self._check_rows(rows, "write_rows")
            if weights is not None and weights.shape != (rows.shape[0], self.dim):
                raise FrugalInputError(f"write_rows: weights of shape {tuple(weights.shape)} for {rows.shape[0]} rows of dim {self.dim}")
            if state is not None and state.shape != (rows.shape[0], self.state_width):
                raise FrugalInputError(f"write_rows: state of shape {tuple(state.shape)}, expected {(rows.shape[0], self.state_width)}")
            checked.append((rows, weights, state))
        self.flush()  # nothing pending, no flusher writing: host is free to write
        for rows, weights, state in checked:
            for host, values in ((self._host_w, weights), (self._host_s, state)):
                if values is not None and values.numel() and not _aliases(host, rows, values):
                    host.index_copy_(0, rows, values.to("cpu", torch.float32))
        self._guard(lambda: self._sync("write_rows"))
        held = np.flatnonzero(self.store.slot_of >= 0)
        idx = torch.from_numpy(held)
        sl = torch.from_numpy(self.store.slot_of[held]).to(self.device)
        self.store.weights.index_copy_(0, sl, self._host_w.index_select(0, idx).to(self.device))
        self.store.state.index_copy_(0, sl, self._host_s.index_select(0, idx).to(self.device))
        self._guard(lambda: self._sync("write_rows refresh"))

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

    def _abort(self, cause_rank: int) -> None:
        self.control.fail(cause_rank)
        self._stop_flushers()
        shm.remove_run_segments(self.run_id, self.shm_dir)

    def _stop_flushers(self) -> None:
        with self._lock:
            self._stop = True
            self._work.notify_all()
        if self._worker is not None:
            self._worker.stop(self.config.timeout_s)
        for t in self._flushers:
            if t is not threading.current_thread():
                t.join(timeout=self.config.timeout_s)

    def close(self) -> None:
        """Stop the flushers; pending writes are dropped unless flush() ran first."""
        if self._closed:
            return
        self._stop_flushers()
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


def _aliases(host: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether ``values`` is the very memory of host rows ``rows`` (consecutive, in order)."""
    first = int(rows[0])
    return (
        values.is_contiguous()
        and values.data_ptr() == host[first].data_ptr()
        and bool(torch.equal(rows, torch.arange(first, first + rows.shape[0])))
    )
