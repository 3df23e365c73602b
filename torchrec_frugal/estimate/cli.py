"""What will Frugal do on my GPUs? Predicted samples/s of every sharding for a DLRM configuration.

    python -m torchrec_frugal.estimate --config criteo-kaggle --scale 1 --gpus 8 --batch-size 1024 --hardware rtx3090
    python -m torchrec_frugal.estimate --model paper --config criteo-tb --scale 1 --gpus 8 --batch-size 1024 --hardware rtx3090
    python -m torchrec_frugal.estimate --config criteo-tb --gpus 8 --nodes 4 --hardware h200
    python -m torchrec_frugal.estimate ... --json out.json --plot out.png
    python -m torchrec_frugal.estimate --calibrate my_machine.json [--base rtx3090] [--device cuda]

Prints, for Frugal (frugal_row_wise across nodes), TorchRec's table_wise, row_wise, table_row_wise
and data_parallel shardings and (on a GPU profile) its UVM offloading,
the predicted samples/s, the step's terms (docs/cost_model.md), the recommended Frugal settings
(cache ratio and lookahead of least predicted step time) and what bounds Frugal's step and the best
stock choice's (:func:`.cost_model.bound`). Every figure is a prediction of the cost
model on a hardware profile (shipped: cpu, h200, rtx3090, rtx4090, a30; or a JSON file of your own).
By default one row per choice (step, samples/s, whether it fits, what bounds it); ``--terms`` adds
the step term by term and the memory of every choice.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .cost_model import FRUGAL_KINDS, TERMS, Bound, CostModel, CostTable, DenseModel, Plan, StepCost, Workload, frugal_kind, frugal_offered, bound, predict_all, recommend_frugal, shardings_for
from ..config import CACHE_RATIO, LOOKAHEAD
from ..datasets import DATASETS, EPOCH_SAMPLES, MODEL_KINDS, PAPER_DATASETS, DatasetConfig, ModelConfig, SkewConfig, dataset_for
from .profiles import HardwareProfile, ProfileError, builtin_profiles, load_profile

PRESAMPLE_STEPS = 50  # examples/dlrm/train.py --presample-steps: batches per rank counted for the hot rows
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
    tables = tuple(CostTable.zipf(name, table_rows, m.embedding_dim, skew.s_for(table_rows), ds.ids_per_sample, epoch)
                   for name, table_rows in zip(ds.table_names(), rows))  # fmt: skip
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
    used = [term for term in TERMS if any(cost.terms[term] > 0 for cost in costs.values())]
    lines = ["| term (ms per step) | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for term in used:
        lines.append(f"| {term} | " + " | ".join(f"{1e3 * costs[name].terms[term]:.3f}" for name in names) + " |")
    lines.append("| **step** | " + " | ".join(f"**{1e3 * costs[name].step_s:.3f}**" for name in names) + " |")
    lines.append("| samples/s | " + " | ".join(f"{costs[name].samples_per_second:,.0f}" for name in names) + " |")
    lines.append("| device memory per device | " + " | ".join(
        f"{costs[name].memory_bytes_per_device / 2**30:.2f} GiB" for name in names) + " |")  # fmt: skip
    lines.append("| host memory per node | " + " | ".join(
        f"{costs[name].host_memory_bytes_per_node / 2**30:.2f} GiB" for name in names) + " |")  # fmt: skip
    lines.append("| fits (device and host memory) | " + " | ".join('yes' if costs[name].fits else 'no' for name in names) + " |")
    return "\n".join(lines)


WIDTH = 100
"""Columns of the default output: every line of it fits (the full term table is ``--terms``)."""
TIE = 0.02
"""Predictions within this share of each other read as a tie: the model's own error is larger
(docs/cost_model.md: median 5.8% against measured runs), so "1.01x faster" would claim too much."""


def speed_ratio(a: StepCost, b: StepCost) -> float:
    """``a``'s predicted samples/s over ``b``'s."""
    return a.samples_per_second / b.samples_per_second


def is_tie(ratio: float) -> bool:
    """Whether two predictions whose samples/s have this ratio are within :data:`TIE` of each other."""
    return abs(ratio - 1.0) <= TIE * max(ratio, 1.0)


def ratio_text(ratio: float) -> str:
    """``ratio`` as the output prints it: "tie" within :data:`TIE`, else "1.23x" ("<0.01x" below that)."""
    if is_tie(ratio):
        return "tie"
    return "<0.01x" if ratio < 0.005 else f"{ratio:.2f}x"


def wrap(text: str, indent: str = "") -> str:
    """``text`` in lines of at most :data:`WIDTH` columns, continuation lines indented by ``indent``."""
    glued = re.sub(r"(\d) (ms|GiB|MB|samples/s)\b", "\\1\u00a0\\2", text)  # a number stays with its unit
    return textwrap.fill(glued, WIDTH, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False).replace("\u00a0", " ")


def bound_lines(costs: Dict[str, StepCost], kind: str) -> Dict[str, Tuple[str, Bound]]:
    """What bounds Frugal's step and the best stock choice's (the fastest that fits; the fastest if
    none fits): {"frugal" / "best stock": (sharding, bound)}."""
    stock = {name: cost for name, cost in costs.items() if name not in FRUGAL_KINDS}
    fitting = {name: cost for name, cost in stock.items() if cost.fits} or stock
    best = max(fitting, key=lambda name: fitting[name].samples_per_second)
    return {"frugal": (kind, bound(costs[kind])), "best stock": (best, bound(costs[best]))}


def best_sharding(costs: Dict[str, StepCost]) -> str:
    fitting = [name for name, cost in costs.items() if cost.fits] or list(costs)
    return max(fitting, key=lambda name: costs[name].samples_per_second)


def choice_table(costs: Dict[str, StepCost], kind: str) -> str:
    """The default table, one row per choice: step, samples/s, samples/s against Frugal's (``kind``),
    whether it fits and what bounds its step. Narrow enough for a terminal (:data:`WIDTH`), unlike
    :func:`breakdown_table`, whose columns are the choices."""
    head = ("sharding", "step ms", "samples/s", "vs Frugal", "fits", "what bounds the step")
    rows = [head]
    for name, cost in costs.items():
        vs = "-" if name == kind else ratio_text(speed_ratio(cost, costs[kind]))
        rows.append((name, f"{1e3 * cost.step_s:.3f}", f"{cost.samples_per_second:,.0f}", vs, "yes" if cost.fits else "no",
                     bound(cost).name))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in range(1, 4)] + [r[4].center(widths[4]), r[5]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


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
    "flush_inline": "Frugal: updated rows due at the next step, written to host by the exchange worker before the next step's gate opens",
    "engine_host": "Frugal: the training thread's own frugal host work (flat per step)",
    "gate_stall": "Frugal: the excess of its slowest thread beside the step (planner, exchange worker, flushers)",
    "uvm_reads": "offloading: rows read from host over the link (cache misses, or every row without a cache)",
    "uvm_writes": "offloading: rows written back to host (evicted dirty cache lines, or every updated row)",
    "prefetch_stall": "offloading with the prefetch pipeline: the cache fill's excess over the step",
    "contention": "waiting for shared devices or host cores beyond the rank's own path",
}

DATASET_TEXT = {
    "avazu": "Avazu's",
    "criteo-kaggle": "Criteo Kaggle's",
    "criteo-tb": "Criteo 1TB's",
}
"""How the scale help names each dataset of :data:`DATASETS`."""


def default_scale_text() -> str:
    """``--help``'s lines on each config's default scale and what it means, for either model: the
    share of which real table(s) and the rows it gives (why: "scale 0.004" alone does not say that
    the default criteo-tb is 3.5M rows, not the 883M of the real logs)."""
    lines = ["default --scale of each --config (1: the real row counts; no table is scaled below 1,000 rows):"]
    for name in sorted(DATASETS):
        ds, paper = DATASETS[name], PAPER_DATASETS[name]
        lines.append(f"  {name}:")
        lines.append(f"    --model dlrm:  {ds.default_scale:g} of {DATASET_TEXT.get(name, name)} {ds.total_rows:,} rows "
                     f"({ds.num_sparse} tables): {sum(ds.rows()):,} rows")  # fmt: skip
        lines.append(f"    --model paper: {paper.default_scale:g} of the authors' {paper.total_rows:,}-row table: "
                     f"{sum(paper.rows()):,} rows")  # fmt: skip
    return "\n".join(lines)


def size_text(config: str, scale: Optional[float], rows: int, model: str = "dlrm") -> str:
    s = dataset_for(config, model).default_scale if scale is None else scale
    return "at full size" if s >= 1.0 else f"at scale {s:g} ({rows:,} rows)"


def verdict(model: CostModel, args: argparse.Namespace, costs: Dict[str, StepCost], profile: HardwareProfile,
            rows: int) -> str:
    """One paragraph: the fastest choice that fits against Frugal, and where Frugal is predicted
    faster (among the rank counts where the planner offers it, :func:`frugal_offered`); within
    :data:`TIE` it is a tie, not a win either way."""
    kind = frugal_kind(args.nodes)
    where = f"{args.nodes} nodes x {args.gpus}" if args.nodes > 1 else f"{args.gpus}x"
    head = f"on {where} {profile.name}, {args.config} {size_text(args.config, args.scale, rows, args.model)}, batch {args.batch_size}"
    frugal = costs[kind]
    stock = {name: cost for name, cost in costs.items() if name not in FRUGAL_KINDS and cost.fits}
    if not stock:
        return f"{head}: no stock choice fits; Frugal {'fits' if frugal.fits else 'does not fit either'}"
    best = max(stock, key=lambda name: stock[name].samples_per_second)
    ratio = speed_ratio(stock[best], frugal)
    if not frugal_offered(profile, args.gpus * args.nodes):
        line = (f"{head}: {best} is the fastest stock choice; the planner does not offer Frugal to one rank whose device is host memory "
                "(no peer, no link: nothing to save; measured slower than stock, docs/cost_model.md)")
    elif not frugal.fits:
        line = f"{head}: {best} fits and Frugal does not"
    elif is_tie(ratio):
        line = (f"{head}: {best}, the fastest stock choice that fits, is predicted within {100 * TIE:g}% of Frugal, a tie "
                f"({stock[best].samples_per_second:,.0f} against {frugal.samples_per_second:,.0f} samples/s)")
    elif ratio > 1.0:
        line = f"{head}: {best} fits and is predicted {ratio:.2f}x faster than Frugal"
    else:
        line = f"{head}: Frugal is predicted {1 / ratio:.2f}x faster than the best stock choice ({best})"
    wins, ties = [], []
    counts = [gpus for gpus in sorted({1, 2, 4, 8} | {args.gpus}) if frugal_offered(profile, gpus * args.nodes)]
    for gpus in counts:
        at_count = costs if gpus == args.gpus else predict_all(model, workload(args, gpus), _fixed_frugal(args))
        stock_fitting = [cost for name, cost in at_count.items() if name not in FRUGAL_KINDS and cost.fits]
        if not at_count[kind].fits:
            continue
        if not stock_fitting:
            wins.append(str(gpus))
            continue
        against_stock = speed_ratio(at_count[kind], max(stock_fitting, key=lambda cost: cost.samples_per_second))
        if is_tie(against_stock):
            ties.append(str(gpus))
        elif against_stock > 1.0:
            wins.append(str(gpus))
    unit = "ranks per node" if args.nodes > 1 else "GPUs"
    tied = f"within {100 * TIE:g}% (a tie) at " + ", ".join(ties) if ties else ""
    if wins:
        return line + "; Frugal is predicted faster at " + ", ".join(wins) + f" {unit}" + (f" and {tied}" if ties else "") + " (same batch per rank)"
    return line + f"; Frugal is predicted faster at none of {', '.join(map(str, counts))} {unit} at this batch" + (f", {tied}" if ties else "")


def workload(args: argparse.Namespace, gpus: int) -> Workload:
    """The workload of the command line with ``gpus`` GPUs per node."""
    return dlrm_workload(args.config, gpus * args.nodes, args.batch_size, args.scale, args.model,
                         presample_steps=args.presample_steps, nodes=args.nodes, real_data=not args.synthetic)  # fmt: skip


def scaling(profile: HardwareProfile, args: argparse.Namespace, counts: Sequence[int]) -> Dict[str, List[float]]:
    """Predicted samples/s of every sharding (Frugal with its recommended settings) per GPU count of a node."""
    curves: Dict[str, List[float]] = {sharding: [] for sharding in shardings_for(args.nodes)}
    model = CostModel(profile)
    for gpus in counts:
        for sharding, cost in predict_all(model, workload(args, gpus), _fixed_frugal(args)).items():
            curves[sharding].append(cost.samples_per_second)
    return curves


def plot(path: Path, counts: Sequence[int], curves: Dict[str, List[float]], title: str, nodes: int = 1) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for sharding, samples_per_second in curves.items():
        ax.plot(counts, samples_per_second, marker="o", label=sharding, linewidth=2.5 if sharding in FRUGAL_KINDS else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(counts), [str(count) for count in counts])
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


Number = Union[int, float]


def bounded(kind: Callable[[str], Number], low: Number, high: Optional[Number] = None,
            low_open: bool = False) -> Callable[[str], Number]:
    """An argparse ``type``: a ``kind`` number in [low, high] (``low_open``: (low, high]); a bad value
    becomes argparse's one-line error naming the range, not a traceback from deep in the model."""
    rng = ("in " + ("(" if low_open else "[") + f"{low:g}, {high:g}]" if high is not None
           else (">" if low_open else ">=") + f" {low:g}")
    what = "an integer" if kind is int else "a number"

    def parse(text: str) -> Number:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} {rng}, got {text!r}") from None
        if v != v or (v <= low if low_open else v < low) or (high is not None and v > high):
            raise argparse.ArgumentTypeError(f"expected {what} {rng}, got {text}")
        return v

    parse.__name__ = kind.__name__
    return parse


