"""Spawn a few ranks with one gloo process group and run a function in each (CPU tests)."""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from datetime import timedelta
from typing import Any, Callable, List

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, out: "mp.Queue") -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
        result = fn(rank, world, *args)
        out.put((rank, "ok", result))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))
        raise


def run_ranks(world: int, fn: Callable[..., Any], *args: Any, timeout: float = 900.0) -> List[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned ranks; returns results by rank."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict = {}
    errors = []
    try:
        for _ in range(world):
            rank, status, payload = out.get(timeout=timeout)
            if status == "ok":
                results[rank] = payload
            else:
                errors.append(f"rank {rank}:\n{payload}")
                break
    finally:
        for p in procs:
            p.join(timeout=30 if not errors else 5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]
