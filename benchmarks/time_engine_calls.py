"""The engine's calls on the training thread, timed alone: what a planned step costs that thread.

One rank (no peers) trains planned steps of one table with the exchange worker, the way
FrugalTrainPipeline drives it: ``push_lookahead`` of step s + L, ``begin_step``, ``lookup``,
``apply_gradients``. Before each ``begin_step`` the script waits for the previous update, so the
gate is open and its row is the call's own cost, not the wait. Prints the median and minimum
microseconds of each call, wall and the thread's own CPU time.

``--busy N`` runs N processes that spin on a core each meanwhile: the exchange worker, woken by
``apply_gradients``, then has to get a core from them. This compares the calls' cost on a
machine with a free core with their cost on a machine whose cores are all taken (as in the DLRM
example on two cores, where the loader process, the planner and the exchange worker share them).

    python benchmarks/time_engine_calls.py                # a core free
    python benchmarks/time_engine_calls.py --busy 2       # every core of a 2-core machine busy
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

import torch  # noqa: E402

from torchrec_frugal.config import FrugalConfig, OptimizerSpec, TableSpec  # noqa: E402
from torchrec_frugal.engine.frugal_engine import FrugalEngine  # noqa: E402

CALLS = ("push_lookahead", "begin_step", "lookup", "apply_gradients")


def spin(stop: Any) -> None:
    """Keep one core busy until ``stop`` is set."""
    while not stop.is_set():
        pass


def time_calls(rows: int, dim: int, batch: int, steps: int, lookahead: int, shm_dir: str) -> Dict[str, List[Tuple[float, float]]]:
    """Per call, (wall s, own CPU s) of every timed step."""
    torch.set_num_threads(1)
    cfg = FrugalConfig(lookahead=lookahead, cache_ratio=0.05, shm_dir=shm_dir)
    g = torch.Generator().manual_seed(0)
    out: Dict[str, List[Tuple[float, float]]] = {c: [] for c in CALLS}
    warmup = 20
    with FrugalEngine([TableSpec("t", rows, dim)], OptimizerSpec("rowwise_adagrad", lr=0.1), cfg, seed=1) as eng:
        plans = [eng.plan_step(torch.unique(torch.randint(0, rows, (batch,), generator=g))) for _ in range(steps + lookahead)]
        for s in range(lookahead):
            eng.push_lookahead(plans[s])

        def timed(name: str, s: int, fn: Callable[..., Any], *args: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            result = fn(*args)
            if s >= warmup:
                out[name].append((time.perf_counter() - t0, time.thread_time() - c0))
            return result

        for s in range(steps):
            eng.drain()  # the previous update is done: the gate below is open
            if lookahead:
                timed("push_lookahead", s, eng.push_lookahead, plans[s + lookahead])
            timed("begin_step", s, eng.begin_step, plans[s])
            w = timed("lookup", s, eng.lookup, plans[s])
            timed("apply_gradients", s, eng.apply_gradients, plans[s], torch.ones_like(w))
        eng.drain()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=20_000, help="ids a step (before the unique)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lookahead", type=int, default=10)
    p.add_argument("--busy", type=int, default=0, help="processes spinning on a core each meanwhile")
    args = p.parse_args()
    stop = mp.Event()
    spinners = [mp.Process(target=spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for proc in spinners:
        proc.start()
    try:
        with tempfile.TemporaryDirectory(prefix="frugal_calls_") as shm_dir:
            out = time_calls(args.rows, args.dim, args.batch, args.steps, args.lookahead, shm_dir)
    finally:
        stop.set()
        for proc in spinners:
            proc.join()
    print(f"µs per call, {args.steps} steps less 20 of warm-up, {args.busy} busy processes")
    print(f"{'call':<18} {'wall median':>12} {'wall min':>10} {'cpu median':>11}")
    for name in CALLS:
        if out[name]:
            wall = [w for w, _ in out[name]]
            cpu = [c for _, c in out[name]]
            print(f"{name:<18} {1e6 * statistics.median(wall):12.1f} {1e6 * min(wall):10.1f} {1e6 * statistics.median(cpu):11.1f}")


if __name__ == "__main__":
    main()
