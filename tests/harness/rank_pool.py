"""Ranks spawned once per test module, one scenario per test.

Spawning ranks and building their gloo group costs seconds, so a test module keeps one
:class:`RankPool` and runs each test's scenario in it. A scenario that fails fails the tests that
ask for it, with its name and the rank's traceback, and no other: the pool is torn down after a
failure (a rank may be stuck in a collective its peer left) and respawned for the next scenario.
"""
from __future__ import annotations

import functools
import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from runs import Runs
from torchrec_frugal.host.launch import free_port, node_env
from torchrec_frugal.host import shm

Job = Tuple[Callable[..., Any], tuple]


def _serve(rank: int, world: int, port: int, pg_timeout_s: float, inbox: "mp.Queue", out: "mp.Queue", env: Dict[str, str]) -> None:
    """A rank's loop: run ``fn(rank, world, *args)`` for each job until ``None`` arrives."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=pg_timeout_s))
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))
        raise
    while True:
        job: Optional[Job] = inbox.get()
        if job is None:
            break
        fn, args = job
        try:
            out.put((rank, "ok", fn(rank, world, *args)))
        except BaseException:
            out.put((rank, "error", traceback.format_exc()))
            raise
        dist.barrier()  # no rank starts the next job while a peer still runs this one
    dist.destroy_process_group()


class RankPool:
    """``world`` spawned ranks sharing one gloo group (``nodes`` simulated machines, as
    :func:`torchrec_frugal.host.launch.run_ranks`), running one job at a time."""

    def __init__(self, world: int, nodes: int = 1, timeout: float = 900.0, pg_timeout_s: float = 120.0) -> None:
        if nodes < 1 or world % nodes:
            raise ValueError(f"RankPool: {world} ranks do not split into {nodes} nodes")
        self.world, self.nodes, self.timeout, self.pg_timeout_s = world, nodes, timeout, pg_timeout_s
        self._procs: List[Any] = []
        self._inboxes: List[Any] = []
        self._out: Any = None
        self._shm_root = ""

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        port = free_port()
        self._shm_root = tempfile.mkdtemp(prefix="frugal_nodes_") if self.nodes > 1 else ""
        envs = [node_env(r, self.world, self.nodes, self._shm_root) if self.nodes > 1 else {} for r in range(self.world)]
        for e in envs:
            if e:
                os.makedirs(e[shm.ENV_DIR], exist_ok=True)
        self._out = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(self.world)]
        self._procs = [
            ctx.Process(target=_serve, args=(r, self.world, port, self.pg_timeout_s, self._inboxes[r], self._out, envs[r]))
            for r in range(self.world)
        ]
        for p in self._procs:
            p.start()

    def run(self, fn: Callable[..., Any], *args: Any) -> List[Any]:
        """``fn(rank, world, *args)`` on every rank (picklable: a module-level function); the
        results by rank. The first rank to fail raises ``RuntimeError`` with its traceback."""
        if not self._procs:
            self._start()
        for inbox in self._inboxes:
            inbox.put((fn, args))
        results: Dict[int, Any] = {}
        try:
            for _ in range(self.world):
                rank, status, payload = self._out.get(timeout=self.timeout)
                if status != "ok":
                    raise RuntimeError(f"rank {rank} failed:\n{payload}")
                results[rank] = payload
        except queue.Empty:
            self.close(kill=True)
            raise RuntimeError(f"{fn.__name__}: no result from some rank within {self.timeout:.0f} s") from None
        except BaseException:
            self.close(kill=True)
            raise
        return [results[r] for r in range(self.world)]

    def close(self, kill: bool = False) -> None:
        """Stop the ranks (``kill``: at once); files the simulated nodes left behind are an error."""
        if not self._procs:
            return
        if not kill:
            for inbox in self._inboxes:
                inbox.put(None)
        for p in self._procs:
            p.join(timeout=5 if kill else 30)
            if p.is_alive():
                p.kill()
                p.join()
        self._procs, self._inboxes = [], []
        left = sorted(str(f) for f in Path(self._shm_root).rglob("*") if f.is_file()) if self._shm_root else []
        if self._shm_root:
            shutil.rmtree(self._shm_root, ignore_errors=True)
        if left and not kill:
            raise RuntimeError(f"RankPool: the simulated nodes left shared-memory files behind: {left}")


class Scenarios(Sequence[Mapping[str, Any]]):
    """Named scenarios on one pool, each run when a test first reads it, by rank:
    ``results[rank][name]`` (the shape a module-scoped ``run_ranks`` fixture returned).

    ``scenarios[name]`` is ``(fn, args)`` for :meth:`RankPool.run`. A failed scenario raises
    again, without running again, in every test that reads it.
    """

    def __init__(self, pool: RankPool, scenarios: Mapping[str, Job]) -> None:
        self.pool = pool
        self.runs = Runs({name: functools.partial(pool.run, fn, *args) for name, (fn, args) in scenarios.items()}, "scenario")

    def results(self, name: str) -> List[Any]:
        """Scenario ``name``'s results by rank."""
        return self.runs[name]

    def __len__(self) -> int:
        return self.pool.world

    def __getitem__(self, rank: Any) -> Any:
        if isinstance(rank, slice):
            return [self[r] for r in range(*rank.indices(self.pool.world))]
        if not -self.pool.world <= rank < self.pool.world:
            raise IndexError(rank)
        return _RankView(self, rank % self.pool.world)


class _RankView(Mapping[str, Any]):
    """One rank's results of every scenario, each run on first read."""

    def __init__(self, scenarios: Scenarios, rank: int) -> None:
        self._scenarios, self._rank = scenarios, rank

    def __getitem__(self, name: str) -> Any:
        return self._scenarios.runs[name][self._rank]

    def __iter__(self) -> Iterator[str]:
        return iter(self._scenarios.runs)

    def __len__(self) -> int:
        return len(self._scenarios.runs)


def pooled(world: int, jobs: Mapping[Any, Job], nodes: int = 1, timeout: float = 900.0) -> Iterator[Scenarios]:
    """A module fixture's body: one pool for the module, its scenarios run as tests read them.

    ``@pytest.fixture(scope="module")`` then ``def world2(): yield from pooled(2, jobs)``.
    """
    pool = RankPool(world, nodes=nodes, timeout=timeout)
    try:
        yield Scenarios(pool, jobs)
    finally:
        pool.close()
