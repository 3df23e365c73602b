"""Measure a hardware profile of this machine with short microbenchmarks (medians of a few runs).

``python -m torchrec_frugal.estimate --calibrate PATH [--base PROFILE]`` runs :func:`measure` (host
memory copies, row gathers and scatters, reads of distinct host rows in row order, dense MLP
forward + backward, per-id pooling work, gloo collectives between two spawned ranks, and the Frugal
engine's own host work on tiny runs; on CUDA also host<->device copies and the engine's host-row
paths), then :func:`fit_profile` turns the raw timings into a :class:`HardwareProfile`. Fields a
microbenchmark cannot see (device memory, peer-to-peer, the training loop's framework time) come
from the base profile. The arithmetic of the fit is separate from the measuring so it is tested on
synthetic timings.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from .cost_model import CostModel, Plan, Workload
from .profiles import HardwareProfile, profile_from_dict

ROW_BYTES = 128  # dim 32 fp32 rows, the paper's
SORTED_READ_ROWS = (16_384, 65_536, 262_144, 1_048_576)
DENSE_BATCHES = (128, 1024)
DENSE_STACKS = ((13, 512, 256, 32), (383, 512, 256, 1))  # TorchRec DLRM's dense and over arch (criteo)
A2A_BYTES = (4_096, 8 << 20)  # per rank, small (latency) and large (bandwidth)


# ---------------------------------------------------------------------------- fit arithmetic
def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("fit_line needs at least two distinct x values")
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def fit_dense(points: Sequence[Tuple[float, float, float]]) -> Tuple[float, float]:
    """(flops_per_s, op_overhead_s) from (flops, ops, seconds) points with the same ops:
    seconds = flops / rate + ops x overhead."""
    intercept, slope = fit_line([p[0] for p in points], [p[2] for p in points])
    if slope <= 0:
        raise ValueError("dense timings do not grow with the FLOPs: cannot fit a rate")
    return 1.0 / slope, max(0.0, intercept) / points[0][1]


def fit_collective(points: Sequence[Tuple[float, float]], calls_latency: float) -> Tuple[float, float]:
    """(bytes_per_s, latency_s) from (bytes, seconds) points: seconds = calls_latency x latency + bytes / bw."""
    intercept, slope = fit_line([p[0] for p in points], [p[1] for p in points])
    if slope <= 0:
        raise ValueError("collective timings do not grow with the bytes: cannot fit a bandwidth")
    return 1.0 / slope, max(0.0, intercept) / calls_latency


def thread_efficiency(one_thread_s: float, threads: int, many_threads_s: float) -> float:
    """Speed-up of each extra thread: t1 / tN = 1 + (N - 1) x efficiency, clipped to [0, 1]."""
    if threads < 2:
        return 0.0
    return float(np.clip((one_thread_s / many_threads_s - 1.0) / (threads - 1), 0.0, 1.0))


def fit_profile(m: Dict[str, Any], base: HardwareProfile, name: str) -> HardwareProfile:
    """A profile from raw measurements ``m`` (what :func:`measure` returns), other fields from ``base``."""
    rate, overhead = fit_dense([(p["flops"], p["ops"], p["s"]) for p in m["dense"]])
    a2a_bw, a2a_lat = fit_collective([(p["bytes"], p["s"]) for p in m["all_to_all"]], calls_latency=1.0)
    # a ring all-reduce of 2 ranks: 2 steps, each sending half the buffer
    ar_bw, ar_lat = fit_collective([(p["bytes"], p["s"]) for p in m["all_reduce"]], calls_latency=2.0)
    bw = lambda k: m[k]["bytes"] / m[k]["s"]  # noqa: E731
    fields: Dict[str, Any] = dict(
        base.to_json(),
        name=name,
        description=f"calibrated on {m['machine']}",
        host_cores=m["cores"],
        dense_flops_per_s=rate,
        op_overhead_s=overhead,
        dense_thread_efficiency=thread_efficiency(m["dense_threads"]["one_s"], m["dense_threads"]["threads"], m["dense_threads"]["many_s"])
        if base.device == "cpu" else 0.0,
        kernel_id_s=m["per_id"]["s"] / m["per_id"]["ids"],
        host_memcpy_bw=bw("memcpy"),
        host_mem_bw=max(bw("memcpy"), bw("memcpy_parallel")),
        device_gather_bw=bw("device_gather"),
        device_scatter_bw=bw("device_scatter"),
        device_mem_bw=bw("device_stream"),
        host_read_random_bw=bw("host_read_random"),
        host_read_sorted=[[p["rows"], p["rows"] * ROW_BYTES / p["s"]] for p in m["host_read_sorted"]],
        host_write_bw=bw("host_write"),
        a2a_bw=a2a_bw,
        a2a_latency_s=a2a_lat,
        allreduce_bw=ar_bw,
        allreduce_latency_s=ar_lat,
        **fit_exchange(m["engine"]),
        extra={"measurements": m, "base": base.name},
    )
    if "h2d" in m:
        fields.update(h2d_bw=bw("h2d"), d2h_bw=bw("d2h"))
    if "host_memory_bytes" in m:  # older measurements lack it: keep base's
        fields.update(host_memory_bytes=m["host_memory_bytes"])
    if base.device == "cpu":
        # Nodes of CPU ranks on one machine (the simulated nodes of the tests) talk over gloo on
        # loopback, as its ranks do: the 2 measured ranks' sends together. A real network cannot be
        # measured from one machine: a GPU calibration keeps ``base``'s figures.
        fields.update(network_bw=2.0 * a2a_bw, network_latency_s=a2a_lat)
    return profile_from_dict(fields, f"calibration of {name}")


def fit_exchange(points: Sequence[Mapping[str, float]]) -> Dict[str, float]:
    """exchange_step_s, exchange_row_s (from the points with L = 0) and lookahead_row_s (what L > 0
    adds a row) from :func:`_engine`'s (lookahead, rows, seconds) points."""
    by_l = {L: [p for p in points if p["lookahead"] == L] for L in {p["lookahead"] for p in points}}
    step_s, row_s = fit_line([p["rows"] for p in by_l[0]], [p["s"] for p in by_l[0]])
    la = [L for L in by_l if L > 0]
    la_row_s = 0.0
    if la:
        la_row_s = max(0.0, fit_line([p["rows"] for p in by_l[la[0]]], [p["s"] for p in by_l[la[0]]])[1] - row_s)
    return {"exchange_step_s": max(0.0, step_s), "exchange_row_s": max(0.0, row_s), "lookahead_row_s": la_row_s}


