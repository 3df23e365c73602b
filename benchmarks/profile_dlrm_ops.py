"""Which ops a DLRM step runs on the training thread, and for how long: stock and frugal alike.

Runs ``examples/dlrm/train.py`` (every argument but this script's own is passed on) under
``torch.profiler`` for the training steps ``--profile-steps FIRST LAST`` (1-based, steady state)
and prints rank 0's self CPU milliseconds per step of each op (and profiler range) run on the
training thread, largest first. Run it once per sharder to see where the two steps differ:

    python benchmarks/profile_dlrm_ops.py --sharder torchrec --sharding table_wise --config criteo-kaggle \\
        --scale 0.1 --steps 40 --threads 1 --no-progress --batch-size 4096
    python benchmarks/profile_dlrm_ops.py --sharder frugal --config criteo-kaggle \\
        --scale 0.1 --steps 40 --threads 1 --no-progress --batch-size 4096

Other threads (the planner, the exchange worker, the flushers) are left out: what they cost the
training thread shows in its own ops running slower, not in a row of theirs.
"""
from __future__ import annotations

import argparse
import atexit
import collections
import os
import runpy
import sys
from pathlib import Path
from typing import Any, Callable, DefaultDict, List

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist  # noqa: E402

from torchrec_frugal.torchrec.train_pipeline.train_pipelines import FrugalTrainPipeline  # noqa: E402

STEP = "progress (profile_dlrm_ops)"


class StepProfiler:
    """A CPU profile of the outermost ``progress()`` calls numbered ``first`` to ``last``."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.steps = 0
        self._depth = 0  # a pipeline's progress() may call its base class's
        self.prof = profile(activities=[ProfilerActivity.CPU])

    def wrap(self, cls: Any) -> None:
        progress: Callable[..., Any] = cls.progress

        def timed_progress(pipeline: Any, *args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            if self._depth == 1:
                self.steps += 1
                if self.steps == self.first:
                    self.prof.start()
            try:
                with record_function(STEP):  # marks the training thread in the profile
                    return progress(pipeline, *args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0 and self.steps == self.last:
                    self.prof.stop()

        cls.progress = timed_progress

    def report(self, top: int) -> None:
        if os.environ.get("RANK", "0") != "0" or self.steps < self.last:
            return
        main = next(e.thread for e in self.prof.events() if e.name == STEP)
        seconds: DefaultDict[str, float] = collections.defaultdict(float)
        calls: DefaultDict[str, int] = collections.defaultdict(int)
        for e in self.prof.events():
            if e.thread == main and e.name != STEP:
                seconds[e.name] += e.self_cpu_time_total / 1e3
                calls[e.name] += 1
        n = self.last - self.first + 1
        print(f"\nrank 0, steps {self.first}-{self.last}: training thread's self CPU ms per step, by op (calls per step)")
        print(f"  {'all ops':<64} {sum(seconds.values()) / n:9.3f}")
        for name in sorted(seconds, key=lambda k: -seconds[k])[:top]:
            print(f"  {name[:64]:<64} {seconds[name] / n:9.3f}  ({calls[name] / n:.1f})")


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--profile-steps", type=int, nargs=2, default=[15, 35], metavar=("FIRST", "LAST"))
    parser.add_argument("--top", type=int, default=40)
    args, rest = parser.parse_known_args(argv)
    first, last = args.profile_steps
    if not 1 <= first <= last:
        parser.error(f"--profile-steps: need 1 <= FIRST <= LAST, got {first} {last}")
    profiler = StepProfiler(first, last)
    for cls in (TrainPipelineSparseDist, FrugalTrainPipeline):
        profiler.wrap(cls)
    atexit.register(profiler.report, args.top)
    sys.argv = [str(ROOT / "examples" / "dlrm" / "train.py")] + rest
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
