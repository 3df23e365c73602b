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

from ...priorities import INF, QUEUE_KINDS

__all__ = ["PendingQueue", "TwoLevelQueue", "HeapQueue", "make_queue"]

_ABSENT = -1
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
        order = (self._base + np.arange(self._slots, dtype=np.int64)) % self._slots
        return np.concatenate([self._counts[order], self._counts[self._inf_slot:]])

    def __len__(self) -> int:
        return self._size

    @property
    def deferred(self) -> int:
        """Rows pending with priority ``INF`` (no read in the window)."""
        return int(self._counts[self._inf_slot])

    # ----------------------------------------------------------------- lookups
    def contains(self, rows: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``rows`` are pending."""
        return self._prio[self._check_rows(rows)] != _ABSENT

    def priority_of(self, rows: np.ndarray) -> np.ndarray:
        """Current priority of each row, ``-1`` for absent rows."""
        return self._prio[self._check_rows(rows)]

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
    def _check_rows(self, rows: np.ndarray) -> np.ndarray:
        """Validate a batch of row ids and return it as a 1-D int64 array."""
        arr = np.asarray(rows)
        if arr.ndim > 1:
            raise ValueError(f"rows must be 1-D, got shape {arr.shape}")
        arr = arr.reshape(-1)
        if arr.size == 0:
            return np.empty(0, dtype=np.int64)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"rows must be integers, got dtype {arr.dtype}")
        lo, hi = arr.min(), arr.max()
        if lo < 0 or hi >= self._num_rows:
            bad = lo if lo < 0 else hi
            raise ValueError(f"row {int(bad)} out of range [0, {self._num_rows})")
        return arr.astype(np.int64, copy=False)

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

    def _check_priorities(self, priorities: np.ndarray | int, n: int) -> np.ndarray:
        """Validate priorities against the window; return them as int64 of length n."""
        arr = np.asarray(priorities)
        if arr.ndim == 0:
            arr = np.full(n, arr, dtype=arr.dtype)
        if arr.shape != (n,):
            raise ValueError(f"priorities shape {arr.shape} does not match {n} rows")
        if n == 0:
            return np.empty(0, dtype=np.int64)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"priorities must be integers, got dtype {arr.dtype}")
        lo, hi = self._base, self._base + self._slots - 1
        bad = (arr != INF) & ((arr < lo) | (arr > hi))
        if bad.any():
            p = int(arr[np.argmax(bad)])
            raise ValueError(f"priority {p} is neither INF nor in the window [{lo}, {hi}]")
        return arr.astype(np.int64, copy=False)

    def _slot_of(self, priorities: np.ndarray) -> np.ndarray:
        return np.where(priorities == INF, self._inf_slot, priorities % self._slots)

    def _slot_scalar(self, priority: int) -> int:
        return self._inf_slot if priority == INF else priority % self._slots

    def _priority_of_slot(self, slot: int) -> int:
        """Priority held by ring ``slot`` in the current window (slot ``L+2`` is INF)."""
        if slot == self._inf_slot:
            return INF
        return self._base + (slot - self._base) % self._slots

    def _lowest_slot(self) -> int | None:
        """Scan at most ``lookahead + 2`` counts from ``base``, then INF."""
        for i in range(self._slots):
            slot = (self._base + i) % self._slots
            if self._counts[slot]:
                return slot
        return self._inf_slot if self._counts[self._inf_slot] else None


class TwoLevelQueue(PendingQueue):
    """The paper's two-level queue: ring of priority buckets over dense row arrays.

    Level one maps a priority to a bucket (``priority % (lookahead + 2)``, or the
    INF bucket).  Level two stores each bucket as a dense row array plus count,
    with ``pos[row]`` giving a row's index in its bucket, so insert (append),
    remove (swap-with-tail), move and pop (take the tail) are O(1) per row.
    """

    def __init__(self, num_rows: int, lookahead: int) -> None:
        super().__init__(num_rows, lookahead)
        self._pos = self._row_state[:, 1]
        cap = min(_INITIAL_CAPACITY, max(self._num_rows, 1))
        self._buckets = [np.empty(cap, dtype=np.int64) for _ in range(self._slots + 1)]

    def upsert(self, rows: np.ndarray, priorities: np.ndarray | int, assume_unique: bool = False) -> None:
        rows = self._check_rows(rows)
        prios = self._check_priorities(priorities, rows.size)
        if rows.size == 0:
            return
        if not assume_unique:
            self._check_unique(rows)
        old = self._prio[rows]
        present = old != _ABSENT
        moved = present & (old != prios)
        if moved.any():
            self._detach(rows[moved], self._slot_of(old[moved]))
        fresh = ~present | moved
        if not fresh.all():
            rows, prios = rows[fresh], prios[fresh]
            if rows.size == 0:
                return
        self._attach(rows, self._slot_of(prios))
        self._prio[rows] = prios
        self._size += int(np.count_nonzero(~present))

    def remove(self, rows: np.ndarray) -> None:
        rows = self._check_rows(rows)
        if rows.size == 0:
            return
        rows = self._dedupe(rows)
        old = self._prio[rows]
        present = old != _ABSENT
        rows, old = rows[present], old[present]
        if rows.size == 0:
            return
        self._detach(rows, self._slot_of(old))
        self._prio[rows] = _ABSENT
        self._size -= rows.size

    def pop_min(self, max_rows: int | None = None) -> tuple[np.ndarray, int]:
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be >= 1 or None, got {max_rows}")
        slot = self._lowest_slot()
        if slot is None:
            return np.empty(0, dtype=np.int64), INF
        n = int(self._counts[slot])
        k = n if max_rows is None else min(n, int(max_rows))
        out = self._buckets[slot][n - k : n].copy()
        self._counts[slot] = n - k
        self._prio[out] = _ABSENT
        self._size -= k
        return out, self._priority_of_slot(slot)

    def min_priority(self) -> int | None:
        slot = self._lowest_slot()
        return None if slot is None else self._priority_of_slot(slot)

    # ---------------------------------------------------------------- buckets
    def _groups(self, slots: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
        """Split a batch by bucket; ``None`` index means the whole batch."""
        first = int(slots[0])
        if (slots == first).all():
            return [(first, None)]
        # numpy's stable sort of 16-bit keys is a radix sort: five times as fast as of int64 ones
        keys = slots.astype(np.uint16) if self._slots < 1 << 16 else slots
        order = np.argsort(keys, kind="stable")
        sizes = np.bincount(slots, minlength=self._slots + 1)
        ends = np.cumsum(sizes)
        return [(int(s), order[ends[s] - sizes[s] : ends[s]]) for s in np.flatnonzero(sizes)]

    def _attach(self, rows: np.ndarray, slots: np.ndarray) -> None:
        """Append rows to the tails of their buckets."""
        for slot, idx in self._groups(slots):
            part = rows if idx is None else rows[idx]
            n, k = int(self._counts[slot]), part.size
            buf = self._buckets[slot]
            if n + k > buf.size:
                grown = np.empty(min(max(n + k, 2 * buf.size), self._num_rows), dtype=np.int64)
                grown[:n] = buf[:n]
                self._buckets[slot] = buf = grown
            buf[n : n + k] = part
            self._pos[part] = np.arange(n, n + k, dtype=np.int64)
            self._counts[slot] = n + k

    def _detach(self, rows: np.ndarray, slots: np.ndarray) -> None:
        """Remove present, unique rows by swap-with-tail: O(k) for k rows."""
        for slot, idx in self._groups(slots):
            part = rows if idx is None else rows[idx]
            n, k = int(self._counts[slot]), part.size
            m = n - k
            buf = self._buckets[slot]
            pos = self._pos[part]
            in_tail = pos >= m
            holes = pos[~in_tail]
            if holes.size:
                removed_tail = np.zeros(k, dtype=bool)
                removed_tail[pos[in_tail] - m] = True
                survivors = buf[m:n][~removed_tail]
                buf[holes] = survivors
                self._pos[survivors] = holes
            self._counts[slot] = m


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
        rows = self._check_rows(rows)
        prios = self._check_priorities(priorities, rows.size)
        if rows.size == 0:
            return
        if not assume_unique:
            self._check_unique(rows)
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
