"""Where a step of the knowledge-graph example goes: torch.profiler over the timed steps, by thread.

Launch like train.py (its arguments pass through); after ``--warmup`` steps the profiler records
``--profile-steps`` steps on every thread of each rank, and rank 0 prints, per thread, the top
operators by self CPU time (ms per step) and the share of the step each thread spends in them.
It also prints each thread's CPU time per step over the same steps, from the kernel's account
(``/proc/self/task/*/schedstat``), by the thread's name: the engine's threads run no torch operators
the profiler sees, and on a machine with as many cores as ranks their CPU is taken from the
training threads; and each rank's minor page faults a step (a rank's first touch of a page of
the shared host table is one). ``--no-ops`` leaves the profiler out (it slows the step) and keeps the CPU account;
``--python-profile PATH`` adds a cProfile of the training thread's and the exchange worker's Python
calls over those steps, timed by each thread's CPU clock (its waits, and the time other threads
take its core, left out); ``--cpu-split`` the training thread's own CPU time (not its waits) in the
parts of its step (:data:`SPLIT`, inclusive: the lookup is part of the forward); ``--timeline``
(frugal) the spans of each step's critical path on both ranks (:class:`StepTimeline`):

    torchrun --nproc_per_node=2 benchmarks/profile_graph_step.py --dataset synthetic \\
        --synthetic-entities 2000000 --synthetic-triples 8000000 --model transe_l2 --dim 400 \\
        --batch-size 1024 --chunk-size 128 --negatives 128 --steps 60 --no-eval --log-every 0 \\
        --sharder frugal --profile-steps 30 [--profile-json out.json]
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import json
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from examples.graph import train as graph_train  # noqa: E402


def thread_cpu_ns() -> Dict[str, float]:
    """CPU time (ns) of each thread of this process by name (Python's, or the kernel's ``comm`` for
    threads Python did not start: gloo, OpenMP); threads of one name summed."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: Dict[str, float] = collections.defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = float(f.read().split()[0])
            name = names.get(int(tid))
            if name is None:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = "native:" + f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        out[name.rstrip("0123456789-_") or name] += ns
    return out


def split_parts() -> List[Tuple[Any, str, str]]:
    """(owner, public method, label) of the training thread's parts that ``--cpu-split`` times.

    Only public methods: TorchRec's pipeline reads each batch through ``enqueue_batch`` (Frugal's
    read-ahead inside it) and runs the step's forward through the model's ``forward`` (Frugal's
    plans handed to its modules around it)."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    from examples.graph import sampler
    from torchrec_frugal.torchrec import embedding_lookup

    return [
        (TrainPipelineSparseDist, "enqueue_batch", "reading a batch (the sampler's included)"),
        (sampler.ChunkedNegativeSampler, "rank_batch", "making a batch (the sampler)"),
        (DistributedModelParallel, "forward", "forward (the model's, with TorchRec's and Frugal's)"),
        (embedding_lookup.FrugalEmbeddingLookup, "forward", "Frugal's lookup (gate, gathers)"),
        (torch.Tensor, "backward", "backward (the model's, the lookup's hand-over)"),
    ]


class CpuSplit:
    """The training thread's CPU time (``time.thread_time_ns``) inside each of :func:`split_parts`
    while switched on; other threads' calls are not counted."""

    def __init__(self) -> None:
        self.ns: Dict[str, int] = collections.defaultdict(int)
        self.on = False
        self._thread = threading.get_ident()
        for owner, name, label in split_parts():
            setattr(owner, name, self._timed(getattr(owner, name), label))

    def _timed(self, fn: Any, label: str) -> Any:
        split, training_thread = self, self._thread

        def timed(this: Any, *args: Any, **kwargs: Any) -> Any:  # a method: TorchRec checks ``self`` is named
            if not split.on or threading.get_ident() != training_thread:
                return fn(this, *args, **kwargs)
            t0 = time.thread_time_ns()
            try:
                return fn(this, *args, **kwargs)
            finally:
                split.ns[label] += time.thread_time_ns() - t0

        return timed


