"""Plot the output of bench_dlrm.py.

    python benchmarks/plot_dlrm.py benchmarks/results/dlrm.json benchmarks/results/dlrm

writes ``<prefix>_throughput.png`` (samples/s per variant, one panel per batch size, with the
perfect-scaling line W x alone), and, when the JSON holds ablations, ``<prefix>_ablations.png``
(lookahead and cache-ratio curves, write-through and heap bars). A ``--convergence`` JSON gives
``<prefix>_convergence.png`` (loss and AUC of frugal and table_wise). Bars and points are medians
over the repetitions; whiskers span min-max.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.bench_dlrm import is_default_frugal  # noqa: E402

COLORS = {"frugal": "tab:green", "torchrec": "tab:blue", "alone": "tab:gray"}


def _err(os_: List[Dict[str, Any]]) -> List[List[float]]:
    return [[o["samples_per_second"] - o["samples_per_second_min"] for o in os_],
            [o["samples_per_second_max"] - o["samples_per_second"] for o in os_]]  # fmt: skip


def _subtitle(data: Dict[str, Any]) -> str:
    c, load = data["config"], data.get("machine_load", {})
    share = load.get("foreign_cpu_share")
    return (f"{c['config']}, {c['nproc']} ranks x {c['threads']} thread(s), {c['repeats']} repetition(s), "
            f"{data['machine']['cpus']} CPUs, train.py @ {data.get('train_commit', '?')}"
            + (f"\nother processes used {100 * share:.0f}% of the machine during the runs" if share is not None else ""))  # fmt: skip


def plot_throughput(data: Dict[str, Any], png: Path) -> None:
    med, variants = data["medians"], data["variants"]
    world = data["config"]["nproc"]
    batches = sorted({v["batch_size"] for v in variants}, reverse=True)
    fig, axes = plt.subplots(1, len(batches), figsize=(max(7.5, 6.2 * len(batches)), 5.2), squeeze=False)
    for ax, b in zip(axes[0], batches):
        ids = [v["id"] for v in variants if v["batch_size"] == b and med[v["id"]]["runs"]
               and (v["kind"] != "frugal" or is_default_frugal(med[v["id"]]))]  # fmt: skip
        os_ = [med[i] for i in ids]
        labels = [o["label"].replace(" (", "\n(") for o in os_]
        vals = [o["samples_per_second"] for o in os_]
        ax.bar(range(len(os_)), vals, yerr=_err(os_), capsize=4, color=[COLORS[o["kind"]] for o in os_])
        for k, o in enumerate(os_):
            note = f"{o['samples_per_second']:,.0f}"
            if o["kind"] == "alone":
                note += f"\n(x{world} = perfect scaling)"
            elif o.get("vs_best_stock") is not None:
                note += f"\n{o['vs_best_stock']:.2f}x best stock"
                if o.get("vs_perfect") is not None:
                    note += f"\n{o['vs_perfect']:.2f}x perfect"
            ax.text(k, o["samples_per_second_max"], note, ha="center", va="bottom", fontsize=8)
        perfect = next((o["perfect_scaling_samples_per_second"] for o in os_ if o.get("perfect_scaling_samples_per_second")), None)
        top = max([o["samples_per_second_max"] for o in os_] + [perfect or 0])
        if perfect:
            ax.axhline(perfect, ls="--", color="k", lw=1)
            ax.text(len(os_) - 0.5, perfect, f"perfect scaling ({world} x alone) {perfect:,.0f}", ha="right", va="bottom", fontsize=8)
        ax.set_xticks(range(len(os_)), labels, fontsize=8)
        ax.set_ylim(0, top * 1.25)
        ax.set_ylabel("samples/s, all ranks (median, min-max)")
        ax.set_title(f"batch {b} per rank")
    fig.suptitle("DLRM: Frugal vs stock TorchRec sharding\n" + _subtitle(data), fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _ref_lines(ax: Any, med: Dict[str, Dict[str, Any]], ref: Dict[str, Any]) -> None:
    best, perfect = ref.get("best_stock"), ref.get("perfect_scaling_samples_per_second")
    if best:
        ax.axhline(med[best]["samples_per_second"], ls=":", color=COLORS["torchrec"], lw=1.2, label=f"best stock ({med[best]['label']})")
    if perfect:
        ax.axhline(perfect, ls="--", color="k", lw=1, label="perfect scaling")


def plot_ablations(data: Dict[str, Any], png: Path) -> bool:
    med, variants = data["medians"], data["variants"]
    b0 = variants[0]["batch_size"]
    ref = next((med[v["id"]] for v in variants if v["batch_size"] == b0 and is_default_frugal(med[v["id"]])), None)
    panels = []
    for tag in ("lookahead", "cache"):
        ids = [v["id"] for v in variants if v["batch_size"] == b0 and (tag in v["ablations"] or is_default_frugal(med[v["id"]]))
               and med[v["id"]]["runs"] and med[v["id"]]["kind"] == "frugal"]  # fmt: skip
        if any(tag in v["ablations"] for v in variants):
            panels.append((tag, ids))
    bar_ids = [v["id"] for v in variants if v["batch_size"] == b0 and med[v["id"]]["runs"] and (
        is_default_frugal(med[v["id"]]) or any(t in v["ablations"] for t in ("write_through", "heap", "flush_workers")))]  # fmt: skip
    if any(t in v["ablations"] for v in variants for t in ("write_through", "heap", "flush_workers")):
        panels.append(("bars", bar_ids))
    if not panels or ref is None:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(max(7.5, 5.6 * len(panels)), 5.0), squeeze=False)
    for ax, (tag, ids) in zip(axes[0], panels):
        if tag == "bars":
            os_ = [med[i] for i in ids]
            ax.bar(range(len(os_)), [o["samples_per_second"] for o in os_], yerr=_err(os_), capsize=4, color="tab:green")
            for k, o in enumerate(os_):
                ax.text(k, o["samples_per_second_max"], f"{o['samples_per_second']:,.0f}\ngate {100 * o['gate_stall_fraction']:.1f}%",
                        ha="center", va="bottom", fontsize=8)
            ax.set_xticks(range(len(os_)), [o["label"].replace(" (", "\n(") for o in os_], fontsize=8)
            ax.set_title("proactive flush vs write-through / heap queue / flusher threads")
        else:
            key = "lookahead" if tag == "lookahead" else "cache_ratio"
            os_ = sorted((med[i] for i in ids), key=lambda o: o[key])
            xs = [o[key] for o in os_]
            ax.errorbar(xs, [o["samples_per_second"] for o in os_], yerr=_err(os_), marker="o", capsize=4,
                        color="tab:green", label="frugal")  # fmt: skip
            for o, x in zip(os_, xs):
                extra = (f"gate {100 * o['gate_stall_fraction']:.1f}%" if tag == "lookahead"
                         else f"hits {100 * (o['cache_hit_ratio'] or 0):.0f}%")  # fmt: skip
                ax.annotate(extra, (x, o["samples_per_second"]), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
            if tag == "cache":
                ax.set_xscale("log")
                ax.set_xticks(xs, [f"{x:g}" for x in xs])
            else:
                ax.set_xticks(xs)
            ax.set_xlabel("lookahead L (0 = write-through)" if tag == "lookahead" else "cache ratio per rank")
            ax.set_title(f"{'lookahead' if tag == 'lookahead' else 'cache ratio'} sweep")
        _ref_lines(ax, med, ref)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
        ax.set_ylabel("samples/s, all ranks (median, min-max)")
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"Frugal ablations, batch {b0} per rank\n" + _subtitle(data), fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def plot_convergence(data: Dict[str, Any], png: Path) -> None:
    med = data["medians"]
    os_ = [med["frugal"], med["table_wise"]]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 4.6))
    names = ["frugal", "torchrec table_wise"]
    for ax, key in ((a1, "auc"), (a2, "loss")):
        vals = [o[key] for o in os_]
        ax.bar(names, vals, color=[COLORS["frugal"], COLORS["torchrec"]])
        for k, v in enumerate(vals):
            ax.text(k, v, f"{v:.4f}", ha="center", va="bottom", fontsize=9)
        lo = min(vals)
        ax.set_ylim(lo - 0.02, max(vals) + 0.01)
        ax.set_title(f"{key} (last window)")
    c = data["convergence"]
    fig.suptitle(f"same steps ({data['variants'][0]['steps']}/rank) and seed: AUC difference {c['auc_difference']:+.4f} "
                 f"({'within' if c['passed'] else 'outside'} {c['tolerance']})\n" + _subtitle(data), fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path)
    ap.add_argument("prefix", type=Path, help="output path prefix, e.g. benchmarks/results/dlrm")
    args = ap.parse_args()
    data = json.loads(args.json.read_text())
    args.prefix.parent.mkdir(parents=True, exist_ok=True)
    out = []
    if "convergence" in data:
        p = Path(f"{args.prefix}_convergence.png")
        plot_convergence(data, p)
        out.append(p)
    else:
        p = Path(f"{args.prefix}_throughput.png")
        plot_throughput(data, p)
        out.append(p)
        p = Path(f"{args.prefix}_ablations.png")
        if plot_ablations(data, p):
            out.append(p)
    for p in out:
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
