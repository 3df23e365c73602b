"""Where a step of the DLRM example goes: wall-clock time of the calls a training step makes.

Runs ``examples/dlrm/train.py`` (every argument is passed on) with timers around the pipeline's
step and the calls inside it, and prints rank 0's milliseconds per step for each. Calls nest (the
engine's ``apply_gradients`` runs inside ``backward``), so the rows do not add up; compare one row
across runs, e.g. L = 10 against L = 0:

    torchrun --nproc_per_node=2 benchmarks/time_dlrm_calls.py --sharder frugal --lookahead 10 \\
        --steps 800 --batch-size 128 --threads 1 --no-progress

Rows: ``progress`` (the whole step), ``lookahead_rows`` / ``announce`` (a batch announced ahead:
its unique rows, then the engines told), ``group_rows`` (a batch's unique rows, wherever computed),
``snapshot`` / ``plan.submit`` (the pipeline's copy of a batch read, handed to the planner),
``lookup.plan`` (a batch planned ahead), ``plan.wait`` (the training thread waiting for a plan),
``lookup.forward``, ``pool`` (the pooling's ``embedding_bag``), ``gate.wait``, ``backward``,
``optimizer.step`` and the engine's public calls.

The first ``--skip-steps`` steps (default 10) are left out: they include the pipeline's fill,
where L + 1 batches are read at once and each waits for the planner to copy the one before.

Each thread's calls are counted apart: the training thread's first, then the planner's, the
exchange worker's, the loader's and the rest. The last line, ``frugal host work``, is the training
thread's frugal calls less the gathers, the pooling and the waits (gate, planner): what planning
ahead and the exchange worker are to take off it (``lookup.forward`` - ``engine.lookup`` - ``pool``
- ``gate.wait`` + ``announce`` + ``engine.apply_gradients`` + ``snapshot`` + ``plan.submit``), per
batch: each call's mean, as the batches announced during the first steps make fewer calls of
``announce`` and ``plan.submit`` than counted steps. Each row also gives the thread's own CPU
time in those calls (``time.thread_time``): wall time beyond it is time the thread was not
running, e.g. waiting for the GIL that the planner or the exchange worker holds, or for a core.
"""
from __future__ import annotations

import argparse
import atexit
import collections
import functools
import os
import runpy
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, DefaultDict, Dict, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torchrec.optim.keyed import CombinedOptimizer  # noqa: E402

import torchrec_frugal.torchrec.train_pipeline.batch_planner as batch_planner  # noqa: E402
import torchrec_frugal.torchrec.train_pipeline.train_pipelines as frugal_pipeline  # noqa: E402
from torchrec_frugal.host.control_record import Control  # noqa: E402
from torchrec_frugal.engine.frugal_engine import FrugalEngine  # noqa: E402
from torchrec_frugal.metrics import WAIT_GATE  # noqa: E402
from torchrec_frugal.torchrec.train_pipeline.batch_planner import BatchPlanner  # noqa: E402
from torchrec_frugal.torchrec.embedding_lookup import FrugalEmbeddingLookup  # noqa: E402
from torchrec_frugal.torchrec.embedding_types import FrugalShardedModuleMixin  # noqa: E402
from torchrec_frugal.torchrec.train_pipeline.train_pipelines import FrugalTrainPipeline  # noqa: E402

Key = Tuple[str, str]  # (thread, label)
SECONDS: DefaultDict[Key, float] = collections.defaultdict(float)
CPU_SECONDS: DefaultDict[Key, float] = collections.defaultdict(float)  # the thread's own CPU time
CALLS: DefaultDict[Key, int] = collections.defaultdict(int)
THREADS = ("training", "frugal-planner", "frugal-exchange", "frugal-lookahead", "frugal-flusher")


def thread_kind() -> str:
    """The thread a call runs on: ``training``, or the name of a helper thread without its rank."""
    t = threading.current_thread()
    if t is threading.main_thread():
        return "training"
    return next((k for k in THREADS[1:] if t.name.startswith(k)), "other")


