"""Frugal against stock TorchRec sharding on the DLRM example: one command, same configuration and data.

Every run is ``torchrun --nproc_per_node=W examples/dlrm/train.py ... --summary S.json`` in fresh
processes; samples/s is what train.py measures after its warm-up steps (all ranks together, between
two barriers). The variants alternate within each repetition (round robin, start rotated by one per
repetition) so that drifts of a shared machine hit every variant alike, and the tables report
medians over ``--repeats`` repetitions.

Variants (``--variants``; all run on the same data, seed, model and steps per rank):

* ``frugal``      ``--sharder frugal`` (cache ratio 0.05, lookahead L = 10)
* ``table_wise``  ``--sharder torchrec --sharding table_wise``
* ``row_wise``    ``--sharder torchrec --sharding row_wise``
* ``alone``       one rank alone (world 1, ``--sharder torchrec``, no communication at all): the
                  upper bound. Perfect scaling = W x alone.

Every rank gets ``--threads`` torch threads (default: cores // W), the lone rank too, so "perfect
scaling" means W ranks each as fast as one rank alone with the same share of the machine.

Ablations (``--ablation``, any of): ``write_through`` (frugal with L = 0: every update reaches host
before the next step), ``heap`` (frugal with the binary-heap queue; needs train.py's ``--queue``),
``lookahead`` (L in 0 2 5 10 14), ``cache`` (cache ratio 0.01 0.05 0.1), ``flush_workers`` (1 or 2
background flusher threads per rank instead of the engine's choice on CPU, none), ``batch`` (the four
variants at batch 128 and 1024 per rank), ``all``.

    python benchmarks/bench_dlrm.py --json benchmarks/results/dlrm.json
    python benchmarks/bench_dlrm.py --model paper --config avazu --variants frugal table_wise row_wise --json paper.json
    python benchmarks/bench_dlrm.py --ablation all --json benchmarks/results/dlrm_ablations.json
    python benchmarks/bench_dlrm.py --convergence --json benchmarks/results/dlrm_convergence.json
    python benchmarks/plot_dlrm.py benchmarks/results/dlrm.json benchmarks/results/dlrm
    python benchmarks/bench_dlrm.py --results benchmarks/results/paper_dlrm_*.json   # a row per result, runs nothing

``--model paper`` runs the authors' benchmark model (one table, MLP 32-512-256-1, MSE, SGD). Every
table reports, per variant, the largest relative difference of a step's loss from a stock variant's
in the same repetition ("loss vs stock"): the runs start from the same tables and read the same
batches, so it is float rounding, or a defect.

``--convergence`` runs frugal and torchrec table_wise for the same steps and seed and reports the
difference of their AUCs (goal: within 0.002); it exits with status 1 when the difference is larger.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from examples.demo import TrainRunError, find_train_script, run_train  # noqa: E402
from benchmarks.measure import git_state, median_or_nan  # noqa: E402
from torchrec_frugal.estimate.timing import machine_busy_s  # noqa: E402

MAIN_VARIANTS = ("frugal", "table_wise", "row_wise", "alone")
STOCK = ("table_wise", "row_wise")
ABLATIONS = ("write_through", "heap", "lookahead", "cache", "flush_workers", "batch")
LOOKAHEADS = (0, 2, 5, 10, 14)
CACHE_RATIOS = (0.01, 0.05, 0.1)
BATCHES = (128, 1024)
FLUSH_WORKERS = (1, 2)
DEFAULT_L, DEFAULT_CACHE, DEFAULT_FLUSHERS = 10, 0.05, None  # None: the engine's choice (0 on CPU)


def default_steps(batch: int, convergence: bool = False) -> int:
    """Steps per rank so that one run takes ~20-30 s on 2 quiet cores (about 10 s of it is start-up):
    200 at batch 1024, 800 at batch 128 (smaller batches cost more per sample). x2.5 for --convergence."""
    steps = 200 if batch >= 1024 else int(round(200 * (1024 / batch) ** (2 / 3), -1))
    return int(steps * 2.5) if convergence else steps


def variant(vid: str, label: str, kind: str, batch: int, nproc: int, args: List[str], **facts: Any) -> Dict[str, Any]:
    return {"id": vid, "label": label, "kind": kind, "batch_size": batch, "nproc": nproc, "args": args,
            "ablations": [], **facts}  # fmt: skip


def frugal_variant(batch: int, world: int, lookahead: int = DEFAULT_L, cache: float = DEFAULT_CACHE,
                   queue: str = "two_level", flushers: Optional[int] = DEFAULT_FLUSHERS,
                   suffix: str = "") -> Dict[str, Any]:  # fmt: skip
    parts = []
    if lookahead != DEFAULT_L:
        parts.append(f"L{lookahead}")
    if cache != DEFAULT_CACHE:
        parts.append(f"c{cache:g}")
    if queue != "two_level":
        parts.append(queue)
    if flushers != DEFAULT_FLUSHERS:
        parts.append(f"fw{flushers}")
    vid = "_".join(["frugal"] + parts) + suffix
    label = (f"frugal (cache {cache:g}, L={lookahead}" + (", heap queue" if queue == "heap" else "")
             + (f", {flushers} flusher threads" if flushers != DEFAULT_FLUSHERS else "") + ")")  # fmt: skip
    if lookahead == 0:
        label += " write-through"
    args = ["--sharder", "frugal", "--cache-ratio", f"{cache:g}", "--lookahead", str(lookahead)]
    if queue != "two_level":
        args += ["--queue", queue]
    if flushers != DEFAULT_FLUSHERS:
        args += ["--flush-workers", str(flushers)]
    return variant(vid, label, "frugal", batch, world, args, lookahead=lookahead, cache_ratio=cache, queue=queue,
                   flush_workers=flushers)  # fmt: skip


def main_variants(names: Sequence[str], batch: int, world: int, suffix: str) -> List[Dict[str, Any]]:
    out = []
    for n in names:
        if n == "frugal":
            out.append(frugal_variant(batch, world, suffix=suffix))
        elif n in STOCK:
            out.append(variant(n + suffix, f"torchrec {n}", "torchrec", batch, world,
                               ["--sharder", "torchrec", "--sharding", n], sharding=n))  # fmt: skip
        elif n == "alone":
            out.append(variant("alone" + suffix, "one rank alone (world 1)", "alone", batch, 1,
                               ["--sharder", "torchrec", "--sharding", "table_wise"], sharding="table_wise"))  # fmt: skip
    return out


def train_has_flag(train_py: Path, flag: str) -> bool:
    return f'"{flag}"' in train_py.read_text()


def build_plan(args: argparse.Namespace, train_py: Path) -> tuple[List[Dict[str, Any]], List[str]]:
    """(variants, skipped-ablation notes). Each variant carries its complete train.py arguments."""
    W, B = args.nproc, args.batch_size
    skipped: List[str] = []
    if args.convergence:
        vs = main_variants(["frugal", "table_wise"], B, W, "")
    else:
        vs = main_variants(args.variants, B, W, "")
        abl = set(ABLATIONS) if "all" in args.ablation else set(args.ablation)

        def add(v: Dict[str, Any], tag: str) -> None:
            for u in vs:
                if u["args"] == v["args"] and u["batch_size"] == v["batch_size"] and u["nproc"] == v["nproc"]:
                    u["ablations"].append(tag)
                    return
            v["ablations"].append(tag)
            vs.append(v)

        if "write_through" in abl:
            add(frugal_variant(B, W, lookahead=0), "write_through")
        if "heap" in abl:
            if train_has_flag(train_py, "--queue"):
                add(frugal_variant(B, W, queue="heap"), "heap")
            else:
                skipped.append(
                    "heap: examples/dlrm/train.py has no --queue flag (it needs `--queue {two_level,heap}` "
                    "passed on as FrugalConfig(queue=...) in frugal_sharding); skipped"
                )
        if "lookahead" in abl:
            for L in LOOKAHEADS:
                add(frugal_variant(B, W, lookahead=L), "lookahead")
        if "cache" in abl:
            for c in CACHE_RATIOS:
                add(frugal_variant(B, W, cache=c), "cache")
        if "flush_workers" in abl:
            for fw in FLUSH_WORKERS:
                add(frugal_variant(B, W, flushers=fw), "flush_workers")
        if "batch" in abl:
            for b in BATCHES:
                for v in main_variants(MAIN_VARIANTS, b, W, "" if b == B else f"@b{b}"):
                    add(v, "batch")
    for v in vs:
        b = v["batch_size"]
        steps = args.steps if args.steps is not None else default_steps(b, args.convergence)
        common = ["--config", args.config, "--model", args.model, "--batch-size", str(b), "--steps", str(steps),
                  "--seed", str(args.seed), "--log-every", "0"]  # fmt: skip  # no periodic AUC inside the timed steps
        if args.scale is not None:
            common += ["--scale", f"{args.scale:g}"]
        if args.warmup is not None:
            common += ["--warmup", str(args.warmup)]
        v["steps"] = steps
        v["train_args"] = v["args"] + common + shlex.split(args.train_args)
    return vs, skipped


def schedule(n_variants: int, repeats: int) -> List[tuple[int, int]]:
    """(repeat, variant index) in run order: round robin, start rotated by one per repetition."""
    return [(r, (r + k) % n_variants) for r in range(repeats) for k in range(n_variants)]


# ---------------------------------------------------------------------------- statistics
def summarize(variants: List[Dict[str, Any]], runs: List[Dict[str, Any]], world: int) -> Dict[str, Dict[str, Any]]:
    """Per variant: medians over repetitions, and ratios against the best stock sharding and the
    perfect-scaling bound (W x alone) of the same batch size; ``*_paired`` ratios are medians over
    repetitions of the ratio within one repetition (same moment of the machine)."""
    ok = [r for r in runs if r.get("summary")]
    by: Dict[str, Dict[int, Dict[str, Any]]] = {v["id"]: {} for v in variants}
    for r in ok:
        by[r["variant"]][r["repeat"]] = r["summary"]
    out: Dict[str, Dict[str, Any]] = {}
    for v in variants:
        rs = list(by[v["id"]].values())
        sps = [s["samples_per_second"] for s in rs]
        with_fr = [s for s in rs if s.get("frugal")]
        fr = [s["frugal"] for s in with_fr]
        out[v["id"]] = {
            "label": v["label"], "kind": v["kind"], "batch_size": v["batch_size"], "nproc": v["nproc"],
            "ablations": v["ablations"], "lookahead": v.get("lookahead"), "cache_ratio": v.get("cache_ratio"),
            "queue": v.get("queue"), "flush_workers": v.get("flush_workers"), "runs": len(rs),
            "samples_per_second": median_or_nan(sps),
            "samples_per_second_min": min(sps) if sps else float("nan"),
            "samples_per_second_max": max(sps) if sps else float("nan"),
            "gate_stall_fraction": median_or_nan([s["gate_stall_fraction"] for s in rs]),
            "loss": median_or_nan([s["loss"] for s in rs]),
            "auc": median_or_nan([s["auc"] for s in rs]),
            "cache_hit_ratio": median_or_nan([f["cache_hit_ratio"] for f in fr]) if fr else None,
            "rows_flushed_per_step": median_or_nan([s["frugal"]["rows_flushed"] / s["steps"] for s in with_fr]) if fr else None,
            "wall_s": median_or_nan([s["wall_s"] for s in rs]),
            "foreign_cpu_share": median_or_nan([s.get("foreign_cpu_share") for s in rs]),
            "steps": v["steps"],
            "command": rs[0]["command"] if rs else None,
        }  # fmt: skip
    # ratios within each batch size
    for b in sorted({v["batch_size"] for v in variants}):
        ids = [v["id"] for v in variants if v["batch_size"] == b]
        stock = [i for i in ids if out[i]["kind"] == "torchrec" and out[i]["runs"]]
        alone = [i for i in ids if out[i]["kind"] == "alone" and out[i]["runs"]]
        frug = [i for i in ids if is_default_frugal(out[i])]
        best = max(stock, key=lambda i: out[i]["samples_per_second"]) if stock else None
        perfect = world * out[alone[0]]["samples_per_second"] if alone else None
        for i in ids:
            o = out[i]
            o["best_stock"] = best
            o["perfect_scaling_samples_per_second"] = perfect
            o["vs_best_stock"] = o["samples_per_second"] / out[best]["samples_per_second"] if best else None
            o["vs_perfect"] = o["samples_per_second"] / perfect if perfect else None
            paired_stock, paired_perfect, paired_frugal, loss_rel = [], [], [], []
            for rep, s in by[i].items():
                st = [by[j][rep]["samples_per_second"] for j in stock if rep in by[j]]
                loss_rel += [step_loss_difference(s, by[j][rep]) for j in stock if rep in by[j] and j != i]
                if st:
                    paired_stock.append(s["samples_per_second"] / max(st))
                if alone and rep in by[alone[0]]:
                    paired_perfect.append(s["samples_per_second"] / (world * by[alone[0]][rep]["samples_per_second"]))
                if frug and rep in by[frug[0]]:
                    paired_frugal.append(s["samples_per_second"] / by[frug[0]][rep]["samples_per_second"])
            o["vs_best_stock_paired"] = median_or_nan(paired_stock) if paired_stock else None
            o["vs_perfect_paired"] = median_or_nan(paired_perfect) if paired_perfect else None
            o["vs_frugal_paired"] = median_or_nan(paired_frugal) if paired_frugal else None
            o["step_loss_rel_vs_stock"] = max(loss_rel) if loss_rel else None
    return out


def step_loss_difference(a: Dict[str, Any], b: Dict[str, Any]) -> float:
    """The largest relative difference of two runs' per-step losses (mean over ranks), step by step."""
    la, lb = a.get("step_losses") or [], b.get("step_losses") or []
    if not la or len(la) != len(lb):
        return float("nan")
    return max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(la, lb))


