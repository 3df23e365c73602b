"""Drive FrugalEngine on every rank and check each read against a single-process reference.

The reference holds the whole fused table and applies, at each step, the gradients of all ranks
summed per row, with the same optimizer. Gradients depend on the values read (g = 0.5 v + noise),
so a stale read changes the trajectory and cannot go unnoticed.
"""
from __future__ import annotations

import random
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from torchrec_frugal.config import FrugalConfig, OptimizerSpec, TableSpec
from torchrec_frugal.engine.frugal_engine import FrugalEngine
from torchrec_frugal.engine.optimizers import apply_update, state_width
from torchrec_frugal.priorities import INF
from torchrec_frugal.engine.step_plan import StepPlan
from torchrec_frugal.synthetic_ids import ZipfWorkload


@dataclass
class Scenario:
    lookahead: int
    cache_ratio: float
    optimizer: str
    steps: int = 1500
    table_rows: tuple = (3000, 1200)
    dim: int = 8
    ids_per_step: int = 48
    queue: str = "two_level"
    flush_workers: int = 1
    max_deferred_rows: int = 65536
    in_host: Optional[bool] = None  # None: in place on CPU; False: dynamic slots + flush (the GPU path)
    seed: int = 0
    broken_lookahead: bool = False  # negative control: hide every host read from the owners
    device: str = "cpu"  # "cuda": every rank on the current CUDA device (several ranks may share it)
    host_path: str = "auto"
    sorted_reads: Optional[bool] = None  # None: the device's default (True on CUDA only)
    worker: bool = False  # the lookahead's own thread, as on an accelerator (False: the device's choice, none on CPU)
    worker_lag_s: float = 0.0  # each publish of the lookahead worker waits up to this long (a lagging worker)
    mailbox_rows: int = 16384  # small: the mailbox records grow during the run
    planned: bool = False  # steps planned ahead on a planner thread (plan_step), as FrugalTrainPipeline does


def _grads(values: torch.Tensor, rank: int, step: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + step)
    return 0.5 * values + torch.randn(values.shape, generator=g) * 0.1


def _coalesce(rows: torch.Tensor, grads: torch.Tensor):
    uniq, inv = torch.unique(rows, return_inverse=True)
    return uniq, torch.zeros(uniq.shape[0], grads.shape[1]).index_add_(0, inv, grads)


