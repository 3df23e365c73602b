"""Plot the output of bench_engine.py: where a step's time goes per mode, and CPU per step.

    python benchmarks/plot_engine.py benchmarks/results/engine.json benchmarks/results/engine.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def background_ms(mode_summary: dict) -> float:
    """CPU ms per step of the threads beside the training thread (``bench_engine``'s per-role columns)."""
    return sum(mode_summary[f"cpu_{role}_ms"] for role in ("exchange", "lookahead", "flusher"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--flushed", type=Path, help="also plot rank 0's rows flushed per step, first repeat of each mode")
    args = ap.parse_args()
    data = json.loads(args.json.read_text())
    summary = data["summary"]
    modes = list(summary)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.4))
    parts = [
        ("dense_ms", "dense MLP fwd+bwd"),
        ("coalesce_ms", "gradient coalescing"),
        ("engine_work_ms", "engine work"),
        ("exchange_wait_ms", "wait for peers' gradients"),
        ("gate_ms", "gate wait"),
    ]
    bottom = [0.0] * len(modes)
    for key, label in parts:
        vals = [summary[m][key] for m in modes]
        ax1.bar(modes, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, m in enumerate(modes):
        ax1.text(i, bottom[i], f"{summary[m]['step_ms']:.0f} ms\ngate {100 * summary[m]['gate_stall']:.1f}%",
                 ha="center", va="bottom", fontsize=8)
    ax1.set_ylabel("wall ms per step (each part: median of repeats)")
    ax1.set_ylim(0, max(bottom) * 1.25)
    ax1.set_title("Wall time per step")
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)

    cpu_parts = [
        ("cpu_dense_ms", "training thread: dense"),
        ("cpu_engine_ms", "training thread: engine calls"),
        (None, "training thread: other"),
        ("background", "exchange, lookahead and flusher threads"),
    ]
    bottom = [0.0] * len(modes)
    for key, label in cpu_parts:
        if key is None:
            vals = [max(0.0, summary[m]["cpu_train_ms"] - summary[m]["cpu_dense_ms"] - summary[m]["cpu_engine_ms"])
                    for m in modes]
        elif key == "background":
            vals = [background_ms(summary[m]) for m in modes]
        else:
            vals = [summary[m][key] for m in modes]
        ax2.bar(modes, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_ylabel("CPU ms per step and rank")
    ax2.set_title("CPU time per step (robust to other load)")
    for i, m in enumerate(modes):
        ax2.text(i, bottom[i], f"{summary[m]['cpu_engine_ms'] + background_ms(summary[m]):.1f} ms\nengine+background",
                 ha="center", va="bottom", fontsize=8)
    ax2.set_ylim(0, max(bottom) * 1.2)
    ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)

    cfg, load = data["config"], data.get("machine_load", {})
    fig.suptitle(
        f"FrugalEngine, {cfg['world']} ranks, {data['machine']['cpus']} CPUs, torch {data['machine']['torch']}; "
        f"tables {data['table_rows']} x {cfg['dim']}, batch {cfg['batch']}/rank, Zipf {cfg['zipf']}; "
        f"other load {100 * load.get('foreign_cpu_share', 0):.0f}%",
        fontsize=9,
    )
    fig.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)

    if args.flushed:
        fig, ax = plt.subplots(figsize=(8, 4))
        seen = set()
        for run in data["per_step_rank0"]:
            if run["mode"] in seen or not any(run["rows_flushed"]):
                continue
            seen.add(run["mode"])
            y = run["rows_flushed"]
            k = 10
            smooth = [sum(y[max(0, i - k + 1) : i + 1]) / len(y[max(0, i - k + 1) : i + 1]) for i in range(len(y))]
            x = [cfg["warmup"] + i for i in range(len(y))]
            ax.plot(x, smooth, label=run["mode"])
        ax.set_xlabel("step")
        ax.set_ylabel(f"rows flushed by rank 0 per step ({k}-step mean)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"Host writes per step; max_deferred_rows={cfg.get('max_deferred_rows')}", fontsize=10)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.flushed, dpi=110)


if __name__ == "__main__":
    main()