USAGE = "%(prog)s [-h] [--config NAME] [--hardware PROFILE] [options]"


def parser() -> argparse.ArgumentParser:
    """The command line; ``--help`` ends with what each config's default scale means."""
    ap = argparse.ArgumentParser(prog="python -m torchrec_frugal.estimate", usage=USAGE, description=__doc__,
                                 epilog=default_scale_text(), formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--config", choices=sorted(DATASETS), default="criteo-kaggle", metavar="NAME",
                    help=f"the dataset's tables: {', '.join(sorted(DATASETS))} (default: criteo-kaggle)")
    ap.add_argument("--scale", type=bounded(float, 0.0, 1.0, low_open=True), default=None, metavar="S",
                    help="row-count scale in (0, 1]; 1: the real dataset (default: the config's, listed below)")
    ap.add_argument("--gpus", type=bounded(int, 1), default=8, metavar="N",
                    help="ranks per node (GPUs, or CPU ranks on the cpu profile; default 8)")
    ap.add_argument("--nodes", type=bounded(int, 1), default=1, metavar="N",
                    help="machines, --gpus each; across nodes Frugal is frugal_row_wise and the profile's "
                         "network_bw prices what crosses the network (default 1)")  # fmt: skip
    ap.add_argument("--batch-size", type=bounded(int, 1), default=1024, metavar="B", help="per rank (default 1024)")
    ap.add_argument("--hardware", default="rtx3090", metavar="PROFILE",
                    help=f"a profile name ({', '.join(builtin_profiles())}) or a JSON file (default rtx3090)")
    ap.add_argument("--model", choices=MODEL_KINDS, default="dlrm", metavar="KIND",
                    help="dlrm (default): TorchRec's DLRM over one table per field; paper: the authors' benchmark, "
                         "one table, MLP 32-512-256-1")  # fmt: skip
    ap.add_argument("--cache-ratio", type=bounded(float, 0.0, 1.0), default=None, metavar="R",
                    help="frugal: fix the share of rows each rank caches, in [0, 1] (default: recommend one)")
    ap.add_argument("--lookahead", type=bounded(int, 0), default=None, metavar="L",
                    help="frugal: fix the lookahead L >= 0 (default: recommend one)")
    ap.add_argument("--presample-steps", type=bounded(int, 0), default=PRESAMPLE_STEPS, metavar="N",
                    help=f"batches per rank counted to pick the hot rows; 0: the true hottest rows (default {PRESAMPLE_STEPS})")
    ap.add_argument("--synthetic", action="store_true",
                    help="price the example's synthetic Zipf ids alone (default: the real data, whose tail reads every row once an epoch)")
    ap.add_argument("--terms", action="store_true",
                    help="also print every choice's step term by term, its memory, and what each term means")
    ap.add_argument("--json", type=Path, help="write the prediction here")
    ap.add_argument("--plot", type=Path, help="draw predicted samples/s against GPU count here (PNG; needs matplotlib)")
    ap.add_argument("--calibrate", type=Path, metavar="PATH", help="measure this machine and write its profile to PATH")
    ap.add_argument("--base", default=None, help="--calibrate: profile for what cannot be measured (default: cpu, or h200 with --device cuda)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="--calibrate: the device ranks train on")
    return ap


def parse_args(argv: Optional[Sequence[str]] = None, ap: Optional[argparse.ArgumentParser] = None) -> argparse.Namespace:
    """Parse and check the command line (with ``ap``, default :func:`parser`): a bad value exits
    with the usage line, one ``error:`` line and status 2, before anything is computed.
    ``args.profile``: the loaded profile (``--hardware``, or with ``--calibrate`` the base)."""
    ap = ap or parser()
    args = ap.parse_args(argv)
    try:
        if args.calibrate:
            args.profile = load_profile(args.base or ("h200" if args.device == "cuda" else "cpu"))
        else:
            args.profile = load_profile(args.hardware)
    except ProfileError as e:
        ap.error(f"--{'base' if args.calibrate else 'hardware'}: {e}")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        ap.error("--plot needs matplotlib (pip install matplotlib)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = parser()
    args = parse_args(argv, ap)
    profile = args.profile
    if args.calibrate:
        from .calibration import calibrate

        calibrate(str(args.calibrate), profile, args.calibrate.stem, args.device)
        return 0
    command_workload = workload(args, args.gpus)
    model = CostModel(profile)
    fixed = _fixed_frugal(args)
    try:
        costs = predict_all(model, command_workload, fixed)
    except ProfileError as e:
        ap.error(f"--hardware: {e}")
    kind = frugal_kind(args.nodes)
    plan = fixed or recommend_frugal(model, command_workload)[0]
    tables = command_workload.tables
    rows = sum(table.rows for table in tables)
    best = best_sharding(costs)
    where = f"{args.nodes} nodes x {args.gpus} ranks" if args.nodes > 1 else f"{args.gpus} ranks"
    n_tables = f"{len(tables)} table{'s' if len(tables) > 1 else ''}"
    head = (f"{args.config} ({n_tables}, {rows:,} rows, dim {tables[0].dim}), {args.model}, "
            f"{where} x batch {args.batch_size} on {profile.name}: {profile.description}")  # fmt: skip
    print(wrap(verdict(model, args, costs, profile, rows)))
    print("\n" + wrap(head) + "\n\nPREDICTED by the cost model (docs/cost_model.md), not measured:\n")
    print(choice_table(costs, kind))
    print(wrap(f"vs Frugal: samples/s over {kind}'s; within {100 * TIE:g}% reads as a tie. "
               + ("Term by term below." if args.terms else "--terms: every choice's step term by term and its memory.")))
    if args.terms:
        print("\n" + breakdown_table(costs))
        print("\nterms:")
        used = [term for term in TERMS if any(cost.terms[term] > 0 for cost in costs.values())]
        for term in used:
            print(wrap(f"- {term}: {TERM_HELP[term]}", "  "))
    frugal = costs[kind]
    print("\n" + wrap(
        f"{kind} settings: cache ratio {plan.cache_ratio:g}, lookahead L={plan.lookahead}"
        + (" (fixed)" if fixed else " (recommended: least predicted step time)")
        + f"; predicted cache hits {100 * frugal.details['cache_hit_ratio']:.1f}%, "
        f"{frugal.details['host_rows_per_rank']:,.0f} host rows per rank and step; beside the step: planner thread "
        f"{frugal.details.get('planner_thread_ms', 0.0):.3f} ms, exchange worker {frugal.details.get('exchange_worker_ms', 0.0):.3f} ms, "
        f"flushers {frugal.details.get('flushers_ms', 0.0):.3f} ms per step"))  # fmt: skip
    if args.nodes > 1:
        print(wrap("embedding bytes between nodes per step (all ranks): " + ", ".join(
            f"{name} {cost.details['embedding_bytes_between_nodes_per_step'] / 1e6:,.1f} MB"
            for name, cost in costs.items()), "  "))  # fmt: skip
    for name, cost in costs.items():
        if "uvm_load_factor" in cost.details:
            print(f"{name}: cache_load_factor {cost.details['uvm_load_factor']:g} (recommended)")
    tie = best != kind and is_tie(speed_ratio(costs[best], frugal)) and frugal.fits
    print(wrap(f"fastest predicted sharding that fits: {best} ({costs[best].samples_per_second:,.0f} samples/s)"
               + (f"; Frugal is within {100 * TIE:g}% of it, a tie" if tie else "")))
    bounds = bound_lines(costs, kind)
    print("\nwhat bounds the step (docs/cost_model.md, \"What bounds a step\"):")
    for side, (name, step_bound) in bounds.items():
        print(wrap(f"- {side} ({name}): {step_bound.text()}", "  "))
    try:
        if args.json:
            doc = {
                "prediction": True,
                "config": args.config, "scale": args.scale, "model": args.model, "gpus": args.gpus, "nodes": args.nodes,
                "batch_size": args.batch_size, "hardware": profile.name, "rows": rows,
                "recommended": {"sharding": best, "cache_ratio": plan.cache_ratio, "lookahead": plan.lookahead},
                "real_data": not args.synthetic,
                "bounds": {side: {"sharding": name, **step_bound.to_json()} for side, (name, step_bound) in bounds.items()},
                "shardings": {name: {**cost.to_json(), "terms": dict(cost.terms)} for name, cost in costs.items()},
            }  # fmt: skip
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {args.json}")
        if args.plot:
            counts = sorted(set(GPU_COUNTS) | {args.gpus})
            plot(args.plot, counts, scaling(profile, args, counts), head.split(": ")[0] + " (predicted)", args.nodes)
            print(f"wrote {args.plot}")
    except OSError as e:
        ap.error(f"cannot write {e.filename}: {e.strerror}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