def run_scenario(rank: int, world: int, sc: Scenario) -> Dict[str, float]:
    tables = [TableSpec(f"t{i}", n, sc.dim) for i, n in enumerate(sc.table_rows)]
    lr = 0.05 if sc.optimizer == "sgd" else 0.1
    spec = OptimizerSpec(kind=sc.optimizer, lr=lr)
    wl = ZipfWorkload(sc.table_rows, sc.ids_per_step, s=1.2, seed=sc.seed)
    cfg = FrugalConfig(lookahead=sc.lookahead, cache_ratio=sc.cache_ratio, queue=sc.queue,
                       flush_workers=sc.flush_workers, flush_chunk_rows=256, timeout_s=60,
                       max_deferred_rows=sc.max_deferred_rows, update_uncached_in_host=sc.in_host,
                       host_path=sc.host_path, mailbox_rows=sc.mailbox_rows,
                       lookahead_thread=True if sc.worker else None)  # the accelerator's lookahead thread, on any device
    eng = FrugalEngine(tables, spec, cfg, presample_counts=wl.counts(rank, 20), seed=sc.seed,
                       device=torch.device(sc.device))
    if sc.worker_lag_s:
        worker = eng.lookahead_feed.worker
        publish, lag = worker.publish, random.Random(rank)

        def late(t: int, rows, idle) -> None:
            time.sleep(lag.random() * sc.worker_lag_s)
            publish(t, rows, idle)

        worker.publish = late
    if sc.sorted_reads is not None:
        eng.host.sorted_reads = sc.sorted_reads
    if sc.broken_lookahead:
        # Owners then see no future host reads, defer every flush, and the gate never waits:
        # the reference check must catch the stale reads that follow.
        eng.ring.announced[:] = False
    offsets = eng.table_offsets
    ref_w, _ = eng.read_rows()
    ref_s = torch.zeros(eng.num_rows, state_width(spec, sc.dim))

    def fused(r: int, step: int) -> torch.Tensor:
        return torch.cat([ids + offsets[t] for t, ids in enumerate(wl.batch(r, step))])

    # Planned steps: one planner thread plans each step's unique rows in order, L + 1 steps ahead
    # of the training thread, which then hands the engine plans (and expands the unique rows read).
    planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="planner") if sc.planned else None
    plans: Dict[int, "Future[Tuple[StepPlan, torch.Tensor]]"] = {}  # made, or being made, ahead
    pushed: Dict[int, Tuple[StepPlan, torch.Tensor]] = {}  # planned steps pushed to the lookahead

    def plan(step: int) -> "Tuple[StepPlan, torch.Tensor]":
        for t in range(step, min(step + sc.lookahead + 2, sc.steps)):
            if t not in plans:
                assert planner is not None
                plans[t] = planner.submit(plan_unique, fused(rank, t))
        return plans.pop(step).result()

    def plan_unique(rows: torch.Tensor) -> "Tuple[StepPlan, torch.Tensor]":
        uniq, inv = torch.unique(rows, return_inverse=True)
        return eng.plan_step(uniq), inv

    def announce(step: int) -> None:
        if sc.planned:
            pushed[step] = plan(step)
            eng.push_lookahead(pushed[step][0])
        else:
            eng.push_lookahead(fused(rank, step))

    max_rel = 0.0
    window_uncached = 0  # most rows of the owner's window that no rank caches (after an update)
    uncached = ~eng.ownership.cached
    gate_wait = 0.0
    step_time = 0.0
    for t in range(min(sc.lookahead, sc.steps)):
        announce(t)
    for step in range(sc.steps):
        if sc.lookahead and step + sc.lookahead < sc.steps:
            announce(step + sc.lookahead)
        rows = fused(rank, step)
        if sc.planned:
            step_plan, inverse = pushed.pop(step) if step in pushed else plan(step)
            eng.begin_step(step_plan)
            got = eng.lookup(step_plan).cpu()[inverse]
        else:
            eng.begin_step(rows)
            got = eng.lookup(rows).cpu()
        # Reference: every rank's reads and gradients at this step.
        all_rows, all_grads = [], []
        for r in range(world):
            rr = rows if r == rank else fused(r, step)
            vals = ref_w[rr]
            if r == rank:
                err = (got - vals).abs().max().item() / max(vals.abs().max().item(), 1e-12)
                max_rel = max(max_rel, err)
            u, g = _coalesce(rr, _grads(vals, r, step, sc.seed))
            all_rows.append(u)
            all_grads.append(g)
        u, g = _coalesce(rows, _grads(got, rank, step, sc.seed))
        eng.apply_gradients(step_plan if sc.planned else u, g)
        if eng.window is not None and step % 25 == 0:
            with eng.flusher.lock:
                window_uncached = max(window_uncached, int(((eng.window.next_read < INF) & uncached).sum()))
        for m in eng.take_metrics():  # the exchange worker may finish a step after apply_gradients returns
            gate_wait += m.gate_wait_s
            step_time += m.step_time_s
        ur, ug = _coalesce(torch.cat(all_rows), torch.cat(all_grads))
        w, st = ref_w[ur], ref_s[ur]
        apply_update(spec, w, st, ug, step)
        ref_w[ur], ref_s[ur] = w, st
    if planner is not None:
        planner.shutdown()
    eng.flush()
    host_w, host_s = eng.read_rows()
    cached = torch.from_numpy(eng.store.cached_rows)
    n_static = eng.store.num_static
    store_w, store_s = eng.store.weights[:n_static].cpu(), eng.store.state[:n_static].cpu()
    cache_vs_host = (store_w - host_w[cached]).abs().max().item() if n_static else 0.0
    state_vs_host = (store_s - host_s[cached]).abs().max().item() if n_static and host_s.shape[1] else 0.0
    host_vs_ref = (host_w - ref_w).abs().max().item() / ref_w.abs().max().item()
    result = {
        "max_rel_read_error": max_rel,
        "cache_vs_host": cache_vs_host,
        "state_vs_host": state_vs_host,
        "host_vs_ref": host_vs_ref,
        "cached_rows": float(n_static),
        "flushed_rows": float(eng.total_rows_flushed),
        "gate_wait_s": gate_wait,
        "step_time_s": step_time,
        "dynamic_after_flush": float(eng.store.dynamic_in_use),
        "host_path": eng.host.path,
        "registered": float(eng.host.registered),
        "device": str(eng.device),
        "window_uncached": float(window_uncached),
        "update_in_host": float(eng.owner_update.update_in_host),
        "ring_rows": float(eng.ring_record.rows),
        "grad_rows": float(eng.grad_record.rows),
    }
    eng.close()
    return result


def run_scenarios(rank: int, world: int, scenarios: List[Scenario]) -> List[Dict[str, float]]:
    torch.set_num_threads(1)
    return [run_scenario(rank, world, sc) for sc in scenarios]
