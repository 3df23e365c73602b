"""Stage 1 of a calibration: raw timings of this machine by short microbenchmarks (medians of a
few runs): host memory copies, row gathers and scatters, reads of distinct host rows in row order,
dense MLP forward + backward, per-id pooling work, gloo collectives between two spawned ranks and
the Frugal engine's own host work on tiny runs; on CUDA also host<->device copies and the
engine's host-row paths."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

ROW_BYTES = 128  # dim 32 fp32 rows, the paper's
SORTED_READ_ROWS = (16_384, 65_536, 262_144, 1_048_576)
DENSE_BATCHES = (128, 1024)
DENSE_STACKS = ((13, 512, 256, 32), (383, 512, 256, 1))  # TorchRec DLRM's dense and over arch (criteo)
A2A_BYTES = (4_096, 8 << 20)  # per rank, small (latency) and large (bandwidth)


def measure(device: str = "cpu", reps: int = 5, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Raw timings of this machine (seconds are medians over ``reps``); a minute or less on CPU."""
    import platform

    import torch

    from ...host.launch import run_ranks
    from ..timing import median_s

    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    out: Dict[str, Any] = {"machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, {device})",
                           "cores": os.cpu_count() or 1, "device": device,
                           "host_memory_bytes": float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))}  # fmt: skip

    def timed(key: str, nbytes: float, fn: Callable[[], object]) -> None:
        out[key] = {"bytes": float(nbytes), "s": median_s(fn, reps, warmup=1, sync=sync)}
        log(f"{key}: {nbytes / out[key]['s'] / 1e9:.2f} GB/s")

    big = 64 << 20
    src, dst = torch.empty(big, dtype=torch.uint8), torch.empty(big, dtype=torch.uint8)
    timed("memcpy", big, lambda: dst.copy_(src))
    out["memcpy_parallel"] = _parallel_memcpy(big, out["cores"], reps)
    table_rows = (256 << 20) // ROW_BYTES  # a 256 MiB table of 128-byte rows
    table = torch.randn(table_rows, ROW_BYTES // 4, generator=gen).to(dev)
    n = 262_144
    rnd = torch.randint(0, table_rows, (n,), generator=gen).to(dev)
    vals = table.index_select(0, rnd)
    timed("device_gather", n * ROW_BYTES, lambda: table.index_select(0, rnd))
    timed("device_scatter", n * ROW_BYTES, lambda: table.index_copy_(0, rnd, vals))
    timed("device_stream", 3 * table.numel() * 4, lambda: table.mul_(1.0).add_(0.0))
    out.update(_host_rows(dev, reps, gen, sync, log))
    out["dense"], out["dense_threads"] = _dense(dev, reps, sync, log)
    out["per_id"] = _per_id(dev, reps, sync)
    if dev.type == "cuda":
        pinned = torch.empty(big, dtype=torch.uint8).pin_memory()
        on_dev = torch.empty(big, dtype=torch.uint8, device=dev)
        timed("h2d", big, lambda: on_dev.copy_(pinned, non_blocking=True))
        timed("d2h", big, lambda: pinned.copy_(on_dev, non_blocking=True))
    coll = run_ranks(2, _collectives, reps)[0]
    out.update(coll)
    out["engine"] = measure_engine(device)
    log(f"engine: {out['engine']}")
    return out


def _parallel_memcpy(nbytes: int, threads: int, reps: int) -> Dict[str, float]:
    """All cores copying at once (torch releases the GIL in copies): the host memory system."""
    import threading
    import time

    import torch

    pairs = [(torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)) for _ in range(threads)]
    times = []
    for _ in range(reps):
        ts = [threading.Thread(target=lambda a=a, b=b: b.copy_(a)) for a, b in pairs]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        times.append(time.perf_counter() - t0)
    return {"bytes": float(nbytes * threads), "s": float(np.median(times))}