class StepTimeline:
    """When each rank's step reaches the points of its critical path (``time.perf_counter``, one
    clock for the machine's processes), per step: the gate opens (``begin_step`` returns), backward
    hands the gradients over, the exchange worker starts the step, every rank's gradients are
    staged, the owner's update is published (UPDATED). One frugal engine per rank (the example's);
    the methods are wrapped, the engine is not changed."""

    POINTS = ("gate_open", "handed_over", "worker_start", "all_staged", "updated")

    def __init__(self) -> None:
        from torchrec_frugal.engine.frugal_engine import FrugalEngine
        from torchrec_frugal.engine.gradient_exchange import GradientExchange
        from torchrec_frugal.engine.step_update import StepUpdate
        from torchrec_frugal.host import control_record

        self.at: Dict[str, Dict[int, float]] = {p: {} for p in self.POINTS}
        at = self.at

        def after(fn: Any, point: str) -> Any:
            def wrapped(this: Any, *args: Any, **kwargs: Any) -> Any:
                out = fn(this, *args, **kwargs)
                at[point][args[0] if point == "all_staged" else out] = time.perf_counter()
                return out

            return wrapped

        def before(fn: Any, point: str) -> Any:
            def wrapped(this: Any, *args: Any, **kwargs: Any) -> Any:
                at[point][args[0]] = time.perf_counter()
                return fn(this, *args, **kwargs)

            return wrapped

        def set_counter(fn: Any) -> Any:
            def wrapped(this: Any, field: int, value: int) -> None:
                fn(this, field, value)
                if field == control_record.UPDATED:
                    at["updated"][value] = time.perf_counter()

            return wrapped

        FrugalEngine.begin_step = after(FrugalEngine.begin_step, "gate_open")  # type: ignore[method-assign]
        StepUpdate.hand_over = before(StepUpdate.hand_over, "handed_over")  # type: ignore[method-assign]
        StepUpdate.run = before(StepUpdate.run, "worker_start")  # type: ignore[method-assign]
        GradientExchange.wait_staged = after(GradientExchange.wait_staged, "all_staged")  # type: ignore[method-assign]
        control_record.Control.set = set_counter(control_record.Control.set)  # type: ignore[method-assign]

    def report(self, steps: range) -> Optional[Dict[str, List[float]]]:
        """Collective; on rank 0 :func:`timeline_spans` over ``steps`` (None elsewhere)."""
        ranks: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, self.at)
        return timeline_spans(ranks, steps) if dist.get_rank() == 0 else None


def timeline_spans(ranks: List[Dict[str, Dict[int, float]]], steps: range) -> Dict[str, List[float]]:
    """The median ms over ``steps`` (those with a next step on every rank) of each span of the
    critical path, per rank, from every rank's :class:`StepTimeline` points (seconds by step)."""
    steps = range(steps.start, min(steps.stop, min(len(r["gate_open"]) for r in ranks) - 1))

    def span(a: str, b: str, later: int = 0) -> List[float]:
        return [1e3 * statistics.median(r[b][s + later] - r[a][s] for s in steps) for r in ranks]

    def after_all(point: str, of: Dict[int, float]) -> List[float]:
        return [1e3 * statistics.median(r[point][s] - of[s] for s in steps) for r in ranks]

    last_updated = {s: max(r["updated"][s] for r in ranks) for s in steps}
    last_handed = {s: max(r["handed_over"][s] for r in ranks) for s in steps}
    first_handed = {s: min(r["handed_over"][s] for r in ranks) for s in steps}
    return {
        "forward and backward (the gate open to the hand-over)": span("gate_open", "handed_over"),
        "the hand-over to the exchange worker's start": span("handed_over", "worker_start"),
        "the worker's start to every rank's gradients staged": span("worker_start", "all_staged"),
        "the later rank's hand-over after the earlier's": [
            1e3 * statistics.median(last_handed[s] - first_handed[s] for s in steps)] * len(ranks),
        "the last rank's hand-over to every rank's gradients staged": after_all("all_staged", last_handed),
        "every rank staged to UPDATED (the sum and the update)": span("all_staged", "updated"),
        "the last owner's UPDATED to the next gate open": [
            1e3 * statistics.median(r["gate_open"][s + 1] - last_updated[s] for s in steps) for r in ranks],
        "step (gate open to gate open)": span("gate_open", "gate_open", later=1),
    }  # fmt: skip


