"""Where a step of the DLRM example goes: wall-clock time of the calls a training step makes.

Runs ``examples/dlrm/train.py`` (every argument is passed on) with timers around the pipeline's
step and the calls inside it, and prints rank 0's milliseconds per step for each. Calls nest (the
engine's ``apply_gradients`` runs inside ``backward``), so the rows do not add up; compare one row
across runs, e.g. L = 10 against L = 0:

    torchrun --nproc_per_node=2 benchmarks/time_dlrm_calls.py --sharder frugal --lookahead 10 \\
        --steps 800 --batch-size 128 --threads 1 --no-progress

Rows: ``progress`` (the whole step), ``lookahead_rows`` / ``announce`` (a batch announced ahead:
its unique rows, then the engines told), ``group_rows`` (a batch's unique rows, wherever computed),
``lookup.plan`` (a batch planned ahead: on the planner thread unless ``--planner inline``),
``lookup.forward``, ``backward``, ``optimizer.step`` and the engine's public calls. The timers
count every thread's calls: ``lookup.plan`` and the ``group_rows`` inside it run beside the
training thread with the default planner.
"""
from __future__ import annotations

import atexit
import collections
import functools
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any, Callable, DefaultDict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torchrec.optim.keyed import CombinedOptimizer  # noqa: E402

from torchrec_frugal.engine import FrugalEngine  # noqa: E402
from torchrec_frugal.torchrec.embedding_lookup import FrugalEmbeddingLookup  # noqa: E402
from torchrec_frugal.torchrec.embedding_types import FrugalShardedModuleMixin  # noqa: E402
from torchrec_frugal.torchrec.pipeline import FrugalTrainPipeline  # noqa: E402

SECONDS: DefaultDict[str, float] = collections.defaultdict(float)
CALLS: DefaultDict[str, int] = collections.defaultdict(int)


def timed(owner: Any, name: str, label: str) -> None:
    """Replace ``owner.name`` by the same call that adds its wall time to ``label``."""
    fn: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - t0
            CALLS[label] += 1

    setattr(owner, name, wrapper)


def report() -> None:
    steps = CALLS["progress"]
    if os.environ.get("RANK", "0") != "0" or not steps:
        return
    print(f"\nrank 0, {steps} steps: ms per step (calls per step)")
    for label in sorted(SECONDS, key=lambda k: -SECONDS[k]):
        print(f"  {label:<28} {1e3 * SECONDS[label] / steps:8.3f}  ({CALLS[label] / steps:.2f})")


def main() -> None:
    timed(FrugalTrainPipeline, "progress", "progress")
    timed(FrugalShardedModuleMixin, "lookahead_rows", "lookahead_rows")
    timed(FrugalShardedModuleMixin, "announce", "announce")
    timed(FrugalShardedModuleMixin, "announce_plans", "announce")
    timed(FrugalEmbeddingLookup, "group_rows", "group_rows")
    timed(FrugalEmbeddingLookup, "forward", "lookup.forward")
    timed(FrugalEmbeddingLookup, "plan", "lookup.plan")
    for name in ("push_lookahead", "begin_step", "lookup", "apply_gradients"):
        timed(FrugalEngine, name, "engine." + name)
    timed(torch.Tensor, "backward", "backward")
    timed(CombinedOptimizer, "step", "optimizer.step")
    atexit.register(report)
    sys.argv = [str(ROOT / "examples" / "dlrm" / "train.py")] + sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
