"""Per-step cost of the Frugal engine, with and without flush work, and the gate stall share.

Spawns ``--world`` ranks (gloo, one thread of intra-op parallelism each, one process group reused
for every run) and trains the same synthetic DLRM-like workload in several modes, alternating the
modes within each repetition so that drifts of the machine hit every mode alike:

* ``frugal``        L=10, two-level queue, background flushers (the paper's mechanism).
* ``heap``          L=10, binary-heap queue (the paper's ablation of the queue).
* ``write_through`` L=0: every update reaches host before the next step (no proactive flushing).
* ``no_flush``      the same per-rank work with no flush work at all: every rank trains alone on
                    its own batches (an engine over a one-rank process group, cache_ratio=1.0,
                    flush_workers=0). All rows sit in the rank's own cache, nobody reads host, no
                    gradients are exchanged, and nothing is flushed during the timed steps. The
                    ranks still run side by side, so they compete for the cores as in the others.
* ``no_flush_sync`` no_flush plus one gloo all-reduce of one float per step where apply_gradients
                    exchanges gradients: the step barrier of synchronous training without any
                    flush, so that waiting for the slowest rank is not charged to flushing.

Every step of every mode is: push the lookahead batch of step s + L -> begin_step(rows) (gate)
-> lookup(rows) -> dense compute standing in for the model (per-sample concat of the looked-up
rows -> MLP -> BCE, forward and backward; dense weights updated by local SGD, no all-reduce) ->
coalesce the row gradients (unique + index_add) -> apply_gradients. Ids: Zipf(s=1.2) over
permuted rows of 4 tables shaped like a scaled-down Criteo (200k, 100k, 50k, 10k rows x dim 32
by default), one id per sample and table, ``--batch`` samples per rank and step. The owners'
hot rows come from id counts of the first 50 batches. Batches are generated before timing and
are the same in every mode and repetition.

    python benchmarks/bench_engine.py [--world 2] [--steps 100] [--repeats 5] [--json PATH]

Reported per mode (median over repetitions of per-run means, ranks averaged):
step time (mean, and p90 of single steps), engine time (step minus dense compute minus gradient
coalescing), dense time, gate wait, gate stall fraction (gate wait / step time), flush time on
the exchange worker (the rows the next step reads, and what its waits and the gate's had time for), rows and MB
flushed per step (all ranks together), cache hit ratio, samples/s (all ranks together), and the
CPU seconds per step of the training thread, the background threads (flushers and the lookahead worker) and the whole rank process.

Waits by kind and flush time by thread come from the engine's own StepMetrics (``wait_s``,
``exchange_flush_s``, ``flusher_flush_s``); the background threads from
``background_threads``. The machine's load from other processes during the run is measured from
/proc/stat and printed: on a shared machine it moves every wall time.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from benchmarks.thread_cpu import ROLES, ThreadClock  # noqa: E402
from torchrec_frugal.metrics import PHASES  # noqa: E402
from torchrec_frugal.host.launch import run_ranks  # noqa: E402
from benchmarks.measure import git_state, own_cpu_s  # noqa: E402
from torchrec_frugal.estimate.timing import machine_busy_s  # noqa: E402

MODES = ("frugal", "heap", "write_through", "no_flush", "no_flush_sync")


# ---------------------------------------------------------------------------------- modes
def mode_config(mode: str, args: argparse.Namespace):
    from torchrec_frugal.config import FrugalConfig

    common = dict(flush_chunk_rows=args.chunk, max_deferred_rows=args.max_deferred_rows, timeout_s=120.0)
    workers = args.flush_workers
    if args.layout == "accelerator" and not mode.startswith("no_flush"):
        # an accelerator's choices on the CPU: a flusher thread, uncached rows updated in dynamic slots
        common["update_uncached_in_host"] = False
        workers = 1 if workers is None else workers
    if mode == "frugal":
        return FrugalConfig(lookahead=args.lookahead, cache_ratio=args.cache_ratio, queue="two_level",
                            flush_workers=workers, **common)
    if mode == "heap":
        return FrugalConfig(lookahead=args.lookahead, cache_ratio=args.cache_ratio, queue="heap",
                            flush_workers=workers, **common)
    if mode == "write_through":
        return FrugalConfig(lookahead=0, cache_ratio=args.cache_ratio, queue="two_level",
                            flush_workers=workers, **common)
    if mode in ("no_flush", "no_flush_sync"):
        return FrugalConfig(lookahead=args.lookahead, cache_ratio=1.0, queue="two_level",
                            flush_workers=0, **common)
    raise ValueError(f"unknown mode {mode!r}; valid: {MODES}")


# ---------------------------------------------------------------------------------- one rank
def run_mode(rank: int, world: int, mode: str, args: argparse.Namespace, data: Dict[str, Any],
             solo_pg: Any, bar: Any) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    from torchrec_frugal.config import OptimizerSpec, TableSpec
    from torchrec_frugal.engine.frugal_engine import FrugalEngine
    from torchrec_frugal.metrics import WAIT_EXCHANGE

    cfg = mode_config(mode, args)
    tables = [TableSpec(f"t{i}", n, args.dim) for i, n in enumerate(data["table_rows"])]
    opt = OptimizerSpec(kind=args.optimizer, lr=0.01)
    solo = mode.startswith("no_flush")
    pg = solo_pg if solo else None
    counts = data["counts_solo"] if solo else data["counts"]
    sync = torch.zeros(1) if mode == "no_flush_sync" else None
    dist.barrier()
    t_setup = time.perf_counter()
    eng = FrugalEngine(tables, opt, cfg, pg=pg, presample_counts=counts, seed=args.seed)
    setup_s = time.perf_counter() - t_setup

    torch.manual_seed(args.seed)
    T, B, d = len(tables), args.batch, args.dim
    layers: List[torch.nn.Module] = []
    width = T * d
    for h in args.mlp:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, 1))
    mlp = torch.nn.Sequential(*layers)
    params = list(mlp.parameters())
    loss_fn = torch.nn.BCEWithLogitsLoss()

    rows_all: List[torch.Tensor] = data["rows"]
    labels: List[torch.Tensor] = data["labels"]
    total = args.warmup + args.steps
    L = cfg.lookahead
    for t in range(min(L, total)):
        eng.push_lookahead(rows_all[t])

    keys = ("step", "push", "begin", "gate", "exchange", "lookup", "dense", "coalesce", "apply", "flushed",
            "cpu_engine", "cpu_dense") + tuple("phase_" + p for p in PHASES)
    rec = {k: np.zeros(args.steps) for k in keys}
    hits = lookups = 0
    due_next = pending = 0
    profiler = cProfile.Profile() if (args.profile and args.profile == mode and rank == 0) else None
    flushed_rows0 = flushed_bytes0 = 0
    exchange_flush = bg_flush = 0.0
    clock = ThreadClock(eng.background_threads)
    cpu0: Dict[str, float] = {}
    process0 = 0.0
    dist.barrier()
    wall0 = time.perf_counter()
    for s in range(total):
        if s == args.warmup:
            flushed_rows0, flushed_bytes0 = eng.total_rows_flushed, eng.total_bytes_flushed
            cpu0, process0 = clock.read(), time.process_time()
            wall0 = time.perf_counter()
            if profiler is not None:
                profiler.enable()
        rows = rows_all[s]
        sync_wait = 0.0
        c0, t0 = time.thread_time(), time.perf_counter()
        if L and s + L < total:
            eng.push_lookahead(rows_all[s + L])
        t1 = time.perf_counter()
        eng.begin_step(rows)
        t2 = time.perf_counter()
        emb = eng.lookup(rows)
        t3, c3 = time.perf_counter(), time.thread_time()
        x = emb.requires_grad_(True)
        feats = x.view(T, B, d).transpose(0, 1).reshape(B, T * d)
        loss = loss_fn(mlp(feats).squeeze(1), labels[s])
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-0.01)
                p.grad = None
        t4, c4 = time.perf_counter(), time.thread_time()
        uniq, inv = torch.unique(rows, return_inverse=True)
        grads = torch.zeros(uniq.shape[0], d).index_add_(0, inv, x.grad)
        t5 = time.perf_counter()
        if sync is not None:  # the step barrier of synchronous training, without any flush
            dist.all_reduce(sync)
            sync_wait = time.perf_counter() - t5
        c5 = time.thread_time()
        eng.apply_gradients(uniq, grads)
        eng.drain()  # the step's update, wherever it runs, is part of its time
        t6, c6 = time.perf_counter(), time.thread_time()
        i = s - args.warmup
        if i >= 0:
            m = eng.last_metrics
            exchange = m.wait_s[WAIT_EXCHANGE] + sync_wait
            for k, v in (("step", t6 - t0), ("push", t1 - t0), ("begin", t2 - t1), ("gate", m.gate_wait_s), ("exchange", exchange),
                         ("lookup", t3 - t2), ("dense", t4 - t3), ("coalesce", t5 - t4), ("apply", t6 - t5),
                         ("flushed", m.rows_flushed), ("cpu_engine", (c3 - c0) + (c6 - c5)), ("cpu_dense", c4 - c3)):
                rec[k][i] = v
            for p in PHASES:
                rec["phase_" + p][i] = m.phase_s[p]
            hits += m.cache_hits
            exchange_flush += m.exchange_flush_s
            bg_flush += m.flusher_flush_s
            lookups += m.lookups
            due_next += int(m.queue_depth[0]) if m.queue_depth.size else 0
            pending += m.pending_rows
        if bar is not None:
            bar.update(1)
    wall = time.perf_counter() - wall0
    cpu = ThreadClock.spent(cpu0, clock.read())
    cpu_process = time.process_time() - process0
    if profiler is not None:
        profiler.disable()
    rows_f = eng.total_rows_flushed - flushed_rows0
    bytes_f = eng.total_bytes_flushed - flushed_bytes0
    pending_end = len(eng.queue)
    dynamic_end = eng.store.dynamic_in_use
    eng.flush()  # untimed: leaves host equal to the caches, as a checkpoint would
    eng.close()
    del eng
    gc.collect()
    out: Dict[str, Any] = {
        "mode": mode,
        "setup_s": setup_s,
        "wall_s": wall,
        "per_step": {k: v.tolist() for k, v in rec.items()},
        "rows_flushed": int(rows_f),
        "bytes_flushed": int(bytes_f),
        "exchange_flush_s": exchange_flush,
        "flusher_flush_s": bg_flush,
        "cpu_threads_s": cpu,
        "cpu_process_s": cpu_process,
        "due_next_step_rows": int(due_next),
        "pending_rows_sum": int(pending),
        "cache_hits": int(hits),
        "lookups": int(lookups),
        "pending_rows_at_end": int(pending_end),
        "dynamic_rows_at_end": int(dynamic_end),
    }
    if profiler is not None:
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(35)
        out["profile"] = buf.getvalue()
    return out


def rank_work(rank: int, world: int, args: argparse.Namespace) -> Dict[str, Any]:
    """One rank of the benchmark (gloo process group already up): every mode, every repetition."""
    import torch
    import torch.distributed as dist

    from torchrec_frugal.synthetic_ids import ZipfWorkload

    solo = [dist.new_group([r]) for r in range(world)][rank]
    table_rows = [max(1, int(round(n * args.rows_scale))) for n in args.tables]
    wl = ZipfWorkload(table_rows, args.batch, s=args.zipf, seed=args.seed)
    offsets = np.concatenate([[0], np.cumsum(table_rows)])
    total = args.warmup + args.steps
    rows = []
    for s in range(total):
        ids = wl.batch(rank, s)
        rows.append(torch.cat([x + int(offsets[t]) for t, x in enumerate(ids)]))
    gen = torch.Generator().manual_seed(args.seed * 7919 + rank)
    labels = [torch.randint(0, 2, (args.batch,), generator=gen).float() for _ in range(total)]
    counts = wl.counts(rank, args.presample)
    data = {"table_rows": table_rows, "rows": rows, "labels": labels, "counts": counts,
            "counts_solo": counts}

    order = [m for m in args.modes]
    runs: List[Dict[str, Any]] = []
    bar = None
    if rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=args.repeats * len(order) * total, unit="step", dynamic_ncols=True,
                   file=sys.stderr, mininterval=1.0)
    for rep in range(args.repeats):
        rot = order[rep % len(order):] + order[: rep % len(order)]
        for mode in rot:
            if bar is not None:
                bar.set_description(f"rep {rep + 1}/{args.repeats} {mode}")
            r = run_mode(rank, world, mode, args, data, solo, bar)
            r["repeat"] = rep
            runs.append(r)
    if bar is not None:
        bar.close()
    unique_per_step = float(np.mean([np.unique(r.numpy()).size for r in rows[args.warmup:]]))
    return {"runs": runs, "table_rows": table_rows, "unique_rows_per_step": unique_per_step}


def summarize_run(per_rank: List[Dict[str, Any]], args: argparse.Namespace) -> Dict[str, float]:
    """One run (one mode, one repetition) over all ranks -> per-step means (ranks averaged)."""
    steps = args.steps
    def mean_ms(key: str) -> float:
        return 1e3 * float(np.mean([np.mean(r["per_step"][key]) for r in per_rank]))
    step_ms = mean_ms("step")
    dense_ms = mean_ms("dense")
    coalesce_ms = mean_ms("coalesce")
    gate_ms = mean_ms("gate")
    all_steps = np.concatenate([np.asarray(r["per_step"]["step"]) for r in per_rank]) * 1e3
    rows_f = sum(r["rows_flushed"] for r in per_rank) / steps
    bytes_f = sum(r["bytes_flushed"] for r in per_rank) / steps
    hits = sum(r["cache_hits"] for r in per_rank)
    lookups = sum(r["lookups"] for r in per_rank)
    return {
        "step_ms": step_ms,
        "step_p50_ms": float(np.percentile(all_steps, 50)),
        "step_p90_ms": float(np.percentile(all_steps, 90)),
        "engine_ms": step_ms - dense_ms - coalesce_ms,
        "dense_ms": dense_ms,
        "coalesce_ms": coalesce_ms,
        "push_ms": mean_ms("push"),
        "begin_ms": mean_ms("begin"),
        "gate_ms": gate_ms,
        "lookup_ms": mean_ms("lookup"),
        "exchange_wait_ms": mean_ms("exchange"),
        "engine_work_ms": step_ms - dense_ms - coalesce_ms - gate_ms - mean_ms("exchange"),
        "apply_ms": mean_ms("apply"),
        "gate_stall": gate_ms / step_ms,
        "exchange_flush_ms": 1e3 * float(np.mean([r["exchange_flush_s"] for r in per_rank])) / steps,
        "flusher_flush_ms": 1e3 * float(np.mean([r["flusher_flush_s"] for r in per_rank])) / steps,
        "cpu_engine_ms": mean_ms("cpu_engine"),
        "cpu_dense_ms": mean_ms("cpu_dense"),
        **{f"cpu_{role}_ms": 1e3 * float(np.mean([r["cpu_threads_s"].get(role, 0.0) for r in per_rank])) / steps
           for role in ROLES},
        "cpu_process_ms": 1e3 * float(np.mean([r["cpu_process_s"] for r in per_rank])) / steps,
        "rows_flushed_per_step": rows_f,
        "mb_flushed_per_step": bytes_f / 1e6,
        "due_next_rows_per_step": sum(r["due_next_step_rows"] for r in per_rank) / steps,
        "pending_rows_per_step": sum(r["pending_rows_sum"] for r in per_rank) / steps,
        "hit_ratio": hits / lookups if lookups else 0.0,
        "samples_per_s": args.world * args.batch / (step_ms / 1e3),
        "setup_s": float(max(r["setup_s"] for r in per_rank)),
        **{"phase_" + p + "_ms": mean_ms("phase_" + p) for p in PHASES},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2, help="ranks (gloo, one process each)")
    ap.add_argument("--steps", type=int, default=100, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=15, help="untimed steps at the start of each run")
    ap.add_argument("--repeats", type=int, default=5, help="repetitions; modes alternate within each")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--batch", type=int, default=1024, help="samples per rank and step (one id per table)")
    ap.add_argument("--tables", type=int, nargs="+", default=[200_000, 100_000, 50_000, 10_000],
                    help="rows per table before --rows-scale")
    ap.add_argument("--rows-scale", type=float, default=1.0, help="multiply every table's rows")
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--mlp", type=lambda s: [int(x) for x in s.split(",")], default=[512, 512],
                    help="hidden widths of the dense MLP, comma separated (output layer 1 is added)")
    ap.add_argument("--zipf", type=float, default=1.2)
    ap.add_argument("--presample", type=int, default=50, help="batches counted to pick the hot rows")
    ap.add_argument("--lookahead", type=int, default=10, help="L of the frugal, heap and no_flush modes")
    ap.add_argument("--cache-ratio", type=float, default=0.05, help="rows cached per rank (not no_flush)")
    ap.add_argument("--layout", choices=("cpu", "accelerator"), default="cpu",
                    help="the engine's choices on this device (cpu), or an accelerator's run on the CPU: a flusher "
                         "thread and uncached rows updated in dynamic slots, then flushed")
    ap.add_argument("--flush-workers", type=int, default=None, help="flusher threads per rank (default: the engine's, 0 on CPU)")
    ap.add_argument("--chunk", type=int, default=8192, help="flush_chunk_rows")
    ap.add_argument("--max-deferred-rows", type=int, default=None,
                    help="max_deferred_rows of the engine (default: FrugalConfig's default)")
    ap.add_argument("--optimizer", default="rowwise_adagrad", choices=("sgd", "rowwise_adagrad", "adam"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", choices=MODES, help="cProfile rank 0's training thread in this mode")
    ap.add_argument("--json", type=Path, help="write configuration, per-run and summary results here")
    args = ap.parse_args()
    if args.max_deferred_rows is None:
        from torchrec_frugal.config import FrugalConfig

        args.max_deferred_rows = FrugalConfig().max_deferred_rows
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch  # only for the version string; ranks import it themselves

    load_before = os.getloadavg()
    busy0, ours0 = machine_busy_s(), own_cpu_s()
    t0 = time.perf_counter()
    try:
        results = run_ranks(args.world, rank_work, args, timeout=3600, pg_timeout_s=300)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    elapsed = time.perf_counter() - t0
    busy, ours = machine_busy_s() - busy0, own_cpu_s() - ours0
    foreign = max(0.0, busy - ours) / (elapsed * (os.cpu_count() or 1))
    load = {"loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "cpu_busy_s": busy, "cpu_ours_s": ours, "foreign_cpu_share": foreign}

    n_runs = len(results[0]["runs"])
    per_run: Dict[str, List[Dict[str, float]]] = {m: [] for m in args.modes}
    for i in range(n_runs):
        mode = results[0]["runs"][i]["mode"]
        per_run[mode].append(summarize_run([res["runs"][i] for res in results], args))
    summary: Dict[str, Dict[str, float]] = {
        m: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for m, runs in per_run.items()
    }
    ref = "frugal" if "frugal" in summary else args.modes[0]
    for m, runs in per_run.items():
        steps_ms = [r["step_ms"] for r in runs]
        summary[m]["step_ms_min"] = min(steps_ms)
        summary[m]["step_ms_max"] = max(steps_ms)
        # Same repetition, same moment of the machine: the ratio is steadier than one of medians.
        summary[m]["step_vs_" + ref + "_paired"] = statistics.median(
            a["step_ms"] / b["step_ms"] for a, b in zip(runs, per_run[ref])
        )
    for m, s in summary.items():
        s["step_vs_" + ref] = s["step_ms"] / summary[ref]["step_ms"]
        s["engine_vs_" + ref] = s["engine_ms"] / summary[ref]["engine_ms"]
        s["samples_per_s_vs_" + ref] = s["samples_per_s"] / summary[ref]["samples_per_s"]

    table_rows = results[0]["table_rows"]
    print(
        f"\nworld={args.world} tables={table_rows} dim={args.dim} batch={args.batch}/rank "
        f"(~{results[0]['unique_rows_per_step']:.0f} unique rows/rank/step) mlp={args.mlp} "
        f"optimizer={args.optimizer} L={args.lookahead} cache_ratio={args.cache_ratio} "
        f"max_deferred_rows={args.max_deferred_rows} steps={args.steps} (+{args.warmup} warm-up) repeats={args.repeats} "
        f"torch={torch.__version__} cpus={os.cpu_count()}\n"
    )
    print("| mode | step ms | min-max over repeats | p90 step ms | dense ms | engine ms | gate wait ms | exchange wait ms | "
          "engine work ms | gate stall | flush on exchange worker ms | rows flushed/step | MB flushed/step | "
          f"cache hit | samples/s | step vs {ref} (paired) |")
    print("|---|" + "---:|" * 15)
    for m, s in summary.items():
        print(
            f"| {m} | {s['step_ms']:.1f} | {s['step_ms_min']:.0f}-{s['step_ms_max']:.0f} | {s['step_p90_ms']:.1f} | {s['dense_ms']:.1f} | {s['engine_ms']:.1f} "
            f"| {s['gate_ms']:.2f} | {s['exchange_wait_ms']:.2f} | {s['engine_work_ms']:.1f} "
            f"| {100 * s['gate_stall']:.1f}% | {s['exchange_flush_ms']:.2f} "
            f"| {s['rows_flushed_per_step']:,.0f} | {s['mb_flushed_per_step']:.2f} | {s['hit_ratio']:.3f} "
            f"| {s['samples_per_s']:,.0f} | {s['step_vs_' + ref + '_paired']:.2f}x |"
        )
    print("\n| mode | push_lookahead ms | begin_step ms (incl. gate) | lookup ms | apply_gradients ms "
          "(incl. exchange wait) | flush in flusher threads ms | CPU process ms | CPU engine calls ms | CPU dense ms "
          "| rows due at next step | rows pending |")
    print("|---|" + "---:|" * 10)
    for m, s in summary.items():
        print(f"| {m} | {s['push_ms']:.2f} | {s['begin_ms']:.2f} | {s['lookup_ms']:.2f} | {s['apply_ms']:.2f} "
              f"| {s['flusher_flush_ms']:.2f} "
              f"| {s['cpu_process_ms']:.1f} | {s['cpu_engine_ms']:.2f} | {s['cpu_dense_ms']:.1f} "
              f"| {s['due_next_rows_per_step']:,.0f} | {s['pending_rows_per_step']:,.0f} |")
    print("\nCPU ms per step and rank of each thread (the training thread includes the dense model; no "
          "planner thread here: the engine's calls take rows, not batches to plan):\n")
    print("| mode | " + " | ".join(ROLES) + " | process |")
    print("|---|" + "---:|" * (len(ROLES) + 1))
    for m, s in summary.items():
        print(f"| {m} | " + " | ".join(f"{s[f'cpu_{role}_ms']:.2f}" for role in ROLES) + f" | {s['cpu_process_ms']:.2f} |")
    print("\nThe engine's own account of the training thread's engine time (StepMetrics.phase_s), ms per step:\n")
    print("| mode | " + " | ".join(PHASES) + " | sum |")
    print("|---|" + "---:|" * (len(PHASES) + 1))
    for m, s in summary.items():
        phases = [s["phase_" + p + "_ms"] for p in PHASES]
        print(f"| {m} | " + " | ".join(f"{v:.2f}" for v in phases) + f" | {sum(phases):.2f} |")
    print(f"\nwall time {elapsed:.0f} s; CPU used by other processes during the run: "
          f"{100 * foreign:.0f}% of the machine (load average before {load_before[0]:.2f})")
    for res in results:
        for r in res["runs"]:
            if "profile" in r:
                print(f"\ncProfile of rank 0, mode {r['mode']}, repeat {r['repeat']}:\n{r['profile']}")

    if args.json:
        payload = {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "table_rows": table_rows,
            "unique_rows_per_rank_step": results[0]["unique_rows_per_step"],
            "engine_commit": git_state(ROOT),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                        "torch": torch.__version__, "numpy": np.__version__},
            "wall_s": elapsed,
            "machine_load": load,
            "summary": summary,
            "per_run": per_run,
            "per_step_rank0": [
                {"mode": r["mode"], "repeat": r["repeat"], "step_s": r["per_step"]["step"],
                 "gate_s": r["per_step"]["gate"], "dense_s": r["per_step"]["dense"],
                 "rows_flushed": r["per_step"]["flushed"]}
                for r in results[0]["runs"]
            ],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
