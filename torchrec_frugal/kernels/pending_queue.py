"""The two-level pending queue's batch operations, each one compiled pass over the batch.

The queue (``engine/flush/priority_queue.py``) keeps one record per row, ``state[r] = (priority
or -1, position in its bucket)``, and its buckets as segments of one pool: bucket ``s`` holds
``counts[s]`` rows at ``pool[start[s]:]``, room for ``cap[s]``. A batch of moves detaches the
rows leaving each bucket at once (the bucket's surviving tail rows fill their holes, in order),
then appends the rows entering each bucket in the batch's order: what the numpy twins do with
one vectorized call per bucket, here without a sort and reading each row's record once. A pop
takes the tails of the due buckets, lowest priority first, in one call however many buckets.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from .compiled import kernel

ABSENT = -1  # the priority of a row that is not pending
ANY = -2  # move_rows' ``only_from`` that moves a row whatever its priority
OK, BAD_ROW, BAD_PRIORITY = 0, 1, 2  # check_batch's verdicts


def _check_twin(
    rows: np.ndarray, num_rows: int, prios: np.ndarray, stride: int, lo: int, hi: int, inf: int
) -> Tuple[int, int]:
    low, high = int(rows.min()), int(rows.max())
    if low < 0 or high >= num_rows:
        return BAD_ROW, low if low < 0 else high
    p = prios if stride else prios[:1]
    bad = (p != inf) & ((p < lo) | (p > hi))
    if bad.any():
        return BAD_PRIORITY, int(p[np.argmax(bad)])
    return OK, 0


@kernel(_check_twin)
def check_batch(
    rows: np.ndarray, num_rows: int, prios: np.ndarray, stride: int, lo: int, hi: int, inf: int
) -> Tuple[int, int]:
    """Checks a non-empty batch: ``(BAD_ROW, the least row if negative, else the greatest)`` if
    a row is outside ``[0, num_rows)``, else ``(BAD_PRIORITY, the first one)`` if a priority
    (``prios[i * stride]``) is neither ``inf`` nor in ``[lo, hi]``, else ``(OK, 0)``."""
    low = rows[0]
    high = rows[0]
    for i in range(rows.shape[0]):
        low = min(low, rows[i])
        high = max(high, rows[i])
    if low < 0 or high >= num_rows:
        return BAD_ROW, low if low < 0 else high
    for i in range(rows.shape[0] if stride else 1):
        p = prios[i]
        if p != inf and (p < lo or p > hi):
            return BAD_PRIORITY, p
    return OK, 0


def _read_twin(rows: np.ndarray, state: np.ndarray, out: np.ndarray) -> Tuple[int, int]:
    low, high = int(rows.min()), int(rows.max())
    if low >= 0 and high < state.shape[0]:
        out[:] = state[rows, 0]
    return low, high


@kernel(_read_twin)
def read_priorities(rows: np.ndarray, state: np.ndarray, out: np.ndarray) -> Tuple[int, int]:
    """``out[i]`` = the priority of ``rows[i]`` (-1: not pending); returns the least and the
    greatest row. If a row is outside the table, ``out`` is left unspecified."""
    low = rows[0]
    high = rows[0]
    for i in range(rows.shape[0]):
        r = rows[i]
        low = min(low, r)
        high = max(high, r)
        if 0 <= r < state.shape[0]:
            out[i] = state[r, 0]
    return low, high


def _slot_twin(prios: np.ndarray, inf: int, finite: int) -> np.ndarray:
    return np.where(prios == inf, finite, prios % finite)


def _move_twin(
    rows: np.ndarray, prios: np.ndarray, stride: int, only_from: int, inf: int, state: np.ndarray, pool: np.ndarray,
    start: np.ndarray, cap: np.ndarray, counts: np.ndarray, need: np.ndarray,
) -> Tuple[bool, int]:  # fmt: skip
    finite = counts.shape[0] - 1
    p = prios if stride else np.full(rows.shape[0], prios[0], dtype=np.int64)
    old = state[rows, 0]
    if only_from != ANY:
        keep = old == only_from
        rows, p, old = rows[keep], p[keep], old[keep]
    present = old != ABSENT
    moved = present & (old != p)
    fresh = (p != ABSENT) & (~present | moved)
    leave = np.bincount(_slot_twin(old[moved], inf, finite), minlength=finite + 1)
    enter = np.bincount(_slot_twin(p[fresh], inf, finite), minlength=finite + 1)
    need[:] = counts - leave + enter
    if (need > cap).any():
        return False, 0
    out, into = rows[moved], _slot_twin(old[moved], inf, finite)
    for s in np.flatnonzero(leave):
        part = out[into == s]
        n, k = int(counts[s]), part.shape[0]
        m = n - k
        pos = state[part, 1]
        in_tail = pos >= m
        holes = pos[~in_tail]
        if holes.size:
            removed_tail = np.zeros(k, dtype=bool)
            removed_tail[pos[in_tail] - m] = True
            survivors = pool[start[s] + m : start[s] + n][~removed_tail]
            pool[start[s] + holes] = survivors
            state[survivors, 1] = holes
        counts[s] = m
    new, into = rows[fresh], _slot_twin(p[fresh], inf, finite)
    for s in np.flatnonzero(enter):
        part = new[into == s]
        n, k = int(counts[s]), part.shape[0]
        pool[start[s] + n : start[s] + n + k] = part
        state[part, 1] = np.arange(n, n + k, dtype=np.int64)
        counts[s] = n + k
    state[rows[present | fresh], 0] = p[present | fresh]
    return True, int(np.count_nonzero(fresh & ~present)) - int(np.count_nonzero(present & (p == ABSENT)))


@kernel(_move_twin)
def move_rows(
    rows: np.ndarray, prios: np.ndarray, stride: int, only_from: int, inf: int, state: np.ndarray, pool: np.ndarray,
    start: np.ndarray, cap: np.ndarray, counts: np.ndarray, need: np.ndarray,
) -> Tuple[bool, int]:  # fmt: skip
    """Gives the unique ``rows`` the priorities ``prios[i * stride]`` (``ABSENT``: remove the row);
    only those whose priority is ``only_from``, unless it is ``ANY``.

    Bucket of priority p: ``p % (len(counts) - 1)``, the last one for ``inf``. Returns ``(True,
    pending rows added less removed)``; or ``(False, 0)``, changing nothing, where a bucket
    would outgrow its room: ``need[s]`` then holds the rows bucket s needs room for.
    """
    n = rows.shape[0]
    finite = counts.shape[0] - 1
    leave = np.zeros(finite + 1, dtype=np.int64)
    enter = np.zeros(finite + 1, dtype=np.int64)
    # Each row's priority (its record read in a loop of its own, so that the misses overlap),
    # then its move: -1, none; else bucket left * (finite + 2) + bucket entered (finite + 1: none).
    none = finite + 1
    move = np.empty(n, dtype=np.int64)
    for i in range(n):
        move[i] = state[rows[i], 0]
    added = 0
    for i in range(n):
        p = prios[i * stride]
        o = move[i]
        if o == p or (only_from != ANY and o != only_from):
            move[i] = -1
            continue
        a = none if o == ABSENT else (finite if o == inf else o % finite)
        b = none if p == ABSENT else (finite if p == inf else p % finite)
        move[i] = a * (none + 1) + b
        if a != none:
            leave[a] += 1
        if b != none:
            enter[b] += 1
        added += int(a == none) - int(b == none)
    grow = False
    for s in range(finite + 1):
        need[s] = counts[s] - leave[s] + enter[s]
        grow |= need[s] > cap[s]
    if grow:
        return False, 0
    # The batch's rows by bucket left, then by bucket entered, each in the batch's order.
    first_out = np.empty(finite + 2, dtype=np.int64)
    first_in = np.empty(finite + 2, dtype=np.int64)
    first_out[0] = 0
    first_in[0] = 0
    for s in range(finite + 1):
        first_out[s + 1] = first_out[s] + leave[s]
        first_in[s + 1] = first_in[s] + enter[s]
    by_out = np.empty(first_out[finite + 1], dtype=np.int64)
    by_in = np.empty(first_in[finite + 1], dtype=np.int64)
    at_out = first_out[:-1].copy()
    at_in = first_in[:-1].copy()
    for i in range(n):
        if move[i] < 0:
            continue
        a = move[i] // (none + 1)
        b = move[i] % (none + 1)
        if a != none:
            by_out[at_out[a]] = i
            at_out[a] += 1
        if b != none:
            by_in[at_in[b]] = i
            at_in[b] += 1
    holes = np.empty(n, dtype=np.int64)
    gone = np.zeros(n, dtype=np.bool_)
    for s in range(finite + 1):
        k = leave[s]
        if k == 0:
            continue
        m = counts[s] - k
        h = 0
        for j in range(first_out[s], first_out[s + 1]):
            pos = state[rows[by_out[j]], 1]
            if pos >= m:
                gone[pos - m] = True
            else:
                holes[h] = pos
                h += 1
        base = start[s]
        h = 0
        for q in range(k):
            if gone[q]:
                gone[q] = False
            else:
                survivor = pool[base + m + q]
                pool[base + holes[h]] = survivor
                state[survivor, 1] = holes[h]
                h += 1
        counts[s] = m
    for s in range(finite + 1):
        base = start[s]
        c = counts[s]
        for j in range(first_in[s], first_in[s + 1]):
            r = rows[by_in[j]]
            pool[base + c] = r
            state[r, 1] = c
            c += 1
        counts[s] = c
    for i in range(n):
        if move[i] >= 0:
            state[rows[i], 0] = prios[i * stride]
    return True, added


def _pop_twin(state: np.ndarray, pool: np.ndarray, start: np.ndarray, counts: np.ndarray, base: int, due: int,
              inf_due: bool, buckets: int, out: np.ndarray) -> Tuple[int, int]:  # fmt: skip
    finite = counts.shape[0] - 1
    k, first = 0, -1
    for s in [(base + i) % finite for i in range(due)] + ([finite] if inf_due else []):
        n = int(counts[s])
        take = min(n, out.shape[0] - k)
        if n == 0 or take == 0 or buckets == 0:
            continue
        first = s if first < 0 else first
        out[k : k + take] = pool[start[s] + n - take : start[s] + n]
        counts[s] = n - take
        k += take
        buckets -= 1
    state[out[:k], 0] = ABSENT
    return k, first


@kernel(_pop_twin)
def pop_due(state: np.ndarray, pool: np.ndarray, start: np.ndarray, counts: np.ndarray, base: int, due: int,
            inf_due: bool, buckets: int, out: np.ndarray) -> Tuple[int, int]:  # fmt: skip
    """Pops into ``out`` (as many rows as it holds, at most) the rows of the lowest priorities
    first: ``base .. base + due - 1``, then ``inf`` if ``inf_due``; from at most ``buckets``
    buckets, each bucket's rows from its tail, in their order. Returns how many rows, and the
    bucket of the first (-1: none)."""
    finite = counts.shape[0] - 1
    k = 0
    first = -1
    for i in range(due + inf_due):
        s = (base + i) % finite if i < due else finite
        n = counts[s]
        take = min(n, out.shape[0] - k)
        if n == 0 or take == 0 or buckets == 0:
            continue
        if first < 0:
            first = s
        at = start[s] + n - take
        for j in range(take):
            r = pool[at + j]
            out[k + j] = r
            state[r, 0] = ABSENT
        counts[s] = n - take
        k += take
        buckets -= 1
    return k, first


def _lowest_twin(counts: np.ndarray, base: int) -> int:
    finite = counts.shape[0] - 1
    order = np.r_[(base + np.arange(finite)) % finite, finite]
    held = np.flatnonzero(counts[order])
    return int(order[held[0]]) if held.size else -1


@kernel(_lowest_twin)
def lowest_slot(counts: np.ndarray, base: int) -> int:
    """The bucket of the lowest pending priority (from ``base``, then ``inf``'s); -1: none."""
    finite = counts.shape[0] - 1
    for i in range(finite):
        s = (base + i) % finite
        if counts[s]:
            return s
    return finite if counts[finite] else -1
