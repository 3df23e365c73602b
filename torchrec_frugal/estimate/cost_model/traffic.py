"""Per-step row counts of one table under a plan: expectations over its id distribution."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .workload import FRUGAL_KINDS, CostTable, Plan, Workload


@dataclass(frozen=True)
class TableTraffic:
    """Per-step row counts of one table (expectations, per rank unless named otherwise)."""

    ids: float  # ids of one rank's batch
    unique_rank: float  # distinct rows of one rank's batch
    unique_all: float  # distinct rows of all ranks' batches together
    hit_ratio: float = 0.0  # frugal: share of a rank's ids found in its own cache
    host_rows: float = 0.0  # frugal: distinct rows a rank reads from host
    owned_fresh_rows: float = 0.0  # frugal: uncached rows an owner updates (accelerator: read from host first)
    flushed_rows: float = 0.0  # frugal: rows an owner writes to host per step
    inline_rows: float = 0.0  # frugal: of which due at the very next step (written on the exchange worker, after the update)


def flush_rate(updated: np.ndarray, read_by_others: np.ndarray, lookahead: int) -> np.ndarray:
    """Host writes per step of one row with pending updates, under Frugal's lookahead.

    ``updated`` u: probability the row is updated in a step (some rank reads it); ``read_by_others``
    q: probability a rank other than its owner reads it from host. L = 0 (write-through): every
    update is written, rate u. L >= 1: an update followed by a read of another rank within the
    window is written eagerly (u (1 - (1 - q)^L)); updates with no such read are deferred and
    coalesce into one write per later read of another rank (q (1 - q)^L). L -> infinity gives u
    (every update is eventually seen in the window); hot rows (u = q = 1) give 1 per step. The
    deferred-rows cap (``FrugalConfig.max_deferred_rows``) is not modelled.
    """
    if lookahead == 0:
        return updated
    miss = (1.0 - read_by_others) ** lookahead
    return updated * (1.0 - miss) + read_by_others * miss


def table_traffic(table: CostTable, workload: Workload, plan: Plan, device_is_host: bool) -> TableTraffic:
    """The row counts one table costs per step under ``plan`` (docs/cost_model.md, "Traffic")."""
    distribution, world = table.distribution, workload.world_size
    ids = workload.batch_size * table.pooling
    # The real data's tail (CostTable.tail_rate): rows read once an epoch, distinct, never cached,
    # updated by their owner and written back once (by the flushers on an accelerator).
    tail = ids * table.tail_rate()
    base = TableTraffic(ids=ids, unique_rank=distribution.expected_unique(ids) + tail,
                        unique_all=distribution.expected_unique(world * ids) + world * tail)  # fmt: skip
    if plan.sharding_of(table.name) not in FRUGAL_KINDS:
        return base
    # Hot rows: W * floor(c N) hottest (by pre-sample), dealt round-robin: each rank holds 1/W of them.
    if plan.cache_ratio < 1.0:
        hot_count = min(table.rows, world * int(plan.cache_ratio * table.rows + 1e-9))
    else:
        hot_count = table.rows
    hot = distribution.hot_set(hot_count, workload.presample_draws)
    own_hot_unique = float((hot * distribution.touched(ids)).sum()) / world
    updated, read_by_others = distribution.touched(world * ids), distribution.touched((world - 1) * ids)
    rate = flush_rate(updated, read_by_others, plan.lookahead)
    inline = updated if plan.lookahead == 0 else updated * read_by_others
    # On a CPU device an owner updates uncached rows in place in host memory: only cached rows flush.
    rows_flushing = hot if device_is_host else distribution.count
    tail_flushed = 0.0 if device_is_host else tail
    return replace(
        base,
        hit_ratio=float((hot * distribution.prob).sum()) / world * (1.0 - table.tail_rate()),  # tail ids never hit
        host_rows=max(0.0, base.unique_rank - own_hot_unique),
        owned_fresh_rows=float(((distribution.count - hot) * updated).sum()) / world + tail,
        flushed_rows=float((rows_flushing * rate).sum()) / world + tail_flushed,
        inline_rows=float((rows_flushing * inline).sum()) / world + (tail_flushed if plan.lookahead == 0 else 0.0),
    )
