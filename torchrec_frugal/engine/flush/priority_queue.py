"""Priority queues of rows whose host copy has a pending write.

Each pending row carries a priority: the earliest future step at which some
rank reads it from host memory, or ``INF`` when no read is known within the
lookahead window of ``L`` steps.  Flusher threads pop the lowest priorities
first, and step ``s`` may start only once no pending row has priority ``<= s``.
Finite priorities therefore always lie in the sliding window
``[base, base + L + 1]``, where ``base`` grows by one per training step without
bound.

Two implementations share one interface:

* :class:`TwoLevelQueue` -- the paper's structure: a ring of ``L + 2`` buckets
  (one per finite priority in the window) plus an ``INF`` bucket, each a dense
  row array, so every operation is O(1) per row and vectorized per batch.
* :class:`HeapQueue` -- the ablation baseline: a binary heap with lazy
  invalidation, O(log n) per row and one Python-level step per row.

Neither queue is thread-safe; the caller serializes access with its own lock.
"""

from __future__ import annotations

import abc
import heapq

import numpy as np

from ...kernels.pending_queue import (ANY, BAD_PRIORITY, BAD_ROW, check_batch, lowest_slot, move_rows, pop_due,
                                      read_priorities)
from ...priorities import INF, QUEUE_KINDS

__all__ = ["PendingQueue", "TwoLevelQueue", "HeapQueue", "make_queue"]

_ABSENT = -1
_NOT_PENDING = np.array([_ABSENT], dtype=np.int64)  # the priority a removal gives every row
_INITIAL_CAPACITY = 64