# ---------------------------------------------------------------------------- tables
def _x(v: Optional[float]) -> str:
    return "-" if v is None or v != v else f"{v:.2f}x"


def _pct(v: Optional[float]) -> str:
    return "-" if v is None or v != v else f"{100 * v:.1f}%"


def default_flushers(o: Dict[str, Any]) -> bool:
    """The variant left the flusher threads to the engine (results recorded while 1 was the
    default say 1, outside the flush_workers ablation)."""
    fw = o.get("flush_workers")
    return fw is DEFAULT_FLUSHERS or (fw == 1 and "flush_workers" not in o.get("ablations", []))


def is_default_frugal(o: Dict[str, Any]) -> bool:
    return (o["kind"] == "frugal" and o["lookahead"] == DEFAULT_L and o["cache_ratio"] == DEFAULT_CACHE
            and o["queue"] == "two_level" and default_flushers(o))  # fmt: skip


def _variant_table(
    title: str,
    columns: Sequence[str],
    align: str,
    rows: Sequence[Dict[str, Any]],
    lead: Callable[[Dict[str, Any]], List[str]],
    figures: Callable[[Dict[str, Any]], List[str]],
) -> List[str]:
    """A markdown table of variants: each row's ``lead`` cells, then its ``figures``, or "failed"
    and empty cells where no run of it succeeded."""
    out = [f"\n{title}:\n", "| " + " | ".join(columns) + " |", align]
    for o in rows:
        cells = lead(o)
        if o["runs"]:
            out.append("| " + " | ".join(cells + figures(o)) + " |")
        else:
            out.append("| " + " | ".join(cells + ["failed"]) + " |" + " |" * (len(columns) - len(cells) - 1))
    return out


