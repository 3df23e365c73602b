"""Frugal's host CPU per step and rank, by thread and by call, through the engine's public API.

On a GPU box a step lasts as long as the slowest of the device's work and the host CPU each of a
rank's threads spends on it (docs/performance.md, "Host CPU per step, by thread and call"). This
measures that host CPU on CPU. Each rank (``--world`` spawned processes, one gloo group) runs

* the engine loop: ``push_lookahead`` of step s + L, ``begin_step``, ``lookup``, the step's
  gradients coalesced (``torch.unique`` + ``index_add_``), ``apply_gradients`` (every call with the
  batch's raw ids, duplicates and all; ``drain`` after the last step), then
* the same loop's ``torch.unique`` + ``index_add_`` alone,

and Frugal's host CPU per step is the difference of the process's CPU time, per step. Beside it,
each thread's CPU per step (training thread, exchange worker, lookahead worker, flushers; "other"
is the process less those). ``--calls`` runs again with the engine's main calls wrapped, and gives
each call's own CPU per step (its time less that of the wrapped calls inside it) and the thread
it ran on; the wrapping costs a microsecond or two a call, so its totals run a little higher.

The workload is the paper's criteo shape: one table of ``--rows`` rows, ``--ids`` Zipf(``--zipf``)
ids a sample over a permutation of its rows, ``--batch`` samples per rank, L = ``--lookahead``,
``--cache-ratio`` of the rows cached per rank, row-wise Adagrad. ``--layouts`` picks the CPU
layout (``FrugalConfig()`` on CPU: no flusher, uncached rows updated in host memory) and the
accelerator layout run on CPU (``FrugalConfig(flush_workers=1, update_uncached_in_host=False)``:
a flusher thread, uncached rows updated in dynamic slots and flushed).

``--checkouts A B`` measures other checkouts of this project (each child runs with ``PYTHONPATH``
the checkout), alternating their order in each repetition; the medians and the ratio of each pair
are printed, and whether the tables after each run (flushed, then hashed) are equal bit for bit
across the checkouts. CPU time, not wall time: other processes on the machine move it less.

    python benchmarks/host_cpu.py                                   # both layouts, batch 1024 and 128
    python benchmarks/host_cpu.py --calls --repeats 1               # and the per-call table
    git worktree add ../before <commit>
    python benchmarks/host_cpu.py --checkouts ../before . --repeats 3
    python benchmarks/host_cpu.py --device cuda --calls --repeats 1   # on a GPU: the ranks share GPU 0
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from benchmarks.thread_cpu import cpu_s, thread_kind  # noqa: E402

LAYOUTS = ("cpu", "accelerator")

# (module, class, method, label): the calls --calls times, each by its own CPU (callees wrapped
# here are not counted twice). A name the checkout lacks is skipped.
CALLS: Tuple[Tuple[str, str, str, str], ...] = (
    ("engine.frugal_engine", "FrugalEngine", "push_lookahead", "push_lookahead"),
    ("engine.frugal_engine", "FrugalEngine", "begin_step", "begin_step"),
    ("engine.frugal_engine", "FrugalEngine", "lookup", "lookup"),
    ("engine.frugal_engine", "FrugalEngine", "apply_gradients", "apply_gradients"),
    ("engine.step_update", "StepUpdate", "wait_gate", "gate (waiting)"),
    ("engine.step_update", "StepUpdate", "serve_gate", "gate (served by the exchange worker)"),
    ("engine.step_update", "StepUpdate", "run", "update (the rest)"),
    ("engine.lookahead.ring", "LookaheadRing", "publish", "announce: publish to the ring"),
    ("engine.lookahead.ring", "LookaheadRing", "collect", "ingest: collect from the rings"),
    ("engine.lookahead.feed", "LookaheadFeed", "ingest_available", "ingest (the rest)"),
    ("engine.lookahead.window", "LookaheadWindow", "add_step", "window: add a step"),
    ("engine.lookahead.window", "LookaheadWindow", "retire", "window: retire a step"),
    ("engine.lookahead.window", "LookaheadWindow", "priorities", "window: priorities"),
    ("engine.flush.priority_queue", "TwoLevelQueue", "upsert", "queue: upsert"),
    ("engine.flush.priority_queue", "TwoLevelQueue", "pop_min", "queue: pop"),
    ("engine.flush.priority_queue", "TwoLevelQueue", "pop_through", "queue: pop through"),
    ("engine.flush.priority_queue", "TwoLevelQueue", "undefer", "queue: undefer"),
    ("engine.flush.priority_queue", "TwoLevelQueue", "min_priority", "queue: min"),
    ("engine.flush.priority_queue", "PendingQueue", "contains", "queue: contains"),
    ("engine.flush.priority_queue", "PendingQueue", "priority_of", "queue: priority_of"),
    ("engine.flush.priority_queue", "PendingQueue", "advance", "queue: advance"),
    ("engine.flush.priority_queue", "PendingQueue", "bucket_sizes", "queue: bucket sizes"),
    ("engine.gradient_exchange", "GradientExchange", "stage", "exchange: stage to the mailbox"),
    ("engine.gradient_exchange", "GradientExchange", "sum_owned", "exchange: sum over ranks"),
    ("engine.owner_update", "OwnerUpdate", "apply", "owner update"),
    ("engine.flush.flusher", "Flusher", "flush_once", "flush"),
    ("engine.flush.flusher", "Flusher", "publish_progress", "flush: publish progress"),
    ("engine.flush.flusher", "Flusher", "take_counts", "metrics: flush counts"),
    ("host.control_record", "Control", "wait", "waits on counters (polling)"),
)
# Idle tasks of the engine's workers timed as a call, by the kind of the worker's thread: a flusher
# thread flushes in its idle task, which it takes through Worker's public ``idle`` argument.
IDLE_TASKS: Dict[str, str] = {"flusher": "flush"}


class CallClock:
    """Own CPU time of wrapped methods, per (label, thread kind): a call's time less its wrapped callees'."""

    def __init__(self) -> None:
        self.own: Dict[Tuple[str, str], float] = defaultdict(float)
        self.calls: Dict[Tuple[str, str], int] = defaultdict(int)
        self._local = threading.local()
        self._lock = threading.Lock()

    def wrap(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = self._local.__dict__.setdefault("stack", [])
            stack.append(0.0)  # CPU of wrapped callees
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - t0
                inner = stack.pop()
                if stack:
                    stack[-1] += spent
                key = (label, thread_kind(threading.current_thread().name))
                with self._lock:
                    self.own[key] += spent - inner
                    self.calls[key] += 1

        return timed

    def install(self) -> None:
        import importlib

        for module, cls_name, method, label in CALLS:
            try:
                cls = getattr(importlib.import_module(f"torchrec_frugal.{module}"), cls_name)
            except (ImportError, AttributeError):
                continue
            if method in vars(cls):
                setattr(cls, method, self.wrap(vars(cls)[method], label))
        try:
            from torchrec_frugal.worker import Worker
        except ImportError:
            return
        init, clock = Worker.__init__, self

        @functools.wraps(init)
        def worker_init(worker: Any, name: str, *args: Any, **kwargs: Any) -> None:
            label = IDLE_TASKS.get(thread_kind(name))
            if label is not None and kwargs.get("idle") is not None:
                kwargs["idle"] = clock.wrap(kwargs["idle"], label)
            init(worker, name, *args, **kwargs)

        Worker.__init__ = worker_init  # type: ignore[method-assign]

    def take(self) -> Dict[str, Tuple[float, int]]:
        with self._lock:
            out = {f"{label}|{kind}": (s, self.calls[(label, kind)]) for (label, kind), s in self.own.items()}
            self.own.clear()
            self.calls.clear()
        return out


def layout_config(layout: str, lookahead: int, cache_ratio: float, device: str = "cpu") -> Any:
    from torchrec_frugal.config import FrugalConfig

    if layout == "cpu" or device == "cuda":  # on CUDA the engine's own choices are the accelerator layout
        return FrugalConfig(lookahead=lookahead, cache_ratio=cache_ratio)
    return FrugalConfig(lookahead=lookahead, cache_ratio=cache_ratio, flush_workers=1, update_uncached_in_host=False)


def rank_main(rank: int, world: int, a: Dict[str, Any]) -> Dict[str, Any]:
    """One rank: the engine loop, then the same loop without the engine; CPU seconds of each."""
    import torch

    from torchrec_frugal.config import OptimizerSpec, TableSpec
    from torchrec_frugal.engine.frugal_engine import FrugalEngine
    from torchrec_frugal.presample import count_ids
    try:
        from torchrec_frugal.synthetic_ids import ZipfIds
    except ImportError:  # a checkout from before the module's rename, measured beside this one
        from torchrec_frugal.workload import ZipfIds  # type: ignore[no-redef]

    clock = CallClock() if a["calls"] else None
    if clock is not None:
        clock.install()
    L, B, d = a["lookahead"], a["batch"] * a["ids"], a["dim"]
    warmup, steps = a["warmup"], a["steps"]
    total = warmup + steps
    zipf = ZipfIds(a["rows"], a["zipf"], seed=a["seed"])  # one permutation, the same on every rank
    rng = np.random.default_rng([a["seed"], rank])
    batches = [torch.from_numpy(zipf.sample(B, rng)) for _ in range(total + L)]
    counts = count_ids(([b] for b in batches[: a["presample"]]), [a["rows"]])
    device = torch.device(a["device"])
    grad_in = torch.randn(B, d, generator=torch.Generator().manual_seed(a["seed"] + rank)).to(device)
    cfg = layout_config(a["layout"], L, a["cache_ratio"], a["device"])
    opt = OptimizerSpec(kind="rowwise_adagrad", lr=0.01)

    def coalesce(ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The step's unique rows (host ids, as the engine takes them) and their summed gradients (on the device)."""
        uniq, inv = torch.unique(ids.to(device), return_inverse=True)
        return uniq.cpu(), torch.zeros(uniq.shape[0], d, device=device).index_add_(0, inv, grad_in)

    unique_rows = []
    with FrugalEngine([TableSpec("t", a["rows"], d)], opt, cfg, device=device, presample_counts=counts, seed=a["seed"]) as eng:
        threads = [threading.current_thread()] + list(eng.background_threads)
        kinds = ["train"] + [thread_kind(t.name) for t in threads[1:]]

        def snapshot() -> List[float]:
            return [time.process_time()] + [cpu_s(t) for t in threads]

        for t in range(L):
            eng.push_lookahead(batches[t])
        c0: List[float] = []
        for s in range(total):
            if s == warmup:
                eng.drain()
                if clock is not None:
                    clock.take()
                c0 = snapshot()
            if L:
                eng.push_lookahead(batches[s + L])
            eng.begin_step(batches[s])
            eng.lookup(batches[s])
            uniq, grads = coalesce(batches[s])
            eng.apply_gradients(uniq, grads)
            if s >= warmup:
                unique_rows.append(uniq.shape[0])
        eng.drain()
        c1 = snapshot()
        calls = clock.take() if clock is not None else {}
        eng.flush()  # untimed: the tables as the run left them, to compare checkouts bit for bit
        weights, state = eng.read_rows()
        digest = hashlib.sha256(weights.numpy().tobytes() + state.numpy().tobytes()).hexdigest()[:16]
    p0 = time.process_time()
    for s in range(warmup, total):
        coalesce(batches[s])
    base = time.process_time() - p0
    per_thread: Dict[str, float] = defaultdict(float)
    for kind, x0, x1 in zip(kinds, c0[1:], c1[1:]):
        per_thread[kind] += (x1 - x0) / steps
    process = (c1[0] - c0[0]) / steps
    per_thread["other"] += process - sum(per_thread.values())
    return {
        "process_s": process,
        "baseline_s": base / steps,
        "host_s": process - base / steps,
        "threads_s": dict(per_thread),
        "calls": {k: (s / steps, n / steps) for k, (s, n) in calls.items()},
        "unique_rows": float(np.mean(unique_rows)),
        "digest": digest,
    }


