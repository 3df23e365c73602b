"""Utilities shared by the tests, the benchmarks and the examples (as ``torchrec.test_utils`` is TorchRec's).

One copy of each: a free local port, a few spawned ranks with one gloo process group, the state
of the checkout a figure was measured on, CPU clocks of the machine and of this process, and the
median time of a callable.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import resource
import socket
import statistics
import subprocess
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

import torch
import torch.distributed as dist


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    rank: int, world: int, port: int, pg_timeout_s: float, fn: Callable[..., Any], args: tuple, out: "mp.Queue"
) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=pg_timeout_s))
        result = fn(rank, world, *args)
        out.put((rank, "ok", result))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))
        raise


def run_ranks(
    world: int, fn: Callable[..., Any], *args: Any, timeout: float = 900.0, pg_timeout_s: float = 120.0
) -> List[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned ranks sharing one gloo process group.

    Returns the results by rank. The first rank to fail raises ``RuntimeError`` with its traceback,
    and no rank outlives the call (stragglers are killed), so a failure never hangs the caller.
    ``fn`` and ``args`` must be picklable (a module-level function).
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, pg_timeout_s, fn, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results: Dict[int, Any] = {}
    error = ""
    try:
        for _ in range(world):
            rank, status, payload = out.get(timeout=timeout)
            if status != "ok":
                error = f"rank {rank} failed:\n{payload}"
                break
            results[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=30 if not error else 5)
            if p.is_alive():
                p.kill()
                p.join()
    if error:
        raise RuntimeError(error)
    return [results[r] for r in range(world)]


def git_state(root: Path, paths: Sequence[str] = ("torchrec_frugal",)) -> str:
    """HEAD of the checkout at ``root``, with '+dirty' if ``paths`` have local edits ('unknown' outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *paths],
            cwd=root, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat (0 where there is none)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's reaped children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def own_cpu_s() -> float:
    """CPU seconds of this process and its reaped children."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime + children_cpu_s()


def median_s(fn: Callable[[], object], reps: int, warmup: int = 3, sync: Callable[[], None] = lambda: None) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after ``warmup``; ``sync`` waits for queued device work."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_or_nan(xs: Sequence[float | None]) -> float:
    """Median of the figures of ``xs`` with None and NaN (a failed run, an undefined figure) left out; NaN if none is left."""
    vals = [x for x in xs if x is not None and x == x]
    return statistics.median(vals) if vals else float("nan")