# ---------------------------------------------------------------------------- the training loop's own time
FRAMEWORK_FIELDS = ("framework_step_s", "framework_id_s", "framework_dist_step_s")
EFFICIENCY_GRID = tuple(np.round(np.linspace(0.0, 1.0, 21), 2))


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """One measured run of a real training loop: its workload, its plan and its samples/s."""

    workload: Workload
    plan: Plan
    samples_per_second: float

    @property
    def step_s(self) -> float:
        return self.workload.world_size * self.workload.batch_size / self.samples_per_second

    def features(self) -> np.ndarray:
        """What the framework term multiplies: 1, the rank's ids, and whether ranks talk (W > 1)."""
        ids = sum(self.workload.batch_size * t.pooling for t in self.workload.tables)
        return np.array([1.0, ids, float(self.workload.world_size > 1)])


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin |a x - b| over x >= 0, by trying every support (a handful of unknowns)."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(b**2))
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            x_s = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            if np.all(x_s >= 0):
                x = np.zeros(a.shape[1])
                x[list(cols)] = x_s
                err = float(np.sum((a @ x - b) ** 2))
                if err < best_err:
                    best, best_err = x, err
    return best


def fit_training(runs: Sequence[TrainingRun], base: HardwareProfile, iterations: int = 20) -> Tuple[HardwareProfile, Dict[str, Any]]:
    """The second stage of a calibration: the framework terms (and, on a CPU device, the dense
    thread efficiency) that make the model's step times match measured runs of the real training
    loop, least squares in relative error.

    The microbenchmarks time each part alone; inside a training step the same work runs slower
    and the loop adds its own (the pipeline, TorchRec's input handling, the ranks' collectives
    and their switches on shared cores). That remainder is what the framework term holds:
    ``framework_step_s + framework_id_s x ids + framework_dist_step_s x [W > 1]``, all >= 0.
    The model's step is piecewise linear in the framework term (it may enter through the
    contention of ranks sharing cores), so the fit linearizes it around the current guess and
    solves again until it settles; the thread efficiency is searched on a grid.
    """
    if len(runs) < 2:
        raise ValueError("fit_training needs at least two measured runs")
    measured = np.array([r.step_s for r in runs])
    x = np.stack([r.features() for r in runs])
    eps = 1e-4
    efficiencies = EFFICIENCY_GRID if base.device_is_host else (base.dense_thread_efficiency,)
    best: Tuple[float, HardwareProfile, np.ndarray] = (float("inf"), base, measured)

    def steps(prof: HardwareProfile) -> np.ndarray:
        model = CostModel(prof)
        return np.array([model.predict(r.workload, r.plan).step_s for r in runs])

    for eff in efficiencies:
        theta = np.zeros(len(FRAMEWORK_FIELDS))
        prof = dataclasses.replace(base, dense_thread_efficiency=float(eff), **dict(zip(FRAMEWORK_FIELDS, theta)))
        for _ in range(iterations):
            pred = steps(prof)
            slope = (steps(dataclasses.replace(prof, framework_step_s=prof.framework_step_s + eps)) - pred) / eps
            offset = pred - slope * (x @ theta)
            new = _nonnegative_lstsq(slope[:, None] * x / measured[:, None], (measured - offset) / measured)
            prof = dataclasses.replace(prof, **dict(zip(FRAMEWORK_FIELDS, map(float, new))))
            if np.allclose(new, theta, rtol=1e-6, atol=1e-12):
                break
            theta = new
        pred = steps(prof)
        err = float(np.sqrt(np.mean((pred / measured - 1.0) ** 2)))
        if err < best[0]:
            best = (err, prof, pred)
    err, prof, pred = best
    report = {
        "rms_relative_error": err,
        "fitted": {k: getattr(prof, k) for k in ("dense_thread_efficiency", *FRAMEWORK_FIELDS)},
        "runs": [{"world_size": r.workload.world_size, "batch_size": r.workload.batch_size, "plan": r.plan.sharding,
                  "measured_step_s": float(m), "predicted_step_s": float(p)}
                 for r, m, p in zip(runs, measured, pred)],
    }  # fmt: skip
    return prof, report