def timed(owner: Any, name: str, label: str, when: Optional[Callable[..., bool]] = None) -> None:
    """Replace ``owner.name`` by the same call that adds its wall time to ``label`` on the thread
    it runs on (only the calls for which ``when(*args)`` holds, if given)."""
    fn: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if when is not None and not when(*args):
            return fn(*args, **kwargs)
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            key = (thread_kind(), label)
            SECONDS[key] += time.perf_counter() - t0
            CPU_SECONDS[key] += time.thread_time() - c0
            CALLS[key] += 1

    setattr(owner, name, wrapper)


def frugal_host_work_s(seconds: Dict[Key, float]) -> float:
    """The training thread's frugal calls less the gathers, the pooling and the gate's waits, per
    batch (the sum of each call's mean: each is called once a batch)."""
    def per_call(label: str) -> float:
        key = ("training", label)
        return seconds.get(key, 0.0) / CALLS[key] if CALLS.get(key) else 0.0

    plus = ("lookup.forward", "announce", "engine.apply_gradients", "snapshot", "plan.submit")
    return sum(map(per_call, plus)) - sum(map(per_call, ("engine.lookup", "pool", "gate.wait")))


def leave_out(steps: int) -> None:
    """Forget what the first ``steps`` steps timed (call after :func:`timed` of ``progress``)."""
    fn = FrugalTrainPipeline.progress
    done = [0]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            done[0] += 1
            if done[0] == steps:
                for d in (SECONDS, CPU_SECONDS, CALLS):
                    d.clear()

    setattr(FrugalTrainPipeline, "progress", wrapper)


def report(skipped: int) -> None:
    steps = CALLS[("training", "progress")]
    if os.environ.get("RANK", "0") != "0" or not steps:
        return
    print(f"\nrank 0, {steps} steps after the first {skipped}: ms per step (calls per step; the thread's own CPU ms), by thread")
    kinds = sorted({k for k, _ in SECONDS}, key=lambda k: THREADS.index(k) if k in THREADS else len(THREADS))
    for kind in kinds:
        print(f"[{kind}]")
        for key in sorted((k for k in SECONDS if k[0] == kind), key=lambda k: -SECONDS[k]):
            print(
                f"  {key[1]:<28} {1e3 * SECONDS[key] / steps:8.3f}  ({CALLS[key] / steps:.2f}; "
                f"cpu {1e3 * CPU_SECONDS[key] / steps:.3f})"
            )
    print(
        f"frugal host work (training thread, less gathers, pooling, gate waits) {1e3 * frugal_host_work_s(SECONDS):.3f}"
        f" (its own CPU time {1e3 * frugal_host_work_s(CPU_SECONDS):.3f}) ms per batch"
    )


def main() -> None:
    timed(FrugalTrainPipeline, "progress", "progress")
    timed(FrugalShardedModuleMixin, "lookahead_rows", "lookahead_rows")
    timed(FrugalShardedModuleMixin, "announce", "announce")
    timed(FrugalShardedModuleMixin, "announce_plans", "announce")
    timed(FrugalEmbeddingLookup, "group_rows", "group_rows")
    timed(FrugalEmbeddingLookup, "forward", "lookup.forward")
    timed(FrugalEmbeddingLookup, "plan", "lookup.plan")
    for module in (batch_planner, frugal_pipeline):  # where the copy of a batch is called from
        if hasattr(module, "snapshot"):
            timed(module, "snapshot", "snapshot")
    timed(Future, "result", "plan.wait")  # the pipeline's futures are its batches' plans
    timed(BatchPlanner, "submit", "plan.submit")
    timed(F, "embedding_bag", "pool")
    timed(Control, "wait", "gate.wait", when=lambda control, what, *rest: what == WAIT_GATE)
    for name in ("push_lookahead", "begin_step", "lookup", "apply_gradients"):
        timed(FrugalEngine, name, "engine." + name)
    timed(torch.Tensor, "backward", "backward")
    timed(CombinedOptimizer, "step", "optimizer.step")
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--skip-steps", type=int, default=10, help="first steps not counted (the pipeline's fill)")
    args, rest = p.parse_known_args()
    leave_out(args.skip_steps)
    atexit.register(report, args.skip_steps)
    sys.argv = [str(ROOT / "examples" / "dlrm" / "train.py")] + rest
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
