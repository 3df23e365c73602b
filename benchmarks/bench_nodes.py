"""frugal_row_wise against TorchRec's row_wise and table_row_wise on nodes simulated on this machine.

Every run is the DLRM example launched as ``--nnodes`` torchrun launches on 127.0.0.1 (static
rendezvous, ``--nproc`` ranks each, a shared-memory directory per node: ``run_train_nodes``),
with ``--count-comm``: besides samples/s (all ranks, after the warm-up), the bytes the embedding
collectives send per step, all ranks together, to ranks of another node (what would cross the
network) and to other ranks of the same node. The shardings run in turn, ``--repeats`` rounds,
the first rotated by one each round; the table reports medians and ratios to row_wise. ``planned``
is train.py's FrugalShardingPlanner with ``--hardware`` set to the profile of the simulated nodes:
the cost model chooses each table's sharding, the cache ratio and L.

    python benchmarks/bench_nodes.py --json benchmarks/results/nodes.json --plot benchmarks/results/nodes.png
    python benchmarks/bench_nodes.py --lookahead 0 --json benchmarks/results/nodes_l0.json --plot benchmarks/results/nodes_l0.png
    python benchmarks/bench_nodes.py --repredict benchmarks/results/nodes.json --profile cpu   # predictions only

Beside each measurement stands the cost model's prediction on ``--profile`` (default ``cpu``) for the
same runs, with the simulated nodes as they are: each gets its share of the machine's cores
(``host_cores / nodes``) and they talk over the profile's ``network_bw`` (on ``cpu``: loopback gloo).

On one machine the "network" is loopback and the nodes share its cores, so samples/s here says
how the shardings' work compares, not what a real network would make of their bytes; the bytes
are what a real network would carry.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from examples.demo import run_plan, run_train_nodes  # noqa: E402
from torchrec_frugal.estimate.cost_model import CostModel  # noqa: E402
from torchrec_frugal.estimate.cli import PRESAMPLE_STEPS, dlrm_workload  # noqa: E402
from torchrec_frugal.estimate.profiles import HardwareProfile, load_profile  # noqa: E402
from benchmarks.measure import git_state, median_or_nan  # noqa: E402


SHARDINGS = {
    "frugal_row_wise": ["--sharding", "frugal_row_wise"],
    "row_wise": ["--sharder", "torchrec", "--sharding", "row_wise"],
    "table_row_wise": ["--sharder", "torchrec", "--sharding", "table_row_wise"],
    "planned": ["--sharder", "frugal"],  # FrugalShardingPlanner with the simulated nodes' profile (--hardware)
}


def schedule(names: Sequence[str], repeats: int) -> List[str]:
    """Round robin, each round starting one later: no sharding always runs first."""
    return [names[(r + i) % len(names)] for r in range(repeats) for i in range(len(names))]


def summarize(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Dict[str, float]]:
    """Medians per sharding, and samples/s and bytes between nodes relative to row_wise."""
    out: Dict[str, Dict[str, float]] = {}
    for name, rs in runs.items():
        out[name] = {
            "samples_per_second": median_or_nan([r["samples_per_second"] for r in rs]),
            "bytes_between_nodes_per_step": median_or_nan([r["comm"]["bytes_between_nodes_per_step"] for r in rs]),
            "bytes_within_node_per_step": median_or_nan([r["comm"]["bytes_within_node_per_step"] for r in rs]),
            "runs": len(rs),
        }
    base = out.get("row_wise")
    for row in out.values():
        if base:
            row["samples_per_second_vs_row_wise"] = row["samples_per_second"] / base["samples_per_second"]
            row["bytes_between_nodes_vs_row_wise"] = row["bytes_between_nodes_per_step"] / base["bytes_between_nodes_per_step"]
    return out


def simulated(profile: HardwareProfile, nodes: int) -> HardwareProfile:
    """The profile of one simulated node: its share of the machine's cores and devices."""
    return replace(profile, host_cores=max(1, profile.host_cores // nodes), devices=max(1, profile.devices // nodes))


def predictions(args: argparse.Namespace, profile: HardwareProfile, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    """The cost model's samples/s and bytes per step (all ranks) for each sharding of the runs."""
    w = dlrm_workload(args.config, args.nodes * args.nproc, args.batch_size, args.scale,
                      presample_steps=PRESAMPLE_STEPS, threads_per_rank=1, nodes=args.nodes)  # fmt: skip
    model = CostModel(simulated(profile, args.nodes))
    out: Dict[str, Dict[str, Any]] = {}
    for name, rs in runs.items():
        c = model.predict(w, run_plan(name, rs[0].get("plan") if rs else None, args.lookahead))
        out[name] = {"samples_per_second": c.samples_per_second,
                     "bytes_between_nodes_per_step": c.details["embedding_bytes_between_nodes_per_step"],
                     "bytes_within_node_per_step": c.details["embedding_bytes_within_node_per_step"],
                     "terms_ms": {k: 1e3 * v for k, v in c.terms.items() if v}}  # fmt: skip
        if name == "planned" and rs:
            out[name]["plan"] = rs[0]["plan"]
    return out


def with_predictions(table: Dict[str, Dict[str, Any]], predicted: Dict[str, Dict[str, float]]) -> None:
    """Each row gets its prediction and the relative error of samples/s and of bytes between nodes."""
    for name, row in table.items():
        p = predicted[name]
        row["predicted"] = p
        row["error"] = p["samples_per_second"] / row["samples_per_second"] - 1.0
        if row["bytes_between_nodes_per_step"]:
            row["bytes_error"] = p["bytes_between_nodes_per_step"] / row["bytes_between_nodes_per_step"] - 1.0


def markdown(table: Dict[str, Dict[str, Any]], head: str) -> str:
    lines = [head, "", "| sharding | samples/s | vs row_wise | predicted (error) | bytes between nodes / step | vs row_wise "
             "| predicted (error) | bytes within a node / step | predicted |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, r in table.items():
        p = r["predicted"]
        lines.append(
            f"| {name} | {r['samples_per_second']:,.0f} | {r.get('samples_per_second_vs_row_wise', float('nan')):.3f} | "
            f"{p['samples_per_second']:,.0f} ({100 * r['error']:+.1f}%) | "
            f"{r['bytes_between_nodes_per_step']:,.0f} | {r.get('bytes_between_nodes_vs_row_wise', float('nan')):.3f} | "
            f"{p['bytes_between_nodes_per_step']:,.0f} ({100 * r.get('bytes_error', 0.0):+.1f}%) | "
            f"{r['bytes_within_node_per_step']:,.0f} | {p['bytes_within_node_per_step']:,.0f} |"
        )
    return "\n".join(lines)


def plot(path: Path, table: Dict[str, Dict[str, float]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    axes[0].bar(names, [table[n]["samples_per_second"] for n in names], color="tab:blue", label="measured (median)")
    if all("predicted" in table[n] for n in names):
        axes[0].scatter(names, [table[n]["predicted"]["samples_per_second"] for n in names], color="black",
                        marker="D", zorder=3, label="predicted (cost model)")  # fmt: skip
    axes[0].set_ylabel("samples/s (all ranks)")
    axes[0].legend(fontsize=8, loc="lower right")
    between = [table[n]["bytes_between_nodes_per_step"] / 1e6 for n in names]
    within = [table[n]["bytes_within_node_per_step"] / 1e6 for n in names]
    axes[1].bar(names, between, label="between nodes", color="tab:red")
    axes[1].bar(names, within, bottom=between, label="within a node", color="tab:gray")
    axes[1].set_ylabel("MB sent per step (all ranks)")
    axes[1].legend()
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=15)
    fig.suptitle(textwrap.fill(title, 140), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2, help="ranks per node")
    ap.add_argument("--config", default="criteo-kaggle")
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--batch-size", type=int, default=1024, help="per rank")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--lookahead", type=int, default=10, help="frugal_row_wise: the engines' lookahead window L")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shardings", nargs="+", choices=list(SHARDINGS), default=list(SHARDINGS))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--profile", default="cpu", help="hardware profile of the predictions (name or JSON file)")
    ap.add_argument("--repredict", type=Path, metavar="JSON",
                    help="no runs: predict the runs of an earlier --json again with --profile and rewrite it")
    return ap.parse_args(argv)


def head_line(args: argparse.Namespace, profile: str) -> str:
    return (f"{args.config}, batch {args.batch_size} per rank, {args.nodes} nodes x {args.nproc} ranks simulated on one "
            f"machine (loopback; the nodes share its cores), frugal_row_wise L={args.lookahead}, {args.steps} steps, "
            f"medians of {args.repeats} runs; predicted on the `{profile}` profile")  # fmt: skip


def repredict(args: argparse.Namespace) -> int:
    """Predictions of ``--profile`` for the runs an earlier ``--json`` recorded (its arguments kept)."""
    doc = json.loads(args.repredict.read_text())
    recorded = argparse.Namespace(**doc["args"])
    profile = load_profile(args.profile)
    table = {n: {k: v for k, v in r.items() if k not in ("predicted", "error", "bytes_error")} for n, r in doc["table"].items()}
    with_predictions(table, predictions(recorded, profile, doc["runs"]))
    text = markdown(table, head_line(recorded, profile.name))
    print(text)
    doc.update(table=table, markdown=text, profile=profile.name)
    args.repredict.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.repredict:
        return repredict(args)
    profile = load_profile(args.profile)
    train_py = ROOT / "examples" / "dlrm" / "train.py"
    # the planner of "planned" prices the simulated nodes as they are (each its share of the cores)
    sim_profile = (args.json.with_name(args.json.stem + "_profile.json") if args.json
                   else Path(tempfile.mkdtemp(prefix="bench_nodes_")) / "profile.json").resolve()  # fmt: skip
    simulated(profile, args.nodes).save(sim_profile)
    if sim_profile.is_relative_to(ROOT):
        sim_profile = sim_profile.relative_to(ROOT)  # train.py runs in ROOT; the recorded command stays portable
    common = ["--config", args.config, "--batch-size", str(args.batch_size), "--steps", str(args.steps),
              "--log-every", "0", "--count-comm"] + (["--scale", f"{args.scale:g}"] if args.scale else [])  # fmt: skip
    shardings = dict(SHARDINGS, frugal_row_wise=SHARDINGS["frugal_row_wise"] + ["--lookahead", str(args.lookahead)],
                     planned=SHARDINGS["planned"] + ["--hardware", str(sim_profile)])  # fmt: skip
    runs: Dict[str, List[Dict[str, Any]]] = {n: [] for n in args.shardings}
    t0 = time.perf_counter()
    for name in tqdm(schedule(args.shardings, args.repeats), desc="bench_nodes runs"):
        s = run_train_nodes(train_py, common + shardings[name], nodes=args.nodes, nproc=args.nproc, threads=1,
                            timeout_s=args.timeout)  # fmt: skip
        runs[name].append({k: s[k] for k in ("samples_per_second", "comm", "loss", "auc", "wall_s", "command", "plan")})
        tqdm.write(f"{name}: {s['samples_per_second']:,.0f} samples/s, {s['comm']['bytes_between_nodes_per_step']:,.0f} "
                   f"bytes between nodes per step")  # fmt: skip
    table = summarize(runs)
    with_predictions(table, predictions(args, profile, runs))
    head = head_line(args, profile.name)
    text = markdown(table, head)
    print("\n" + text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json), "plot": str(args.plot)},
                                         "git": git_state(ROOT), "wall_s": time.perf_counter() - t0, "profile": profile.name,
                                         "table": table, "runs": runs, "markdown": text}, indent=1) + "\n")  # fmt: skip
    if args.plot:
        plot(args.plot, table, head)
    return 0


if __name__ == "__main__":
    sys.exit(main())
