"""What will Frugal do on my GPUs? Predicted samples/s of every sharding for a DLRM configuration.

    python -m torchrec_frugal.estimate --config criteo-kaggle --scale 1 --gpus 8 --batch-size 1024 --hardware rtx3090
    python -m torchrec_frugal.estimate --model paper --config criteo-tb --scale 1 --gpus 8 --batch-size 1024 --hardware rtx3090
    python -m torchrec_frugal.estimate --config criteo-tb --gpus 8 --nodes 4 --hardware h200
    python -m torchrec_frugal.estimate ... --json out.json --plot out.png
    python -m torchrec_frugal.estimate --calibrate my_machine.json [--base rtx3090] [--device cuda]

Prints, for Frugal (frugal_row_wise across nodes) and TorchRec's table_wise, row_wise, table_row_wise
and data_parallel shardings,
the predicted samples/s, the step's terms (docs/cost_model.md), the recommended Frugal settings
(cache ratio and lookahead of least predicted step time) and what bounds Frugal's step and the best
stock choice's (:func:`.cost_model.bound`). Every figure is a prediction of the cost
model on a hardware profile (shipped: cpu, h200, rtx3090, rtx4090, a30; or a JSON file of your own).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .cost_model import FRUGAL_KINDS, TERMS, Bound, CostModel, CostTable, DenseModel, Plan, StepCost, Workload, frugal_kind, frugal_offered, bound, predict_all, recommend_frugal, shardings_for
from ..datasets import CACHE_RATIO, DATASETS, LOOKAHEAD, MODEL_KINDS, DatasetConfig, ModelConfig, SkewConfig, dataset_for
from .profiles import HardwareProfile, ProfileError, builtin_profiles, load_profile

PRESAMPLE_STEPS = 50  # examples/dlrm/train.py --presample-steps: batches per rank counted for the hot rows
EPOCH_SAMPLES: Dict[str, int] = {
    "avazu": 40_428_967,  # Avazu CTR's training file (Kaggle), the rows whose columns datasets.py counts
    "criteo-kaggle": 45_840_617,  # Criteo Display Advertising Challenge, train.txt
    "criteo-tb": 4_373_472_329,  # Criteo 1TB Click Logs, the 24 days
}
"""Samples in one epoch of each real dataset: over an epoch the real ids read every row of the
table at least once (the dataset's capacity is its distinct ids), which the Zipf model's tail does not
(``CostTable.tail_rate``)."""
GPU_COUNTS = (1, 2, 4, 8)


def dense_model(model: ModelConfig, dataset: DatasetConfig) -> DenseModel:
    """The dense FLOPs and parameters of the DLRM example's models (examples/dlrm/train.py).

    ``dlrm``: TorchRec's DLRM: dense arch on the dense features, pairwise dots of the F + 1
    pooled vectors (2 (F + 1)^2 d FLOPs), over arch on the d + F (F + 1) / 2 interactions.
    ``paper``: the authors' benchmark: the sum-pooled vector through the MLP d-512-256-1.
    """
    F, d, dense_in = dataset.num_sparse, model.embedding_dim, dataset.dense_width
    if model.kind == "paper":
        return DenseModel.mlps((F * d,) + tuple(model.mlp_layers), extra_ops=2)  # ops: the pooling's sum, the loss
    over_in = d + F * (F + 1) // 2
    return DenseModel.mlps(
        (dense_in,) + tuple(model.dense_arch_layers),
        (over_in,) + tuple(model.over_arch_layers),
        extra_flops=2.0 * (F + 1) ** 2 * d,
        extra_ops=6,  # stack, bmm, triangle gather, concat, loss, sigmoid
    )


def dlrm_workload(
    config: str,
    world_size: int,
    batch_size: int,
    scale: Optional[float] = None,
    model: str = "dlrm",
    skew: SkewConfig = SkewConfig(),
    presample_steps: int = PRESAMPLE_STEPS,
    threads_per_rank: Optional[int] = None,
    min_rows: int = 1000,
    nodes: int = 1,
    real_data: bool = False,
) -> Workload:
    """The DLRM example's workload: the model's tables (``dlrm``: one per field, one id a sample;
    ``paper``: the authors' one table, 21 or 26 ids a sample), Zipf(s) ids as its synthetic data
    draws them (s by table size), hot rows counted over ``presample_steps`` batches of every rank
    (0: the true hottest rows); ``world_size`` ranks in all, over ``nodes`` machines. ``real_data``:
    the dataset's real ids, whose tail reads every row once an epoch (:data:`EPOCH_SAMPLES`), not the
    synthetic ids alone. The paper's model trains with SGD (no optimizer state), the DLRM with
    row-wise Adagrad on the tables and Adagrad on the dense part (the example's defaults)."""
    ds = dataset_for(config, model)
    m = ModelConfig(kind=model)
    rows = ds.rows(scale, min_rows)
    epoch = float(EPOCH_SAMPLES[config] * ds.ids_per_sample) if real_data else None
    tables = tuple(CostTable.zipf(n, r, m.embedding_dim, skew.s_for(r), ds.ids_per_sample, epoch)
                   for n, r in zip(ds.table_names(), rows))  # fmt: skip
    sgd = model == "paper"
    return Workload(
        tables=tables,
        dense=dense_model(m, ds),
        batch_size=batch_size,
        world_size=world_size,
        threads_per_rank=threads_per_rank,
        state_floats_per_row=0.0 if sgd else 1.0,
        dense_state_floats=0.0 if sgd else 1.0,
        presample_draws=float(presample_steps * batch_size * world_size * ds.ids_per_sample) if presample_steps else None,
        nodes=nodes,
    )


# ---------------------------------------------------------------------------- report
def breakdown_table(costs: Dict[str, StepCost]) -> str:
    """Markdown: one column per sharding, one row per non-zero term (ms), then the totals."""
    names = list(costs)
    used = [t for t in TERMS if any(c.terms[t] > 0 for c in costs.values())]
    lines = ["| term (ms per step) | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for t in used:
        lines.append(f"| {t} | " + " | ".join(f"{1e3 * costs[n].terms[t]:.3f}" for n in names) + " |")
    lines.append("| **step** | " + " | ".join(f"**{1e3 * costs[n].step_s:.3f}**" for n in names) + " |")
    lines.append("| samples/s | " + " | ".join(f"{costs[n].samples_per_second:,.0f}" for n in names) + " |")
    lines.append("| device memory per device | " + " | ".join(
        f"{costs[n].memory_bytes_per_device / 2**30:.2f} GiB" for n in names) + " |")  # fmt: skip
    lines.append("| host memory per node | " + " | ".join(
        f"{costs[n].host_memory_bytes_per_node / 2**30:.2f} GiB" for n in names) + " |")  # fmt: skip
    lines.append("| fits (device and host memory) | " + " | ".join('yes' if costs[n].fits else 'no' for n in names) + " |")
    return "\n".join(lines)


def bound_lines(costs: Dict[str, StepCost], kind: str) -> Dict[str, Tuple[str, Bound]]:
    """What bounds Frugal's step and the best stock choice's (the fastest that fits; the fastest if
    none fits): {"frugal" / "best stock": (sharding, bound)}."""
    stock = {n: c for n, c in costs.items() if n not in FRUGAL_KINDS}
    fitting = {n: c for n, c in stock.items() if c.fits} or stock
    best = max(fitting, key=lambda n: fitting[n].samples_per_second)
    return {"frugal": (kind, bound(costs[kind])), "best stock": (best, bound(costs[best]))}


def best_sharding(costs: Dict[str, StepCost]) -> str:
    fitting = [n for n, c in costs.items() if c.fits] or list(costs)
    return max(fitting, key=lambda n: costs[n].samples_per_second)


TERM_HELP = {
    "dense_compute": "the dense MLPs' forward and backward and their optimizer on the device",
    "dense_allreduce": "DDP's all-reduce of the dense gradients",
    "framework": "the training loop's own time (pipeline, input batch, KJT handling)",
    "embedding_lookup": "pooling the step's ids from rows in device memory (or the UVM cache)",
    "embedding_update": "the fused optimizer on the step's distinct rows in device memory",
    "input_all_to_all": "ids and lengths sent to the ranks that hold the rows",
    "output_all_to_all": "pooled embeddings back, and their gradients, forward and backward",
    "table_allreduce": "data_parallel: all-reduce of whole tables",
    "host_reads": "Frugal: distinct rows read from host memory (not in the rank's own cache)",
    "gradient_exchange": "Frugal: gradients staged through host memory to the rows' owners",
    "flush_inline": "Frugal: updated rows due at the next step, written to host on the training thread",
    "engine_host": "Frugal: the training thread's own frugal host work (flat per step)",
    "gate_stall": "Frugal: the excess of its slowest thread beside the step (planner, exchange worker, flushers)",
    "uvm_reads": "offloading: rows read from host over the link (cache misses, or every row without a cache)",
    "uvm_writes": "offloading: rows written back to host (evicted dirty cache lines, or every updated row)",
    "prefetch_stall": "offloading with the prefetch pipeline: the cache fill's excess over the step",
    "contention": "waiting for shared devices or host cores beyond the rank's own path",
}


def size_text(config: str, scale: Optional[float], rows: int) -> str:
    s = DATASETS[config].default_scale if scale is None else scale
    return "at full size" if s >= 1.0 else f"at scale {s:g} ({rows:,} rows)"


def verdict(model: CostModel, args: argparse.Namespace, costs: Dict[str, StepCost], hw: HardwareProfile,
            rows: int) -> str:
    """One line: the fastest choice that fits against Frugal, and where Frugal is predicted faster
    (among the rank counts where the planner offers it, :func:`frugal_offered`)."""
    kind = frugal_kind(args.nodes)
    where = f"{args.nodes} nodes x {args.gpus}" if args.nodes > 1 else f"{args.gpus}x"
    head = f"on {where} {hw.name}, {args.config} {size_text(args.config, args.scale, rows)}, batch {args.batch_size}"
    fr = costs[kind]
    stock = {n: c for n, c in costs.items() if n not in FRUGAL_KINDS and c.fits}
    if not stock:
        return f"{head}: no stock choice fits; Frugal {'fits' if fr.fits else 'does not fit either'}"
    best = max(stock, key=lambda n: stock[n].samples_per_second)
    ratio = stock[best].samples_per_second / fr.samples_per_second
    if not frugal_offered(hw, args.gpus * args.nodes):
        line = (f"{head}: {best} is the fastest stock choice; the planner does not offer Frugal to one rank whose device is host memory "
                "(no peer, no link: nothing to save; measured slower than stock, docs/cost_model.md)")
    elif not fr.fits:
        line = f"{head}: {best} fits and Frugal does not"
    elif ratio >= 1.0:
        line = f"{head}: {best} fits and is predicted {ratio:.2f}x faster than Frugal"
    else:
        line = f"{head}: Frugal is predicted {1 / ratio:.2f}x faster than the best stock choice ({best})"
    wins = []
    for n in sorted({1, 2, 4, 8} | {args.gpus}):
        if not frugal_offered(hw, n * args.nodes):
            continue
        if n == args.gpus:
            c = costs
        else:
            c = predict_all(model, workload(args, n), _fixed_frugal(args))
        st = [x.samples_per_second for k, x in c.items() if k not in FRUGAL_KINDS and x.fits]
        if c[kind].fits and (not st or c[kind].samples_per_second > max(st)):
            wins.append(str(n))
    unit = "ranks per node" if args.nodes > 1 else "GPUs"
    return line + ("; Frugal is predicted faster at " + ", ".join(wins) + f" {unit} (same batch per rank)"
                   if wins else f"; Frugal is predicted faster at none of 1, 2, 4, 8 {unit} at this batch")


def workload(args: argparse.Namespace, gpus: int) -> Workload:
    """The workload of the command line with ``gpus`` GPUs per node."""
    return dlrm_workload(args.config, gpus * args.nodes, args.batch_size, args.scale, args.model,
                         presample_steps=args.presample_steps, nodes=args.nodes, real_data=not args.synthetic)  # fmt: skip


def scaling(hw: HardwareProfile, args: argparse.Namespace, counts: Sequence[int]) -> Dict[str, List[float]]:
    """Predicted samples/s of every sharding (Frugal with its recommended settings) per GPU count of a node."""
    out: Dict[str, List[float]] = {s: [] for s in shardings_for(args.nodes)}
    model = CostModel(hw)
    for n in counts:
        for s, c in predict_all(model, workload(args, n), _fixed_frugal(args)).items():
            out[s].append(c.samples_per_second)
    return out


def plot(path: Path, counts: Sequence[int], curves: Dict[str, List[float]], title: str, nodes: int = 1) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s, ys in curves.items():
        ax.plot(counts, ys, marker="o", label=s, linewidth=2.5 if s in FRUGAL_KINDS else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(counts), [str(c) for c in counts])
    ax.set_xlabel("GPUs (ranks) per node" if nodes > 1 else "GPUs (ranks)")
    ax.set_ylabel("predicted samples/s")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fixed_frugal(args: argparse.Namespace) -> Optional[Plan]:
    if args.cache_ratio is None and args.lookahead is None:
        return None
    return Plan(frugal_kind(args.nodes), cache_ratio=CACHE_RATIO if args.cache_ratio is None else args.cache_ratio,
                lookahead=LOOKAHEAD if args.lookahead is None else args.lookahead)  # fmt: skip


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m torchrec_frugal.estimate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=sorted(DATASETS), default="criteo-kaggle")
    ap.add_argument("--scale", type=float, default=None, help="row-count scale (default: the config's; 1 = the real dataset)")
    ap.add_argument("--gpus", type=int, default=8, help="ranks per node (GPUs, or CPU ranks on the cpu profile)")
    ap.add_argument("--nodes", type=int, default=1, help="machines, --gpus each; across nodes Frugal is frugal_row_wise "
                    "and the profile's network_bw prices what crosses the network")
    ap.add_argument("--batch-size", type=int, default=1024, help="per rank")
    ap.add_argument("--hardware", default="rtx3090", help=f"a profile name ({', '.join(builtin_profiles())}) or a JSON file")
    ap.add_argument("--model", choices=MODEL_KINDS, default="dlrm",
                    help="dlrm: TorchRec's DLRM over one table per field; paper: the authors' benchmark, one table, MLP 32-512-256-1")
    ap.add_argument("--cache-ratio", type=float, default=None, help="frugal: fix the cache ratio (default: recommend one)")
    ap.add_argument("--lookahead", type=int, default=None, help="frugal: fix L (default: recommend one)")
    ap.add_argument("--presample-steps", type=int, default=PRESAMPLE_STEPS,
                    help="batches per rank counted to pick the hot rows (0: the true hottest rows)")
    ap.add_argument("--synthetic", action="store_true",
                    help="price the example's synthetic Zipf ids alone (default: the real data, whose tail reads every row once an epoch)")
    ap.add_argument("--json", type=Path, help="write the prediction here")
    ap.add_argument("--plot", type=Path, help="draw predicted samples/s against GPU count here (PNG)")
    ap.add_argument("--calibrate", type=Path, metavar="PATH", help="measure this machine and write its profile to PATH")
    ap.add_argument("--base", default=None, help="--calibrate: profile for what cannot be measured (default: cpu, or h200 with --device cuda)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="--calibrate: the device ranks train on")
    args = ap.parse_args(argv)
    if args.gpus < 1 or args.batch_size < 1 or args.nodes < 1:
        ap.error("--gpus, --nodes and --batch-size must be >= 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.calibrate:
            from .calibrate import calibrate

            base = load_profile(args.base or ("h200" if args.device == "cuda" else "cpu"))
            calibrate(str(args.calibrate), base, args.calibrate.stem, args.device)
            return 0
        hw = load_profile(args.hardware)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    w = workload(args, args.gpus)
    model = CostModel(hw)
    fixed = _fixed_frugal(args)
    try:
        costs = predict_all(model, w, fixed)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plan = fixed or recommend_frugal(model, w)[0]
    rows = sum(t.rows for t in w.tables)
    best = best_sharding(costs)
    where = f"{args.nodes} nodes x {args.gpus} ranks" if args.nodes > 1 else f"{args.gpus} ranks"
    head = (f"{args.config} ({len(w.tables)} tables, {rows:,} rows, dim {w.tables[0].dim}), {args.model}, "
            f"{where} x batch {args.batch_size} on {hw.name}: {hw.description}")  # fmt: skip
    print(verdict(model, args, costs, hw, rows))
    print("\n" + head + "\n\nPREDICTED by the cost model (docs/cost_model.md), not measured:\n")
    print(breakdown_table(costs))
    print("\nterms:")
    used = [t for t in TERMS if any(c.terms[t] > 0 for c in costs.values())]
    for t in used:
        print(f"- {t}: {TERM_HELP[t]}")
    fr = costs[frugal_kind(args.nodes)]
    print(f"\n{frugal_kind(args.nodes)} settings: cache ratio {plan.cache_ratio:g}, lookahead L={plan.lookahead}"
          + (" (fixed)" if fixed else " (recommended: least predicted step time)")
          + f"; predicted cache hits {100 * fr.details['cache_hit_ratio']:.1f}%, "
          f"{fr.details['host_rows_per_rank']:,.0f} host rows per rank and step; beside the step: planner thread "
          f"{fr.details.get('planner_thread_ms', 0.0):.3f} ms, exchange worker {fr.details.get('exchange_worker_ms', 0.0):.3f} ms, "
          f"flushers {fr.details.get('flushers_ms', 0.0):.3f} ms per step")  # fmt: skip
    if args.nodes > 1:
        print("embedding bytes between nodes per step (all ranks): " + ", ".join(
            f"{n} {c.details['embedding_bytes_between_nodes_per_step'] / 1e6:,.1f} MB" for n, c in costs.items()))  # fmt: skip
    for n, c in costs.items():
        if "uvm_load_factor" in c.details:
            print(f"{n}: cache_load_factor {c.details['uvm_load_factor']:g} (recommended)")
    print(f"fastest predicted sharding that fits: {best} ({costs[best].samples_per_second:,.0f} samples/s)")
    bounds = bound_lines(costs, frugal_kind(args.nodes))
    print("\nwhat bounds the step (docs/cost_model.md, \"What bounds a step\"):")
    for side, (name, b) in bounds.items():
        print(f"- {side} ({name}): {b.text()}")
    if args.json:
        doc = {
            "prediction": True,
            "config": args.config, "scale": args.scale, "model": args.model, "gpus": args.gpus, "nodes": args.nodes,
            "batch_size": args.batch_size, "hardware": hw.name, "rows": rows,
            "recommended": {"sharding": best, "cache_ratio": plan.cache_ratio, "lookahead": plan.lookahead},
            "real_data": not args.synthetic,
            "bounds": {side: {"sharding": name, **b.to_json()} for side, (name, b) in bounds.items()},
            "shardings": {n: {**c.to_json(), "terms": {k: v for k, v in c.terms.items()}} for n, c in costs.items()},
        }  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        counts = sorted(set(GPU_COUNTS) | {args.gpus})
        plot(args.plot, counts, scaling(hw, args, counts), head.split(": ")[0] + " (predicted)", args.nodes)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
