"""Ranks on this machine: a few spawned processes with one gloo process group, as torchrun would
start them, for the calibration, the benchmarks and the tests; a free local port; the
shared-memory segments a run left behind.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import socket
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List

import torch
import torch.distributed as dist

from . import shm


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def of_this_run(name: str) -> bool:
    """Whether this process answers for the segment ``name``: nobody will unlink it any more (its
    creator is gone), or this process or one of its descendants holds it.

    Another job's live segments on the machine are not ours, whatever they do meanwhile.
    """
    if shm.is_stale(name):
        return True
    pid = shm.creator_pid(name)
    return pid is not None and _descends_from(pid, os.getpid())


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return False
        pid = int(stat[stat.rindex(b")") + 2 :].split()[1])  # field 4: the parent's pid
    return False


def leaked_segments(before: Iterable[str] = ()) -> List[str]:
    """Segments in the shared-memory directory, not in ``before``, that this run left behind or
    still holds (:func:`of_this_run`)."""
    return sorted(n for n in set(shm.list_segments()) - set(before) if of_this_run(n))


def node_env(rank: int, world: int, nodes: int, shm_root: str) -> Dict[str, str]:
    """What torchrun sets for ``rank`` when ``nodes`` launches of world // nodes ranks each make the
    job (LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK), plus the node's own shared-memory directory."""
    local = world // nodes
    node = rank // local
    return {
        "LOCAL_RANK": str(rank % local),
        "LOCAL_WORLD_SIZE": str(local),
        "GROUP_RANK": str(node),
        shm.ENV_DIR: os.path.join(shm_root, f"node{node}"),
    }


def _rank_main(
    rank: int,
    world: int,
    port: int,
    pg_timeout_s: float,
    fn: Callable[..., Any],
    args: tuple,
    out: "mp.Queue",
    env: Dict[str, str],
) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env)
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
    world: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 900.0,
    pg_timeout_s: float = 120.0,
    nodes: int = 1,
) -> List[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned ranks sharing one gloo process group.

    Returns the results by rank. The first rank to fail raises ``RuntimeError`` with its traceback,
    and no rank outlives the call (stragglers are killed), so a failure never hangs the caller.
    ``fn`` and ``args`` must be picklable (a module-level function).

    ``nodes`` > 1 simulates that many machines on this one, as ``torchrun --nnodes`` launches
    would: each node's ranks get its LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK, and a
    shared-memory directory of their own (a file left in one after the run is an error).
    """
    if nodes < 1 or world % nodes:
        raise ValueError(f"run_ranks: {world} ranks do not split into {nodes} nodes")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    shm_root = tempfile.mkdtemp(prefix="frugal_nodes_") if nodes > 1 else ""
    envs = [node_env(r, world, nodes, shm_root) if nodes > 1 else {} for r in range(world)]
    for e in envs:
        if e:
            os.makedirs(e[shm.ENV_DIR], exist_ok=True)
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, pg_timeout_s, fn, args, out, envs[r])) for r in range(world)
    ]
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
        left = sorted(str(f) for f in Path(shm_root).rglob("*") if f.is_file()) if shm_root else []
        if shm_root:
            shutil.rmtree(shm_root, ignore_errors=True)
    if error:
        raise RuntimeError(error)
    if left:
        raise RuntimeError(f"run_ranks: the simulated nodes left shared-memory files behind: {left}")
    return [results[r] for r in range(world)]