def _host_rows(dev: Any, reps: int, gen: Any, sync: Callable[[], None], log: Callable[[str], None]) -> Dict[str, Any]:
    """Reads of distinct rows in row order from a host table (the engine's reads), of random rows,
    and random row writes (flushes). CUDA: through the engine's own host-row paths (fastest path
    per size, as the engine picks it); CPU: the device is host memory, rows are indexed in place."""
    import torch

    from ..timing import median_s

    rows_total = (512 << 20) // ROW_BYTES
    host = torch.randn(rows_total, ROW_BYTES // 4, generator=gen)
    res: Dict[str, Any] = {"host_read_sorted": []}
    if dev.type == "cuda":
        from ...engine.host_tables import HostTables

        ht = HostTables({"weights": host}, host.view(-1).view(torch.uint8), dev, "auto", host)
        ht.calibrate(SORTED_READ_ROWS, reps)
        for r in ht.calibration:
            res["host_read_sorted"].append({"rows": r["rows"], "s": min(r["read_zero_copy_s"], r["read_pinned_s"])})
        last = ht.calibration[-1]
        res["host_write"] = {"bytes": last["rows"] * ROW_BYTES, "s": min(last["write_zero_copy_s"], last["write_pinned_s"])}
        rnd = torch.randint(0, rows_total, (SORTED_READ_ROWS[1],), generator=gen)
        res["host_read_random"] = {"bytes": float(rnd.numel() * ROW_BYTES),
                                   "s": median_s(lambda: ht.read("weights", rnd), reps, sync=torch.cuda.synchronize)}  # fmt: skip
        return res
    for n in SORTED_READ_ROWS:
        rows = torch.unique(torch.randint(0, rows_total, (n,), generator=gen))
        res["host_read_sorted"].append({"rows": float(rows.numel()), "s": median_s(lambda: host.index_select(0, rows), reps)})
    rnd = torch.randint(0, rows_total, (SORTED_READ_ROWS[1],), generator=gen)
    vals = host.index_select(0, rnd)
    res["host_read_random"] = {"bytes": float(rnd.numel() * ROW_BYTES), "s": median_s(lambda: host.index_select(0, rnd), reps)}
    res["host_write"] = {"bytes": float(rnd.numel() * ROW_BYTES), "s": median_s(lambda: host.index_copy_(0, rnd, vals), reps)}
    log(f"host reads in row order: {[round(p['rows'] * ROW_BYTES / p['s'] / 1e9, 2) for p in res['host_read_sorted']]} GB/s")
    return res


def _dense(dev: Any, reps: int, sync: Callable[[], None], log: Callable[[str], None]) -> Tuple[List[Dict[str, float]], Dict[str, float]]:
    """Forward + backward of DLRM's two MLPs at two batch sizes (fit: rate and per-op overhead),
    and at the largest batch with every core (CPU: intra-op thread scaling)."""
    import torch

    from ..timing import median_s

    layers: List[torch.nn.Module] = []
    flops_per_sample, ops = 0.0, 0
    mlps = []
    for widths in DENSE_STACKS:
        for a, b in zip(widths, widths[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
            flops_per_sample += 2.0 * a * b
            ops += 3
        mlps.append(torch.nn.Sequential(*layers).to(dev))
        layers = []

    def step(xs: List[Any]) -> None:
        loss = sum(m(x).sum() for m, x in zip(mlps, xs))
        loss.backward()  # type: ignore[union-attr]

    points = []
    for b in DENSE_BATCHES:
        xs = [torch.randn(b, w[0], device=dev) for w in DENSE_STACKS]
        s = median_s(lambda: step(xs), reps, sync=sync)
        points.append({"batch": b, "flops": 3.0 * flops_per_sample * b, "ops": 3.0 * ops, "s": s})
    log(f"dense: {[round(p['flops'] / p['s'] / 1e9, 1) for p in points]} GFLOP/s at batches {DENSE_BATCHES}")
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    xs = [torch.randn(DENSE_BATCHES[-1], w[0], device=dev) for w in DENSE_STACKS]
    many = median_s(lambda: step(xs), reps, sync=sync)
    torch.set_num_threads(1)
    return points, {"threads": threads, "one_s": points[-1]["s"], "many_s": many}


def _per_id(dev: Any, reps: int, sync: Callable[[], None]) -> Dict[str, float]:
    """Pooling and gradient accumulation per id on a table small enough to stay in cache: the
    per-id work of an embedding kernel beyond its row reads."""
    import torch

    from ..timing import median_s

    ids = 65_536
    table = torch.randn(1024, ROW_BYTES // 4, device=dev, requires_grad=True)
    idx = torch.randint(0, 1024, (ids,), device=dev)
    offsets = torch.arange(0, ids, 1, device=dev)

    def fn() -> None:
        torch.nn.functional.embedding_bag(idx, table, offsets, mode="sum").sum().backward()

    return {"ids": float(ids), "s": median_s(fn, reps, sync=sync)}


def _collectives(rank: int, world: int, reps: int) -> Dict[str, Any]:
    """all_to_all_single and all_reduce of the default (gloo) group at a small and a large size."""
    import torch
    import torch.distributed as dist

    from ..timing import median_s

    res: Dict[str, Any] = {"all_to_all": [], "all_reduce": []}
    for nbytes in A2A_BYTES:
        # A small collective takes a fraction of a millisecond, which one descheduled rank on a
        # shared core multiplies: its median needs more calls than a large one's.
        n = reps if nbytes >= 1 << 20 else 5 * reps
        x = torch.ones(nbytes // 4 * world // (world - 1))  # each rank sends nbytes to the others
        y = torch.empty_like(x)
        res["all_to_all"].append({"bytes": float(nbytes), "s": median_s(lambda: dist.all_to_all_single(y, x), n)})
        z = torch.ones(nbytes // 4)
        res["all_reduce"].append({"bytes": float(nbytes), "s": median_s(lambda: dist.all_reduce(z), n)})
    return res


def measure_engine(device: str, steps: int = 30, warmup: int = 5) -> List[Dict[str, float]]:
    """The engine's host-side phases (announce, exchange, bookkeeping) per step on one rank, at two
    batch sizes, with L = 0 and L = 10: what the exchange worker does beside the step, which the fit
    calls exchange_step_s, exchange_row_s and lookahead_row_s."""
    import torch

    from ...config import FrugalConfig, OptimizerSpec, TableSpec
    from ...engine.frugal_engine import FrugalEngine
    from ...synthetic_ids import ZipfWorkload

    sizes = (200_000, 100_000, 50_000, 10_000)
    out = []
    for batch in (256, 2048):
        work = ZipfWorkload(sizes, batch, s=1.2, seed=0)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        fused = [torch.cat([ids + int(o) for ids, o in zip(work.batch(0, s), offsets)]) for s in range(steps + 10)]
        for L in (0, 10):
            cfg = FrugalConfig(lookahead=L, cache_ratio=0.05)  # the engine's own threads for this device
            tables = [TableSpec(f"t{i}", n, ROW_BYTES // 4) for i, n in enumerate(sizes)]
            counts = work.counts(0, 20)
            phases, rows = [], []
            with FrugalEngine(tables, OptimizerSpec(kind="rowwise_adagrad"), cfg, device=torch.device(device),
                              presample_counts=counts) as eng:  # fmt: skip
                for t in range(L):
                    eng.push_lookahead(fused[t])
                for s in range(steps):
                    if L:
                        eng.push_lookahead(fused[s + L])
                    eng.begin_step(fused[s])
                    emb = eng.lookup(fused[s])
                    uniq, inv = torch.unique(fused[s], return_inverse=True)
                    grads = torch.zeros(uniq.shape[0], emb.shape[1], device=emb.device).index_add_(0, inv.to(emb.device), emb)
                    eng.apply_gradients(uniq, grads)
                    eng.drain()
                    m = eng.last_metrics
                    if s >= warmup:
                        phases.append(sum(m.phase_s.get(k, 0.0) for k in ("announce", "exchange", "bookkeeping")))
                        rows.append(float(uniq.numel()))
            out.append({"lookahead": L, "batch": batch, "rows": float(np.mean(rows)), "s": float(np.median(phases))})
    return out
