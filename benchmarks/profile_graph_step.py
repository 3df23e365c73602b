"""Where a step of the knowledge-graph example goes: torch.profiler over the timed steps, by thread.

Launch like train.py (its arguments pass through); after ``--warmup`` steps the profiler records
``--profile-steps`` steps on every thread of each rank, and rank 0 prints, per thread, the top
operators by self CPU time (ms per step) and the share of the step each thread spends in them:

    torchrun --nproc_per_node=2 benchmarks/profile_graph_step.py --dataset synthetic \\
        --synthetic-entities 2000000 --synthetic-triples 8000000 --model transe_l2 --dim 400 \\
        --batch-size 1024 --chunk-size 128 --negatives 128 --steps 60 --no-eval --log-every 0 \\
        --sharder frugal --profile-steps 30 [--profile-json out.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.append(str(Path(__file__).resolve().parents[1]))

import torch.distributed as dist  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from examples.graph import train as graph_train  # noqa: E402


class ProfiledPipeline:
    """A train pipeline whose ``progress`` runs under the profiler from step ``start`` for ``steps`` steps."""

    def __init__(self, pipeline: Any, start: int, steps: int) -> None:
        self.pipeline, self.start, self.steps = pipeline, start, steps
        self.calls = 0
        self.prof: Optional[profile] = None
        self.step_s: List[float] = []

    def progress(self, batches: Any) -> Any:
        if self.calls == self.start:
            self.prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
            self.prof.__enter__()
        t0 = time.perf_counter()
        out = self.pipeline.progress(batches)
        if self.prof is not None and len(self.step_s) < self.steps:
            self.step_s.append(time.perf_counter() - t0)
        self.calls += 1
        if self.calls == self.start + self.steps and self.prof is not None:
            self.prof.__exit__(None, None, None)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pipeline, name)


def report(prof: profile, steps: int, step_s: List[float], top: int) -> Dict[str, Any]:
    """Self CPU time per (thread, operator), ms per step; threads ordered by their total."""
    by_thread: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in prof.events():
        by_thread[int(e.thread)][e.name] += e.self_cpu_time_total / 1e3 / steps
    out: Dict[str, Any] = {"step_ms_median": 1e3 * sorted(step_s)[len(step_s) // 2], "threads": {}}
    for tid, ops in sorted(by_thread.items(), key=lambda kv: -sum(kv[1].values())):
        out["threads"][str(tid)] = {"total_ms": sum(ops.values()), "top": ops.most_common(top)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--profile-steps", type=int, default=30)
    ap.add_argument("--profile-top", type=int, default=25)
    ap.add_argument("--profile-json", default=None)
    mine, rest = ap.parse_known_args()
    args = graph_train.parse_args(rest)
    made: List[ProfiledPipeline] = []
    stock = graph_train.train_pipeline

    def wrapped(*a: Any, **k: Any) -> ProfiledPipeline:
        made.append(ProfiledPipeline(stock(*a, **k), args.warmup, mine.profile_steps))
        return made[-1]

    graph_train.train_pipeline = wrapped  # type: ignore[assignment]
    summary = graph_train.train(args)
    p = made[0]
    if dist.get_rank() == 0 and p.prof is not None:
        rep = report(p.prof, len(p.step_s), p.step_s, mine.profile_top)
        rep["samples_per_second"] = summary["samples_per_second"]
        print(f"[profile] step median {rep['step_ms_median']:.2f} ms; {summary['samples_per_second']:,.0f} triples/s")
        for tid, t in rep["threads"].items():
            print(f"[profile] thread {tid}: {t['total_ms']:.2f} ms/step self CPU")
            for name, ms in t["top"]:
                print(f"    {ms:8.3f}  {name}")
        if mine.profile_json:
            Path(mine.profile_json).write_text(json.dumps(rep, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