def measure(a: Dict[str, Any]) -> Dict[str, Any]:
    """One measurement (one layout, one batch) on ``world`` ranks, averaged over the ranks."""
    from torchrec_frugal.host.launch import run_ranks

    per_rank = run_ranks(a["world"], rank_main, a, timeout=1800, pg_timeout_s=300)
    out: Dict[str, Any] = {k: float(np.mean([r[k] for r in per_rank])) for k in ("process_s", "baseline_s", "host_s", "unique_rows")}
    kinds = sorted({k for r in per_rank for k in r["threads_s"]})
    out["threads_s"] = {k: float(np.mean([r["threads_s"].get(k, 0.0) for r in per_rank])) for k in kinds}
    out["digest"] = per_rank[0]["digest"]
    keys = sorted({k for r in per_rank for k in r["calls"]})
    out["calls"] = {
        k: [float(np.mean([r["calls"].get(k, (0.0, 0.0))[i] for r in per_rank])) for i in (0, 1)] for k in keys
    }
    return out


def child(args: argparse.Namespace, root: Path, layout: str, batch: int, calls: bool) -> Dict[str, Any]:
    """One measurement in a fresh interpreter that imports the package from ``root``."""
    a = {k: getattr(args, k) for k in ("world", "rows", "dim", "ids", "zipf", "lookahead", "cache_ratio", "steps",
                                       "warmup", "presample", "seed", "device")}  # fmt: skip
    a.update(layout=layout, batch=batch, calls=calls)
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(a)]
    done = subprocess.run(cmd, env=env, cwd=root, check=True, capture_output=True, text=True, timeout=3600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def us(x: float) -> str:
    return f"{1e6 * x:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1_688_129, help="rows of the one table (criteo-kaggle at scale 0.05)")
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--ids", type=int, default=26, help="ids a sample")
    ap.add_argument("--zipf", type=float, default=1.2)
    ap.add_argument("--batches", type=int, nargs="+", default=[1024, 128], help="samples per rank and step")
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the ranks share GPU 0, and the engine's own (accelerator) layout is the only one")
    ap.add_argument("--lookahead", type=int, default=10)
    ap.add_argument("--cache-ratio", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=150, help="timed steps")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--presample", type=int, default=20, help="batches counted to pick the hot rows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calls", action="store_true", help="also time each call (a run of its own per layout and batch)")
    ap.add_argument("--checkouts", type=Path, nargs="+", default=[ROOT], help="checkouts to measure, alternating")
    ap.add_argument("--json", type=Path, help="write every measurement here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("host_cpu.py --device cuda: torch sees no CUDA device")
        args.layouts = ["accelerator"]
    if args.child:
        sys.path.insert(0, os.environ.get("PYTHONPATH", str(ROOT)))
        print(json.dumps(measure(json.loads(args.child))))
        return

    roots = [c.resolve() for c in args.checkouts]
    cases = [(layout, b) for layout in args.layouts for b in args.batches]
    runs: Dict[Tuple[str, str, int], List[Dict[str, Any]]] = defaultdict(list)
    for rep in range(args.repeats):
        for layout, b in cases:
            order = roots if rep % 2 == 0 else roots[::-1]
            for root in order:
                r = child(args, root, layout, b, calls=False)
                runs[(str(root), layout, b)].append(r)
                print(f"rep {rep + 1} {root.name} {layout} b{b}: host {us(r['host_s'])} us/step "
                      f"({r['unique_rows']:.0f} unique rows)", file=sys.stderr, flush=True)
    calls: Dict[Tuple[str, str, int], Dict[str, Any]] = {}
    if args.calls:
        for layout, b in cases:
            for root in roots:
                calls[(str(root), layout, b)] = child(args, root, layout, b, calls=True)

    print(f"\nworld {args.world}, one table of {args.rows:,} rows x dim {args.dim}, {args.ids} Zipf({args.zipf}) ids a "
          f"sample, L {args.lookahead}, cache {args.cache_ratio}, row-wise Adagrad; {args.steps} steps (+{args.warmup}), "
          f"medians of {args.repeats}; CPU us per step and rank\n")
    kinds = ("train", "exchange", "lookahead", "flusher", "other")
    print("| checkout | layout | batch | unique rows | host CPU | " + " | ".join(kinds) + " | process | unique + index_add |")
    print("|---|---|---:|" + "---:|" * (len(kinds) + 4))
    med: Dict[Tuple[str, str, int], float] = {}
    for (root, layout, b), rs in runs.items():
        m = {k: statistics.median(r[k] for r in rs) for k in ("host_s", "process_s", "baseline_s", "unique_rows")}
        th = {k: statistics.median(r["threads_s"].get(k, 0.0) for r in rs) for k in kinds}
        med[(root, layout, b)] = m["host_s"]
        print(f"| {Path(root).name} | {layout} | {b} | {m['unique_rows']:,.0f} | {us(m['host_s'])} | "
              + " | ".join(us(th[k]) for k in kinds) + f" | {us(m['process_s'])} | {us(m['baseline_s'])} |")
    if len(roots) > 1 and args.repeats:
        print("\n| layout | batch | " + " | ".join(r.name for r in roots[1:]) + f" / {roots[0].name}, paired median | tables after the run |")
        print("|---|---:|" + "---:|" * (len(roots) - 1) + "---|")
        for layout, b in cases:
            first = runs[(str(roots[0]), layout, b)]
            ratios = [
                statistics.median(r["host_s"] / f["host_s"] for r, f in zip(runs[(str(root), layout, b)], first))
                for root in roots[1:]
            ]
            same = all(r["digest"] == f["digest"] for root in roots[1:] for r, f in zip(runs[(str(root), layout, b)], first))
            print(f"| {layout} | {b} | " + " | ".join(f"{x:.2f}" for x in ratios) + f" | {'equal' if same else 'DIFFER'} |")
    for (root, layout, b), r in calls.items():
        print(f"\nCalls, {Path(root).name}, {layout} layout, batch {b}: own CPU us per step (calls per step), by thread")
        print("\n| call | thread | own CPU us | calls |\n|---|---|---:|---:|")
        for key, (s, n) in sorted(r["calls"].items(), key=lambda kv: -kv[1][0]):
            label, kind = key.split("|")
            print(f"| {label} | {kind} | {us(s)} | {n:.1f} |")
        th = r["threads_s"]
        print("\nthreads: " + ", ".join(f"{k} {us(v)}" for k, v in th.items()) + f"; host CPU {us(r['host_s'])}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "child"},
                   "runs": {f"{Path(k[0]).name}|{k[1]}|{k[2]}": v for k, v in runs.items()},
                   "calls": {f"{Path(k[0]).name}|{k[1]}|{k[2]}": v for k, v in calls.items()}}
        args.json.write_text(json.dumps(payload, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