class ProfiledPipeline:
    """A train pipeline whose ``progress`` runs under the profiler (``ops``) from step ``start``
    for ``steps`` steps, with every thread's CPU time over those steps."""

    def __init__(
        self, pipeline: Any, start: int, steps: int, ops: bool = True, python: Optional[str] = None,
        split: Optional[CpuSplit] = None,
    ) -> None:  # fmt: skip
        self.pipeline, self.start, self.steps, self.ops, self.split = pipeline, start, steps, ops, split
        self.python = python  # where the training thread's Python profile (cProfile) goes
        self.cprofile: Optional[cProfile.Profile] = None
        self._worker_profiles: List[cProfile.Profile] = []
        self.calls = 0
        self.prof: Optional[profile] = None
        self.step_s: List[float] = []
        self.cpu_ns: Dict[str, float] = {}
        self.wall_s = 0.0
        self.minor_faults = 0  # the process's over the profiled steps

    @staticmethod
    def _engines() -> List[Any]:
        return RecordingStats.made[0].engines if RecordingStats.made else []

    def progress(self, batches: Any) -> Any:
        if self.calls == self.start:
            if self.ops:
                self.prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
                self.prof.__enter__()
            self.cpu_ns, self.wall_s = thread_cpu_ns(), time.perf_counter()
            self.minor_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            if self.split is not None:
                self.split.on = True
            if self.python:
                self.cprofile = cProfile.Profile(time.thread_time)
                self.cprofile.enable()
                for i, e in enumerate(self._engines()):  # cProfile follows the thread that enables it
                    self._worker_profiles.append(cProfile.Profile(time.thread_time))
                    e.exchange_worker.submit(self._worker_profiles[i].enable)
        t0 = time.perf_counter()
        out = self.pipeline.progress(batches)
        if self.start <= self.calls < self.start + self.steps:
            self.step_s.append(time.perf_counter() - t0)
        self.calls += 1
        if self.calls == self.start + self.steps:
            after, self.wall_s = thread_cpu_ns(), time.perf_counter() - self.wall_s
            self.minor_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.minor_faults
            if self.split is not None:
                self.split.on = False
            self.cpu_ns = {k: v - self.cpu_ns.get(k, 0.0) for k, v in after.items()}
            if self.prof is not None:
                self.prof.__exit__(None, None, None)
            if self.cprofile is not None:
                self.cprofile.disable()
                self.cprofile.dump_stats(f"{self.python}.rank{dist.get_rank()}")
                for e, wp in zip(self._engines(), self._worker_profiles):
                    e.exchange_worker.submit(wp.disable)
                    e.drain()
                    wp.dump_stats(f"{self.python}.exchange.rank{dist.get_rank()}")
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pipeline, name)


class RecordingStats(graph_train.FrugalStats):
    """train.py's FrugalStats, keeping every step's engine metrics (the engine's phases per step)."""

    made: List["RecordingStats"] = []

    def __init__(self, model: Any) -> None:
        self.metrics: List[Any] = []
        super().__init__(model)
        RecordingStats.made.append(self)

    def _add(self, i: int, m: Any) -> None:
        super()._add(i, m)
        self.metrics.append(m)


def engine_phases(metrics: List[Any], first_step: int) -> Dict[str, float]:
    """Mean ms a step of each engine phase and wait over the steps from ``first_step`` (all engines)."""
    timed = [m for m in metrics if m.step >= first_step]
    steps = len({m.step for m in timed})
    out: Dict[str, float] = collections.defaultdict(float)
    for m in timed:
        for k, v in m.phase_s.items():
            out[k] += 1e3 * v / steps
        for k, v in m.wait_s.items():
            out[f"wait_{k}"] += 1e3 * v / steps
        for k in ("gate_wait_s", "exchange_wait_s", "exchange_flush_s", "flusher_flush_s"):
            out[k[:-2]] += 1e3 * getattr(m, k) / steps
        out["rows_flushed"] += m.rows_flushed / steps
    return dict(out)