RATE_FIELDS = ("dense_flops_per_s", "device_rows_bw", "llc_rows_bw", *FRAMEWORK_FIELDS, "dense_thread_efficiency")
"""What :func:`fit_rates` fits: the dense rate, the memory and last-level-cache row rates (each a
factor on the base's gather and scatter rates), the framework terms and the thread efficiency."""
_RATE_UNITS = np.array([1.0, 1.0, 1.0, 1e-3, 1e-6, 1e-3, 1.0])  # framework terms solved in ms, us per id, ms


def _rates_profile(base: HardwareProfile, llc_bytes: float, theta: np.ndarray) -> HardwareProfile:
    """``base`` with :data:`RATE_FIELDS` set from ``theta`` (log factors for the rates, then the
    framework terms in :data:`_RATE_UNITS` and the thread efficiency)."""
    dense, mem, llc = np.exp(theta[:3])
    fw = theta[3:6] * _RATE_UNITS[3:6]
    return dataclasses.replace(
        base, dense_flops_per_s=float(base.dense_flops_per_s * dense), device_gather_bw=float(base.device_gather_bw * mem),
        device_scatter_bw=float(base.device_scatter_bw * mem), llc_bytes=float(llc_bytes),
        llc_gather_bw=float(base.device_gather_bw * llc), llc_scatter_bw=float(base.device_scatter_bw * llc),
        dense_thread_efficiency=float(theta[6]), **dict(zip(FRAMEWORK_FIELDS, map(float, fw))),
    )  # fmt: skip