def markdown_tables(variants: List[Dict[str, Any]], med: Dict[str, Dict[str, Any]], world: int) -> str:
    lines: List[str] = []
    for b in sorted({v["batch_size"] for v in variants}, reverse=True):
        ids = [v["id"] for v in variants if v["batch_size"] == b and (v["kind"] != "frugal" or is_default_frugal(med[v["id"]]))]
        if not ids:
            continue
        lines += _variant_table(
            f"batch {b} per rank, {world} ranks",
            ["variant", "ranks", "samples/s (median)", "min-max", "vs best stock", "vs best stock (paired)",
             "vs perfect scaling", "vs perfect (paired)", "gate stall", "loss", "loss vs stock (max rel, per step)", "AUC",
             "cache hits", "wall s/run", "other load"],
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            [med[i] for i in ids],
            lambda o: [o["label"], str(o["nproc"])],
            lambda o: [
                f"{o['samples_per_second']:,.0f}", f"{o['samples_per_second_min']:,.0f}-{o['samples_per_second_max']:,.0f}",
                _x(o["vs_best_stock"]), _x(o["vs_best_stock_paired"]), _x(o["vs_perfect"]), _x(o["vs_perfect_paired"]),
                _pct(o["gate_stall_fraction"]) if o["kind"] == "frugal" else "-", f"{o['loss']:.4f}",
                "-" if o["step_loss_rel_vs_stock"] is None else f"{o['step_loss_rel_vs_stock']:.1e}", f"{o['auc']:.4f}",
                _pct(o["cache_hit_ratio"]) if o["cache_hit_ratio"] is not None else "-", f"{o['wall_s']:.0f}",
                _pct(o["foreign_cpu_share"]),
            ],
        )  # fmt: skip
        perfect = next((med[i]["perfect_scaling_samples_per_second"] for i in ids if med[i].get("perfect_scaling_samples_per_second")), None)
        if perfect:
            lines.append(f"| perfect scaling ({world} x alone) | {world} | {perfect:,.0f} | | | | 1.00x | | | | | | | | |")
    tags = [t for t in ABLATIONS if t != "batch" and any(t in v["ablations"] for v in variants)]
    for tag in tags:
        b0 = variants[0]["batch_size"]  # the main batch size: the single-knob ablations run there
        ids = [v["id"] for v in variants if v["batch_size"] == b0 and (tag in v["ablations"] or is_default_frugal(med[v["id"]]))]
        ids = sorted(ids, key=lambda i: (med[i]["lookahead"], med[i]["cache_ratio"], med[i]["queue"],
                                          -1 if default_flushers(med[i]) else med[i]["flush_workers"]))  # fmt: skip
        lines += _variant_table(
            f"ablation `{tag}` (batch {med[ids[0]]['batch_size']} per rank)",
            ["variant", "L", "cache ratio", "queue", "samples/s (median)", "min-max", "vs frugal L=10 (paired)",
             "vs best stock", "vs perfect scaling", "gate stall", "cache hits", "rows flushed/step", "AUC"],
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            [med[i] for i in ids],
            lambda o: [o["label"], str(o["lookahead"]), f"{o['cache_ratio']:g}", o["queue"]],
            lambda o: [
                f"{o['samples_per_second']:,.0f}", f"{o['samples_per_second_min']:,.0f}-{o['samples_per_second_max']:,.0f}",
                _x(o["vs_frugal_paired"]), _x(o["vs_best_stock"]), _x(o["vs_perfect"]), _pct(o["gate_stall_fraction"]),
                _pct(o["cache_hit_ratio"]), f"{o['rows_flushed_per_step']:,.0f}", f"{o['auc']:.4f}",
            ],
        )  # fmt: skip
    return "\n".join(lines).lstrip("\n")