def report(p: ProfiledPipeline, top: int) -> Dict[str, Any]:
    """Self CPU time per (thread, operator), ms per step, threads ordered by their total; and each
    named thread's CPU time, ms per step."""
    steps = len(p.step_s)
    out: Dict[str, Any] = {
        "step_ms_median": 1e3 * sorted(p.step_s)[steps // 2],
        "wall_ms_per_step": 1e3 * p.wall_s / steps,
        "thread_cpu_ms_per_step": {k: v / 1e6 / steps for k, v in sorted(p.cpu_ns.items(), key=lambda kv: -kv[1]) if v > 0},
        "training_thread_cpu_ms_per_step": {k: v / 1e6 / steps for k, v in p.split.ns.items()} if p.split else {},
        "threads": {},
    }
    if p.prof is not None:
        by_thread: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        for e in p.prof.events():
            by_thread[int(e.thread)][e.name] += e.self_cpu_time_total / 1e3 / steps
        for tid, ops in sorted(by_thread.items(), key=lambda kv: -sum(kv[1].values())):
            out["threads"][str(tid)] = {"total_ms": sum(ops.values()), "top": ops.most_common(top)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--profile-steps", type=int, default=30)
    ap.add_argument("--profile-top", type=int, default=25)
    ap.add_argument("--profile-json", default=None)
    ap.add_argument("--no-ops", action="store_true", help="no torch.profiler: the threads' CPU time alone")
    ap.add_argument("--cpu-split", action="store_true", help="the training thread's CPU time in the parts of its step")
    ap.add_argument("--timeline", action="store_true",
                    help="frugal: the spans of each step's critical path, per rank (StepTimeline)")  # fmt: skip
    ap.add_argument("--python-profile", default=None, metavar="PATH",
                    help="also profile the Python calls (cProfile) of the training thread to PATH.rank<r> "
                         "and of the exchange worker to PATH.exchange.rank<r>")
    mine, rest = ap.parse_known_args()
    args = graph_train.parse_args(rest)
    made: List[ProfiledPipeline] = []
    stock = graph_train.train_pipeline

    split = CpuSplit() if mine.cpu_split else None
    timeline = StepTimeline() if mine.timeline else None

    def wrapped(*a: Any, **k: Any) -> ProfiledPipeline:
        made.append(ProfiledPipeline(stock(*a, **k), args.warmup, mine.profile_steps, not mine.no_ops,
                                      mine.python_profile, split))
        return made[-1]

    graph_train.train_pipeline = wrapped  # type: ignore[assignment]
    graph_train.FrugalStats = RecordingStats  # type: ignore[misc]
    summary = graph_train.train(args)
    p = made[0]
    spans = timeline.report(range(args.warmup, args.warmup + mine.profile_steps)) if timeline is not None else None
    faults: List[Any] = [None] * dist.get_world_size()  # minor page faults a step, per rank
    dist.all_gather_object(faults, p.minor_faults / max(1, len(p.step_s)))
    if dist.get_rank() == 0 and p.step_s:
        rep = report(p, mine.profile_top)
        rep["samples_per_second"] = summary["samples_per_second"]
        if RecordingStats.made and RecordingStats.made[0].engines:
            rep["engine_ms_per_step"] = engine_phases(RecordingStats.made[0].metrics, args.warmup)
        print(f"[profile] step median {rep['step_ms_median']:.2f} ms; {summary['samples_per_second']:,.0f} triples/s")
        print(f"[profile] CPU per step by thread (wall {rep['wall_ms_per_step']:.2f} ms/step): " + ", ".join(
            f"{k} {v:.2f}" for k, v in rep["thread_cpu_ms_per_step"].items()))
        rep["minor_faults_per_step_per_rank"] = faults
        print("[profile] minor page faults a step, per rank: " + " / ".join(f"{f:.0f}" for f in faults))
        for label, ms in rep["training_thread_cpu_ms_per_step"].items():
            print(f"[profile] training thread CPU in {label}: {ms:.2f} ms/step")
        if "engine_ms_per_step" in rep:
            print("[profile] engine, ms per step: " + ", ".join(f"{k} {v:.2f}" for k, v in rep["engine_ms_per_step"].items()))
        if spans is not None:
            rep["timeline_ms_median_per_rank"] = spans
            for label, per_rank in spans.items():
                print(f"[profile] timeline, {label}: " + " / ".join(f"{ms:.2f}" for ms in per_rank) + " ms (median, per rank)")
        for tid, t in rep["threads"].items():
            print(f"[profile] thread {tid}: {t['total_ms']:.2f} ms/step self CPU")
            for name, ms in t["top"]:
                print(f"    {ms:8.3f}  {name}")
        if mine.profile_json:
            Path(mine.profile_json).write_text(json.dumps(rep, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