def _project(theta: np.ndarray) -> np.ndarray:
    """Framework terms >= 0, thread efficiency in [0, 1]."""
    out = theta.copy()
    out[3:6] = np.maximum(out[3:6], 0.0)
    out[6] = min(max(out[6], 0.0), 1.0)
    return out


def fit_rates(
    runs: Sequence[TrainingRun], base: HardwareProfile, llc_bytes: float, iterations: int = 40
) -> Tuple[HardwareProfile, Dict[str, Any]]:
    """Refit a CPU profile on recorded runs of the training loop (no new timing): the fields of
    :data:`RATE_FIELDS`, with the last-level cache of ``llc_bytes`` priced at its own row rate
    (docs/cost_model.md, "The last-level cache"). Least squares in relative error by damped
    Gauss-Newton (Levenberg-Marquardt) with a numerical Jacobian, the framework terms kept >= 0 and
    the thread efficiency in [0, 1]; the rates as log factors on ``base``'s, so they stay > 0.

    The microbenchmarks time a gather over one buffer of the cache's size, so they cannot tell
    the cache-resident rate from the memory rate; the runs can, when their tables' sizes differ."""
    if len(runs) < len(RATE_FIELDS):
        raise ValueError(f"fit_rates needs at least {len(RATE_FIELDS)} measured runs, got {len(runs)}")
    measured = np.array([r.step_s for r in runs])

    def residuals(theta: np.ndarray) -> np.ndarray:
        model = CostModel(_rates_profile(base, llc_bytes, theta))
        return np.array([model.predict(r.workload, r.plan).step_s for r in runs]) / measured - 1.0

    fw = np.array([getattr(base, k) for k in FRAMEWORK_FIELDS]) / _RATE_UNITS[3:6]
    theta = np.concatenate([[0.0, 0.0, 0.0], fw, [base.dense_thread_efficiency]])
    res = residuals(theta)
    cost, damping, h = float(res @ res), 1e-2, 1e-4
    for _ in range(iterations):
        jac = np.stack([(residuals(theta + h * e) - res) / h for e in np.eye(len(theta))], axis=1)
        jtj, g = jac.T @ jac, jac.T @ res
        while damping < 1e8:
            cand = _project(theta - np.linalg.solve(jtj + damping * (np.diag(np.diag(jtj)) + np.eye(len(theta))), g))
            cand_res = residuals(cand)
            cand_cost = float(cand_res @ cand_res)
            if cand_cost < cost:
                break
            damping *= 4.0
        else:
            break
        done = cost - cand_cost < 1e-7 * cost
        theta, res, cost, damping = cand, cand_res, cand_cost, damping / 3.0
        if done:
            break
    prof = _rates_profile(base, llc_bytes, theta)
    report = {
        "rms_relative_error": float(np.sqrt(np.mean(res**2))),
        "fitted": {k: getattr(prof, k) for k in ("dense_flops_per_s", "device_gather_bw", "device_scatter_bw", "llc_bytes",
                                                  "llc_gather_bw", "llc_scatter_bw", "dense_thread_efficiency",
                                                  *FRAMEWORK_FIELDS)},
        "parameters": len(RATE_FIELDS),
        "runs": len(runs),
    }  # fmt: skip
    return prof, report