GOALS = {1024: 1.4, 128: 1.8}  # issue 4: frugal / best stock at these batch sizes; >= 0.85 of perfect; stall < 5%


def goal_lines(variants: List[Dict[str, Any]], med: Dict[str, Dict[str, Any]]) -> List[str]:
    out = []
    for v in variants:
        o = med[v["id"]]
        if not is_default_frugal(o) or not o["runs"]:
            continue
        b = o["batch_size"]
        want = GOALS.get(b)
        parts = [f"batch {b}: frugal vs best stock {_x(o['vs_best_stock'])}" + (f" (goal >= {want}x)" if want else "")]
        if o["vs_perfect"] is not None:
            parts.append(f"vs perfect scaling {_x(o['vs_perfect'])} (goal >= 0.85x)")
        parts.append(f"gate stall {_pct(o['gate_stall_fraction'])} (goal < 5%)")
        out.append("; ".join(parts))
    return out


def results_table(paths: Sequence[Path]) -> str:
    """One markdown row per recorded result (``--json`` of earlier invocations; runs nothing): its
    config, model and batch, each variant's median samples/s, frugal / best stock (paired), the
    largest per-step loss difference of frugal from stock and of the two stock shardings from each
    other, and the machine's other load."""
    lines = ["| config | model | batch/rank | steps | frugal samples/s | table_wise | row_wise | frugal / best stock (paired) "
             "| loss vs stock, frugal (max rel, per step) | table_wise vs row_wise | other load | commit |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for p in paths:
        d = json.loads(Path(p).read_text())
        med, cfg = d["medians"], d["config"]
        fr = next((o for o in med.values() if is_default_frugal(o)), None)

        def sps(i: str) -> str:
            return f"{med[i]['samples_per_second']:,.0f}" if i in med and med[i]["runs"] else "-"

        def rel(o: Optional[Dict[str, Any]]) -> str:
            v = None if o is None else o.get("step_loss_rel_vs_stock")
            return "-" if v is None or v != v else f"{v:.1e}"

        lines.append(
            f"| {cfg['config']} | {cfg.get('model', 'dlrm')} | {fr['batch_size'] if fr else cfg['batch_size']} "
            f"| {d['variants'][0]['steps']} | {sps('frugal')} | {sps('table_wise')} | {sps('row_wise')} "
            f"| {_x(fr['vs_best_stock_paired']) if fr else '-'} | {rel(fr)} | {rel(med.get('table_wise'))} "
            f"| {_pct(d['machine_load']['foreign_cpu_share'])} | {d['train_commit'][:7]} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- driver
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2, help="ranks W of the multi-rank variants")
    ap.add_argument("--config", default="criteo-kaggle")
    ap.add_argument("--model", choices=("dlrm", "paper"), default="dlrm", help="train.py --model: TorchRec's DLRM or the paper's benchmark")
    ap.add_argument("--scale", type=float, default=None, help="row-count scale (default: train.py's, 0.1 for criteo-kaggle)")
    ap.add_argument("--batch-size", type=int, default=1024, help="per rank")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per rank and run (default: 200 at batch 1024, 800 at 128; x2.5 with --convergence)")
    ap.add_argument("--warmup", type=int, default=None, help="train.py --warmup (default: train.py's, min(20, steps/5))")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads per rank, the lone rank too (default: cores // W)")
    ap.add_argument("--repeats", type=int, default=None, help="repetitions (default 3; 1 with --convergence)")
    ap.add_argument("--variants", nargs="+", choices=MAIN_VARIANTS, default=list(MAIN_VARIANTS))
    ap.add_argument("--ablation", nargs="+", choices=ABLATIONS + ("all",), default=[])
    ap.add_argument("--convergence", action="store_true", help="frugal vs torchrec table_wise, same steps and seed: AUC difference")
    ap.add_argument("--tolerance", type=float, default=0.002, help="--convergence: largest |AUC difference| that passes")
    ap.add_argument("--train-args", default="", help="extra train.py arguments for every run (one quoted string)")
    ap.add_argument("--train", default=None, help="path of examples/dlrm/train.py (default: this checkout's)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--logs", type=Path, default=None, help="keep each run's output here (default: kept only in the JSON on failure)")
    ap.add_argument("--fail-fast", action="store_true", help="stop at the first failed run")
    ap.add_argument("--dry-run", action="store_true", help="print the runs and their commands, run nothing")
    ap.add_argument("--json", type=Path, help="write the configuration, every run's summary and the medians here")
    ap.add_argument("--results", type=Path, nargs="+", metavar="JSON",
                    help="run nothing: print one table row per recorded result (--json of earlier invocations)")
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.convergence else 3
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.convergence and (args.ablation or args.variants != list(MAIN_VARIANTS)):
        ap.error("--convergence runs frugal and table_wise only; drop --ablation / --variants")
    if args.threads is None:
        args.threads = max(1, (os.cpu_count() or 1) // args.nproc)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.results:
        print(results_table(args.results))
        return 0
    train_py = find_train_script(args.train or str(ROOT / "examples" / "dlrm" / "train.py"))
    variants, skipped = build_plan(args, train_py)
    order = schedule(len(variants), args.repeats)
    commit = git_state(ROOT, ("torchrec_frugal", "examples"))
    for note in skipped:
        print(f"[bench_dlrm] {note}", file=sys.stderr)
    print(f"[bench_dlrm] {len(variants)} variants x {args.repeats} repetitions = {len(order)} runs; "
          f"{args.threads} thread(s) per rank; {os.cpu_count()} CPUs; train.py at {commit}", flush=True)  # fmt: skip
    if args.dry_run:
        for v in variants:
            print(f"  {v['id']:<16} torchrun --standalone --nproc_per_node={v['nproc']} examples/dlrm/train.py "
                  f"{shlex.join(v['train_args'] + ['--threads', str(args.threads)])}")  # fmt: skip
        print("  order: " + ", ".join(f"r{r}:{variants[i]['id']}" for r, i in order))
        return 0

    from tqdm import tqdm

    runs: List[Dict[str, Any]] = []
    load_before = os.getloadavg()
    busy0, t0 = machine_busy_s(), time.perf_counter()
    bar = tqdm(order, unit="run", dynamic_ncols=True, desc="bench_dlrm")
    for k, (rep, vi) in enumerate(bar):
        v = variants[vi]
        bar.set_postfix_str(f"r{rep} {v['id']}")
        log = args.logs / f"r{rep}_{k:03d}_{v['id']}.log" if args.logs else None
        rec: Dict[str, Any] = {"variant": v["id"], "repeat": rep, "position": k}
        try:
            s = run_train(train_py, v["train_args"], nproc=v["nproc"], threads=args.threads, log_path=log,
                          timeout_s=args.timeout)  # fmt: skip
            rec["summary"] = s
            bar.write(f"r{rep} {v['id']:<16} {s['samples_per_second']:>9,.0f} samples/s | loss {s['loss']:.4f} "
                      f"| auc {s['auc']:.4f} | gate stall {100 * s['gate_stall_fraction']:.1f}% | {s['wall_s']:.0f} s wall"
                      + (f" | other load {100 * s['foreign_cpu_share']:.0f}%" if s.get("foreign_cpu_share") is not None else ""))  # fmt: skip
        except TrainRunError as e:
            rec["error"] = str(e)
            bar.write(f"r{rep} {v['id']}: FAILED {str(e)[:2000]}")
            if args.fail_fast:
                runs.append(rec)
                break
        runs.append(rec)
    bar.close()
    elapsed = time.perf_counter() - t0
    busy = machine_busy_s() - busy0
    own = sum(r["summary"]["run_cpu_s"] for r in runs if r.get("summary"))
    load = {"loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "foreign_cpu_share": max(0.0, busy - own) / (elapsed * (os.cpu_count() or 1)) if busy else None}  # fmt: skip

    med = summarize(variants, runs, args.nproc)
    head = (f"{args.config} (scale {runs[0]['summary']['scale'] if runs and runs[0].get('summary') else args.scale}), "
            f"{args.nproc} ranks x {args.threads} thread(s), {args.repeats} repetition(s), median; "
            f"{os.cpu_count()} CPUs; other processes used {_pct(load['foreign_cpu_share'])} of the machine; "
            f"{elapsed:.0f} s wall")  # fmt: skip
    result: Dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "train_commit": commit,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "wall_s": elapsed, "machine_load": load, "skipped": skipped,
        "variants": variants, "runs": runs, "medians": med,
    }  # fmt: skip
    status = 0
    if args.convergence:
        f, t = med["frugal"], med["table_wise"]
        diff = f["auc"] - t["auc"]
        passed = abs(diff) <= args.tolerance
        status = 0 if passed else 1
        steps = variants[0]["steps"]
        table = (
            "| sharder | steps/rank | loss | AUC (last window) | AUC (first window) | samples/s |\n|---|---:|---:|---:|---:|---:|\n"
            + "\n".join(
                f"| {o['label']} | {steps} | {o['loss']:.4f} | {o['auc']:.4f} | "
                f"{median_or_nan([r['summary']['auc_first_window'] for r in runs if r.get('summary') and r['variant'] == i]):.4f} "
                f"| {o['samples_per_second']:,.0f} |"
                for i, o in (("frugal", f), ("table_wise", t))
            )
            + f"\n\nAUC difference frugal - table_wise: {diff:+.4f} (tolerance {args.tolerance}): "
            + ("PASS" if passed else "FAIL")
            + f"; loss difference {f['loss'] - t['loss']:+.4f}"
        )
        result["convergence"] = {"auc_difference": diff, "tolerance": args.tolerance, "passed": passed,
                                 "loss_difference": f["loss"] - t["loss"]}  # fmt: skip
    else:
        table = markdown_tables(variants, med, args.nproc)
        goals = goal_lines(variants, med)
        if goals:
            table += "\n\n" + "\n".join(f"* {g}" for g in goals)
    if skipped:
        table += "\n\n" + "\n".join(f"* skipped: {s}" for s in skipped)
    failed = [r for r in runs if r.get("error")]
    if failed:
        table += f"\n\n* {len(failed)} run(s) failed (errors in the JSON)"
    result["table_markdown"] = table
    print("\n" + head + "\n\n" + table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\n[bench_dlrm] wrote {args.json}")
    return status if not failed else 2


if __name__ == "__main__":
    sys.exit(main())
