"""How fast the training thread's Python runs inside a DLRM step, against the same Python warm.

Runs ``examples/dlrm/train.py`` (every argument is passed on) and, at three points of each step,
times a fixed probe (four reads of a tensor's ``device``, a 100-iteration loop, four
``torch.empty(0)``) three times in a row: where the step begins (``progress``), where the
frugal lookup's forward begins, and where its backward hands the gradients over (the autograd
hand-off, after the dense backward). The first run pays for whatever the step's kernels evicted
from the caches; the second and third show the same code warm. The probe is also timed before
and after training, with no step around it. Prints rank 0's medians in µs:

    python benchmarks/probe_cold_python.py --sharder frugal --config criteo-kaggle --scale 0.1 \\
        --steps 60 --threads 1 --no-progress --batch-size 1024
"""
from __future__ import annotations

import atexit
import collections
import os
import runpy
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, DefaultDict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

import torch  # noqa: E402

from torchrec_frugal.torchrec.embedding_kernel import FrugalStep  # noqa: E402
from torchrec_frugal.torchrec.embedding_lookup import FrugalEmbeddingLookup  # noqa: E402
from torchrec_frugal.torchrec.train_pipeline.train_pipelines import FrugalTrainPipeline  # noqa: E402

PROBE = torch.zeros(3)
RUNS = ("1st", "2nd", "3rd")
TIMES: DefaultDict[str, List[Tuple[float, float, float]]] = collections.defaultdict(list)
WARM_UP = 10  # steps left out of the medians


def probe(where: str) -> None:
    """Time the probe's three parts once, under ``where``."""
    t0 = time.perf_counter()
    PROBE.device, PROBE.device, PROBE.device, PROBE.device
    t1 = time.perf_counter()
    x = 0
    for i in range(100):
        x += i
    t2 = time.perf_counter()
    torch.empty(0), torch.empty(0), torch.empty(0), torch.empty(0)
    t3 = time.perf_counter()
    TIMES[where].append((t1 - t0, t2 - t1, t3 - t2))


def probed(owner: Any, name: str, where: str) -> None:
    """Run the probe three times in a row before each call of ``owner.name``."""
    fn: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for run in RUNS:
            probe(f"{where} {run}")
        return fn(*args, **kwargs)

    setattr(owner, name, wrapper)


def report() -> None:
    if os.environ.get("RANK", "0") != "0":
        return
    for _ in range(200):
        probe("idle, after training")
    print("\nrank 0: the probe's medians in µs (4x tensor.device, a 100-iteration loop, 4x torch.empty(0))")
    print(f"  {'where':<36} {'device':>8} {'loop':>8} {'empty':>8} {'runs':>6}")
    for where, rows in TIMES.items():
        rows = rows if where.startswith("idle") else rows[WARM_UP:]
        cols = [1e6 * statistics.median(r[i] for r in rows) for i in range(3)]
        print(f"  {where:<36} {cols[0]:8.2f} {cols[1]:8.2f} {cols[2]:8.2f} {len(rows):6d}")


def main() -> None:
    for _ in range(200):
        probe("idle, before training")
    probed(FrugalTrainPipeline, "progress", "step begins,")
    probed(FrugalEmbeddingLookup, "forward", "forward begins,")
    probed(FrugalStep, "apply", "backward hand-off,")
    atexit.register(report)
    sys.argv = [str(ROOT / "examples" / "dlrm" / "train.py")] + sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