# ---------------------------------------------------------------------------- measurements
def measure(device: str = "cpu", reps: int = 5, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Raw timings of this machine (seconds are medians over ``reps``); a minute or less on CPU."""
    import platform

    import torch

    from ..host.launch import run_ranks
    from .measure import median_s

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

    from .measure import median_s

    rows_total = (512 << 20) // ROW_BYTES
    host = torch.randn(rows_total, ROW_BYTES // 4, generator=gen)
    res: Dict[str, Any] = {"host_read_sorted": []}
    if dev.type == "cuda":
        from ..engine.host_tables import HostTables

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

    from .measure import median_s

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

    from .measure import median_s

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

    from .measure import median_s

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

    from ..config import FrugalConfig, OptimizerSpec, TableSpec
    from ..engine.frugal_engine import FrugalEngine
    from ..synthetic_ids import ZipfWorkload

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


def calibrate(path: str, base: HardwareProfile, name: str, device: str = "cpu", log: Callable[[str], None] = print) -> HardwareProfile:
    """Measure this machine, fit a profile over ``base`` and write it to ``path``."""
    profile = fit_profile(measure(device, log=log), base, name)
    profile.save(path)
    log(f"wrote {path}")
    return profile


# ---------------------------------------------------------------------------- the planner thread
TIME_PLAN_RECORDED_MS = {("one-hot", 1024): 1.09, ("one-hot", 4096): 3.72, ("multi-hot", 1024): 3.38,
                         ("multi-hot", 4096): 12.57}  # fmt: skip
"""``benchmarks/time_plan.py --config criteo-kaggle --scale 0.1 --batch-sizes 1024 4096 --repeats 60``:
ms to plan one batch on one thread alone, median of 8 invocations (docs/performance.md, "The DLRM
step's host work, piece by piece")."""


def time_plan_points(
    medians_ms: Mapping[Tuple[str, int], float], config: str = "criteo-kaggle", scale: float = 0.1, hot: int = 3
) -> List[Tuple[float, float, float]]:
    """(ids, expected distinct rows, seconds) of each batch ``benchmarks/time_plan.py`` plans: per
    table of ``config`` at ``scale``, ids r x u^3 (u uniform) of B (one-hot) or B x ``hot`` (multi-hot,
    bags of 0 to 2 hot ids) draws; distinct rows from the exact row probabilities."""
    from .cost_model import RowDistribution
    from ..datasets import get_config

    rows = get_config(config, scale=scale).rows()
    dists = []
    for r in rows:
        k = np.arange(r + 1, dtype=np.float64) / r
        dists.append(RowDistribution.from_counts(np.diff(np.cbrt(k))))
    out = []
    for (shape, batch), ms in sorted(medians_ms.items()):
        n = batch * (1 if shape == "one-hot" else hot)
        out.append((float(n * len(rows)), sum(d.expected_unique(n) for d in dists), 1e-3 * ms))
    return out


def fit_planner(points: Sequence[Tuple[float, float, float]]) -> Dict[str, float]:
    """planner_step_s + planner_id_s x ids + planner_row_s x distinct rows, least squares with every
    coefficient >= 0, from (ids, distinct rows, seconds) points."""
    a = np.array([[1.0, i, u] for i, u, _ in points])
    x = _nonnegative_lstsq(a, np.array([t for *_, t in points]))
    return {"planner_step_s": float(x[0]), "planner_id_s": float(x[1]), "planner_row_s": float(x[2])}


if __name__ == "__main__":  # python -m torchrec_frugal.estimate.calibrate: the planner fields from the recorded time_plan.py run
    pts = time_plan_points(TIME_PLAN_RECORDED_MS)
    fit = fit_planner(pts)
    for (ids, rows, t), key in zip(pts, sorted(TIME_PLAN_RECORDED_MS)):
        pred = fit["planner_step_s"] + fit["planner_id_s"] * ids + fit["planner_row_s"] * rows
        print(f"{key[0]:9s} batch {key[1]:5d}: {ids:8.0f} ids, {rows:8.0f} distinct rows, "
              f"measured {1e3 * t:.2f} ms, fit {1e3 * pred:.2f} ms ({pred / t - 1:+.1%})")
    print({k: float(f"{v:.3g}") for k, v in fit.items()})