class PendingQueue(abc.ABC):
    """Interface shared by both queue kinds.

    Rows are integers in ``[0, num_rows)``.  Both kinds keep the same
    bookkeeping for the window: ``_prio[row]`` (``-1`` when absent) and a count
    per ring slot (``priority % (lookahead + 2)``) plus one for ``INF``, so range
    checks, :meth:`advance` and :meth:`bucket_sizes` behave identically.
    """

    def __init__(self, num_rows: int, lookahead: int) -> None:
        if num_rows < 0:
            raise ValueError(f"num_rows must be >= 0, got {num_rows}")
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead}")
        self._num_rows = int(num_rows)
        self._lookahead = int(lookahead)
        self._slots = self._lookahead + 2  # finite priorities base .. base + lookahead + 1
        self._inf_slot = self._slots
        self._base = 0
        self._size = 0
        self._counts = np.zeros(self._slots + 1, dtype=np.int64)
        # One record per row: its priority (``-1`` when absent) and a word of the queue kind's
        # own (bucket position, heap sequence), in one cache line: an upsert reaches each row's
        # record once, usually from DRAM (the model ran since the previous step's upsert).
        self._row_state = np.full((self._num_rows, 2), _ABSENT, dtype=np.int64)
        self._prio = self._row_state[:, 0]
        # Scratch for O(k) duplicate detection: last write wins in fancy assignment.
        self._scratch = np.zeros(self._num_rows, dtype=np.int64)

    # ------------------------------------------------------------------ window
    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def lookahead(self) -> int:
        """L: finite priorities lie in ``[base, base + L + 1]``."""
        return self._lookahead

    @property
    def base(self) -> int:
        """Smallest finite priority accepted now (current step + 1)."""
        return self._base

    def advance(self, base: int) -> None:
        """Move the window start to ``base``.

        Refused when a finite bucket below the new base still holds rows: those
        writes would be due before the step that is about to start.
        """
        base = int(base)
        if base < self._base:
            raise ValueError(f"base may not decrease: {base} < current base {self._base}")
        if base > INF - self._slots:
            raise ValueError(f"base {base} leaves no room for the window below INF")
        for p in range(self._base, min(base, self._base + self._slots)):
            n = int(self._counts[p % self._slots])
            if n:
                raise ValueError(
                    f"cannot advance base to {base}: {n} row(s) still pending at priority {p}"
                )
        self._base = base

    def bucket_sizes(self) -> np.ndarray:
        """Row counts for priorities ``base .. base + lookahead + 1``, then ``INF``."""
        c, i = self._counts, self._base % self._slots
        return np.concatenate((c[i : self._slots], c[:i], c[self._slots :]))

    def __len__(self) -> int:
        return self._size

    @property
    def deferred(self) -> int:
        """Rows pending with priority ``INF`` (no read in the window)."""
        return int(self._counts[self._inf_slot])

    # ----------------------------------------------------------------- lookups
    def contains(self, rows: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``rows`` are pending."""
        return self._priorities(rows) != _ABSENT

    def priority_of(self, rows: np.ndarray) -> np.ndarray:
        """Current priority of each row, ``-1`` for absent rows."""
        return self._priorities(rows)

    # --------------------------------------------------------------- mutators
    @abc.abstractmethod
    def upsert(self, rows: np.ndarray, priorities: np.ndarray | int, assume_unique: bool = False) -> None:
        """Insert absent rows and move present rows to ``priorities``.

        ``rows`` must be unique within one call (ValueError otherwise: the
        wanted priority would be ambiguous; ``assume_unique=True`` skips that
        check, for callers whose rows are unique by construction).  Each priority
        is ``INF`` or lies in ``[base, base + lookahead + 1]``; a scalar is
        broadcast.  All checks run before any change, so a rejected call leaves
        the queue untouched.
        """

    def undefer(self, rows: np.ndarray, priority: int) -> None:
        """Give the (unique) ``rows`` that are pending with priority ``INF`` the finite
        ``priority``; the others stay as they are. Checked as :meth:`upsert` checks."""
        rows, prios, _ = self._check_upsert(rows, priority)
        deferred = rows[self._priorities(rows) == INF]
        if deferred.size:
            self.upsert(deferred, prios[0], assume_unique=True)

    @abc.abstractmethod
    def remove(self, rows: np.ndarray) -> None:
        """Remove the rows that are present; absent and repeated rows are ignored."""

    @abc.abstractmethod
    def pop_min(self, max_rows: int | None = None) -> tuple[np.ndarray, int]:
        """Pop up to ``max_rows`` rows (all if None) of the single lowest priority.

        Finite priorities come first in step order, then ``INF``.  Returns
        ``(rows, priority)``; ``(empty, INF)`` when the queue is empty.
        """

    @abc.abstractmethod
    def min_priority(self) -> int | None:
        """Lowest pending priority; ``None`` when empty, ``INF`` when only INF rows."""

    def pop_through(self, max_priority: int | None, max_rows: int) -> tuple[np.ndarray, int]:
        """Pop up to ``max_rows`` rows of the lowest priorities, lowest first, none above
        ``max_priority`` (None: any, ``INF`` included).

        Returns ``(rows, the lowest priority popped)``; ``(empty, INF)`` when none is due. One
        call takes every due bucket at once, so that a flusher copies one chunk a step instead
        of one a bucket.
        """
        parts: list[np.ndarray] = []
        first = INF
        left = int(max_rows)
        while left > 0:
            p = self.min_priority()
            if p is None or (max_priority is not None and p > max_priority):
                break
            rows, p = self.pop_min(left)
            first = min(first, p)
            parts.append(rows)
            left -= rows.size
        if not parts:
            return np.empty(0, dtype=np.int64), INF
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)), first

    # ---------------------------------------------------------------- helpers
    def _as_rows(self, rows: np.ndarray) -> np.ndarray:
        """A batch of row ids as a 1-D int64 array (its range not checked)."""
        arr = np.asarray(rows)
        if arr.ndim > 1:
            raise ValueError(f"rows must be 1-D, got shape {arr.shape}")
        arr = arr.reshape(-1)
        if arr.size == 0:
            return np.empty(0, dtype=np.int64)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"rows must be integers, got dtype {arr.dtype}")
        return arr.astype(np.int64, copy=False)

    def _check_bounds(self, lo: int, hi: int) -> None:
        """Raise unless the rows of a batch whose least is ``lo`` and greatest ``hi`` exist."""
        if lo < 0 or hi >= self._num_rows:
            bad = lo if lo < 0 else hi
            raise ValueError(f"row {int(bad)} out of range [0, {self._num_rows})")

    def _check_rows(self, rows: np.ndarray) -> np.ndarray:
        """Validate a batch of row ids and return it as a 1-D int64 array."""
        arr = self._as_rows(rows)
        if arr.size:
            self._check_bounds(arr.min(), arr.max())
        return arr

    def _priorities(self, rows: np.ndarray) -> np.ndarray:
        """The priority of each row (-1: absent), the rows checked in the same pass."""
        rows = self._as_rows(rows)
        out = np.empty(rows.size, dtype=np.int64)
        if rows.size:
            self._check_bounds(*read_priorities(rows, self._row_state, out))
        return out

    def _check_unique(self, rows: np.ndarray) -> None:
        idx = np.arange(rows.size, dtype=np.int64)
        self._scratch[rows] = idx
        dup = self._scratch[rows] != idx
        if dup.any():
            row = int(rows[np.argmax(dup)])
            raise ValueError(f"row {row} appears more than once in one upsert")

    def _dedupe(self, rows: np.ndarray) -> np.ndarray:
        idx = np.arange(rows.size, dtype=np.int64)
        self._scratch[rows] = idx
        keep = self._scratch[rows] == idx
        return rows if keep.all() else rows[keep]

    def _check_upsert(self, rows: np.ndarray, priorities: np.ndarray | int) -> tuple[np.ndarray, np.ndarray, int]:
        """Validate an upsert's rows, then its priorities against the window.

        Returns the rows (1-D int64) and the priorities as int64, ``priorities[i * stride]``
        being row i's: a scalar stays one value (stride 0) instead of being broadcast.
        """
        rows = self._as_rows(rows)
        arr = np.asarray(priorities)
        n = rows.size
        if arr.ndim != 0 and arr.shape != (n,):
            self._check_rows(rows)  # a bad row is reported first
            raise ValueError(f"priorities shape {arr.shape} does not match {n} rows")
        if n == 0:
            return rows, np.empty(0, dtype=np.int64), 1
        if arr.dtype.kind not in "iu":
            self._check_rows(rows)
            raise ValueError(f"priorities must be integers, got dtype {arr.dtype}")
        prios, stride = arr.reshape(-1).astype(np.int64, copy=False), int(arr.ndim != 0)
        lo, hi = self._base, self._base + self._slots - 1
        verdict, value = check_batch(rows, self._num_rows, prios, stride, lo, hi, INF)
        if verdict == BAD_ROW:
            self._check_bounds(value, value)
        if verdict == BAD_PRIORITY:
            raise ValueError(f"priority {value} is neither INF nor in the window [{lo}, {hi}]")
        return rows, prios, stride

    def _slot_of(self, priorities: np.ndarray) -> np.ndarray:
        return np.where(priorities == INF, self._inf_slot, priorities % self._slots)

    def _slot_scalar(self, priority: int) -> int:
        return self._inf_slot if priority == INF else priority % self._slots

    def _priority_of_slot(self, slot: int) -> int:
        """Priority held by ring ``slot`` in the current window (slot ``L+2`` is INF)."""
        if slot == self._inf_slot:
            return INF
        return self._base + (slot - self._base) % self._slots


class TwoLevelQueue(PendingQueue):
    """The paper's two-level queue: ring of priority buckets over dense row arrays.

    Level one maps a priority to a bucket (``priority % (lookahead + 2)``, or the
    INF bucket).  Level two stores each bucket as a dense row array plus count
    (segments of one pool), with each row's position in its bucket in its record,
    so insert (append), remove (swap-with-tail), move and pop (take the tail) are
    O(1) per row; a batch is one compiled pass (``kernels/pending_queue.py``).
    """

    def __init__(self, num_rows: int, lookahead: int) -> None:
        super().__init__(num_rows, lookahead)
        cap = min(_INITIAL_CAPACITY, max(self._num_rows, 1))
        self._cap = np.full(self._slots + 1, cap, dtype=np.int64)  # bucket s: room for _cap[s] rows
        self._start = np.arange(self._slots + 1, dtype=np.int64) * cap  # ... at _pool[_start[s]:]
        self._pool = np.empty(int(self._cap.sum()), dtype=np.int64)
        self._need = np.empty(self._slots + 1, dtype=np.int64)  # rows a batch needs room for, per bucket

    def upsert(self, rows: np.ndarray, priorities: np.ndarray | int, assume_unique: bool = False) -> None:
        rows, prios, stride = self._check_upsert(rows, priorities)
        if rows.size == 0:
            return
        if not assume_unique:
            self._check_unique(rows)
        self._move(rows, prios, stride)

    def bucket_rows(self) -> list[np.ndarray]:
        """Each bucket's rows in their order in the bucket (a pop takes the tail), for priorities
        ``base .. base + lookahead + 1``, then ``INF``: the queue's whole state with :meth:`priority_of`."""
        order = [(self._base + i) % self._slots for i in range(self._slots)] + [self._inf_slot]
        return [self._pool[self._start[s] : self._start[s] + self._counts[s]].copy() for s in order]

    def undefer(self, rows: np.ndarray, priority: int) -> None:
        rows, prios, stride = self._check_upsert(rows, priority)
        if rows.size:
            self._move(rows, prios, stride, only_from=INF)  # one pass: no priority_of first

    def remove(self, rows: np.ndarray) -> None:
        rows = self._check_rows(rows)
        if rows.size == 0:
            return
        self._move(self._dedupe(rows), _NOT_PENDING, 0)

    def pop_min(self, max_rows: int | None = None) -> tuple[np.ndarray, int]:
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be >= 1 or None, got {max_rows}")
        return self._pop(self._slots, True, 1, self._size if max_rows is None else int(max_rows))

    def pop_through(self, max_priority: int | None, max_rows: int) -> tuple[np.ndarray, int]:
        if max_priority is None or max_priority >= INF:
            due, inf_due = self._slots, True
        else:
            due, inf_due = min(max(max_priority - self._base + 1, 0), self._slots), False
        return self._pop(due, inf_due, self._slots + 1, int(max_rows))

    def min_priority(self) -> int | None:
        slot = lowest_slot(self._counts, self._base)
        return None if slot < 0 else self._priority_of_slot(slot)

    # ---------------------------------------------------------------- buckets
    def _pop(self, due: int, inf_due: bool, buckets: int, max_rows: int) -> tuple[np.ndarray, int]:
        """Pop up to ``max_rows`` rows of the priorities ``base .. base + due - 1`` (then ``INF``
        if ``inf_due``), lowest first, from at most ``buckets`` buckets, in one pass."""
        out = np.empty(max(0, min(max_rows, self._size)), dtype=np.int64)
        k, slot = pop_due(self._row_state, self._pool, self._start, self._counts, self._base, due, inf_due, buckets,
                          out)  # fmt: skip
        if slot < 0:
            return np.empty(0, dtype=np.int64), INF
        self._size -= k
        return out[:k], self._priority_of_slot(slot)

    def _move(self, rows: np.ndarray, prios: np.ndarray, stride: int, only_from: int = ANY) -> None:
        """Give unique, checked rows the priorities ``prios[i * stride]`` (-1: not pending); only
        those pending with ``only_from``, unless it is ``ANY``."""
        while True:
            done, added = move_rows(rows, prios, stride, only_from, INF, self._row_state, self._pool, self._start,
                                    self._cap, self._counts, self._need)  # fmt: skip
            if done:
                break
            self._grow()
        self._size += added

    def _grow(self) -> None:
        """Room for ``_need[s]`` rows in every bucket s: one that lacks it at least doubles (to at
        most the table's rows). The pool is copied bucket by bucket; positions stay."""
        short = self._need > self._cap
        cap = np.where(short, np.minimum(np.maximum(self._need, 2 * self._cap), self._num_rows), self._cap)
        start = np.zeros_like(self._start)
        np.cumsum(cap[:-1], out=start[1:])
        pool = np.empty(int(cap.sum()), dtype=np.int64)
        for s in range(self._slots + 1):
            n, old = int(self._counts[s]), int(self._start[s])
            pool[start[s] : start[s] + n] = self._pool[old : old + n]
        self._pool, self._start, self._cap = pool, start, cap


class HeapQueue(PendingQueue):
    """Ablation baseline: binary min-heap of ``(priority, seq, row)``.

    Moves and removals invalidate lazily: ``_seq[row]`` names the row's live
    entry and any other entry is skipped when it reaches the top.  The heap is
    rebuilt from live entries once stale ones outnumber them, bounding memory.
    """

    def __init__(self, num_rows: int, lookahead: int) -> None:
        super().__init__(num_rows, lookahead)
        self._seq = self._row_state[:, 1]
        self._next_seq = 0
        self._heap: list[tuple[int, int, int]] = []

    def upsert(self, rows: np.ndarray, priorities: np.ndarray | int, assume_unique: bool = False) -> None:
        rows, prios, stride = self._check_upsert(rows, priorities)
        if rows.size == 0:
            return
        if not assume_unique:
            self._check_unique(rows)
        if not stride:
            prios = np.full(rows.size, prios[0], dtype=np.int64)
        old = self._prio[rows]
        present = old != _ABSENT
        changed = old != prios
        self._count_add(self._slot_of(old[present & changed]), -1)
        rows, prios = rows[changed], prios[changed]
        self._count_add(self._slot_of(prios), +1)
        seqs = np.arange(self._next_seq, self._next_seq + rows.size, dtype=np.int64)
        self._next_seq += rows.size
        self._prio[rows] = prios
        self._seq[rows] = seqs
        self._size += int(np.count_nonzero(~present))
        heap = self._heap
        for entry in zip(prios.tolist(), seqs.tolist(), rows.tolist()):
            heapq.heappush(heap, entry)
        self._maybe_compact()

    def remove(self, rows: np.ndarray) -> None:
        rows = self._check_rows(rows)
        if rows.size == 0:
            return
        rows = self._dedupe(rows)
        old = self._prio[rows]
        present = old != _ABSENT
        rows, old = rows[present], old[present]
        self._count_add(self._slot_of(old), -1)
        self._prio[rows] = _ABSENT
        self._seq[rows] = _ABSENT
        self._size -= rows.size
        self._maybe_compact()

    def pop_min(self, max_rows: int | None = None) -> tuple[np.ndarray, int]:
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be >= 1 or None, got {max_rows}")
        priority = self.min_priority()  # also drops stale entries from the top
        if priority is None:
            return np.empty(0, dtype=np.int64), INF
        limit = self._size if max_rows is None else int(max_rows)
        heap, seq = self._heap, self._seq
        out: list[int] = []
        while heap and len(out) < limit and heap[0][0] == priority:
            _, s, row = heapq.heappop(heap)
            if seq[row] == s:
                out.append(row)
        rows = np.asarray(out, dtype=np.int64)
        self._prio[rows] = _ABSENT
        self._seq[rows] = _ABSENT
        self._counts[self._slot_scalar(priority)] -= rows.size
        self._size -= rows.size
        return rows, priority

    def min_priority(self) -> int | None:
        heap, seq = self._heap, self._seq
        while heap:
            p, s, row = heap[0]
            if seq[row] == s:
                return p
            heapq.heappop(heap)
        return None

    def _count_add(self, slots: np.ndarray, sign: int) -> None:
        if slots.size:
            self._counts += sign * np.bincount(slots, minlength=self._slots + 1)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * self._size + _INITIAL_CAPACITY:
            seq = self._seq
            self._heap = [e for e in self._heap if seq[e[2]] == e[1]]
            heapq.heapify(self._heap)


_QUEUES: dict[str, type[PendingQueue]] = {"two_level": TwoLevelQueue, "heap": HeapQueue}  # one per QUEUE_KINDS


def make_queue(kind: str, num_rows: int, lookahead: int) -> PendingQueue:
    """Build the queue named by ``kind`` (``"two_level"`` or ``"heap"``)."""
    try:
        cls = _QUEUES[kind]
    except KeyError:
        valid = sorted(QUEUE_KINDS)
        raise ValueError(f"unknown queue kind {kind!r}; valid kinds: {valid}") from None
    return cls(num_rows, lookahead)
