"""Soak of the DLRM example: does a long run keep its rate, and do Frugal's pending rows stay bounded?

Runs ``examples/dlrm/train.py`` for ``--steps`` steps per rank (default 5,000) with each variant in
turn, same data and seed: Frugal with the lookahead (L = 10), Frugal write-through (L = 0) and
TorchRec table_wise. train.py logs, every ``--every`` steps, the rate over those steps and the
pending host writes of rank 0's engines; this script keeps those intervals and reports, per variant:

* the rate of the first interval after the warm-up interval and of the last one, and their ratio
  (goal: the last within 3% of the first), and rank 0's engine time per step in both (the
  training thread's time in Frugal's engine: unlike the rate, it does not move with the speed
  of the machine, which drifts over minutes on a shared host),
* the pending rows at each interval, against their bound: ``max_deferred_rows`` (rows nobody reads
  within the window wait in the infinity bucket until there are more than that many, then the
  flushers drain them) plus the rows the window's steps read from host, at most ``(L + 1) x`` the
  rows a step reads from host.

    python benchmarks/soak_dlrm.py --json benchmarks/results/soak.json --plot benchmarks/results/soak.png
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from examples.demo import find_train_script, run_train  # noqa: E402

VARIANTS = {
    "frugal": ["--sharder", "frugal", "--lookahead", "10"],
    "write_through": ["--sharder", "frugal", "--lookahead", "0"],
    "table_wise": ["--sharder", "torchrec", "--sharding", "table_wise"],
}


def drift(intervals: List[Dict[str, float]]) -> Dict[str, float]:
    """First interval after the warm-up one, the last one, and last / first."""
    if len(intervals) < 3:
        raise ValueError(f"a soak needs at least 3 logged intervals, got {len(intervals)}")
    first, last = intervals[1]["samples_per_second"], intervals[-1]["samples_per_second"]
    return {"first": first, "last": last, "last_over_first": last / first}


def plot(results: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, eng, pend) = plt.subplots(1, 3, figsize=(15, 4))
    for name, r in results["variants"].items():
        steps = [i["step"] for i in r["intervals"]]
        rate.plot(steps, [i["samples_per_second"] / 1e3 for i in r["intervals"]], marker="o", label=name)
        if name != "table_wise":
            eng.plot(steps, [i["engine_ms_per_step"] for i in r["intervals"]], marker="o", label=name)
            pend.plot(steps, [i["pending_rows"] / 1e3 for i in r["intervals"]], marker="o", label=name)
    bound = results["pending_bound_rows"]
    pend.axhline(bound / 1e3, color="gray", linestyle="--", label="nominal bound")
    rate.set(xlabel="step", ylabel="k samples/s (all ranks)", title=f"rate per {results['every']} steps")
    eng.set(xlabel="step", ylabel="ms per step (rank 0)", title="training thread in the engine")
    pend.set(xlabel="step", ylabel="k rows (rank 0)", title="pending host writes")
    for ax in (rate, eng, pend):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--every", type=int, default=600, help="steps per logged interval")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-deferred-rows", type=int, default=65536, help="FrugalConfig's default, used by train.py")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--replot", type=Path, help="only draw --plot from this JSON of an earlier run")
    args = ap.parse_args()
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.plot)
        return
    train_py = find_train_script()
    common = ["--scale", str(args.scale), "--batch-size", str(args.batch_size), "--steps", str(args.steps),
              "--warmup", str(args.every), "--log-every", str(args.every)]
    results: Dict[str, Any] = {"steps": args.steps, "every": args.every, "nproc": args.nproc, "scale": args.scale,
                               "batch_size": args.batch_size, "threads": args.threads, "variants": {}}
    for name in args.variants:
        print(f"== {name}: {args.steps} steps", flush=True)
        s = run_train(train_py, common + VARIANTS[name], nproc=args.nproc, threads=args.threads,
                      timeout_s=args.timeout, echo=lambda line: print("   ", line, flush=True))
        d = drift(s["intervals"])
        results["variants"][name] = {"intervals": s["intervals"], **d, "samples_per_second": s["samples_per_second"],
                                     "peak_rss_mib_per_rank": s["peak_rss_mib_per_rank"], "command": s["command"]}
    # Rows a step reads from host, at most: every id of the batch of every rank (26 tables).
    host_reads_per_step = args.nproc * args.batch_size * 26
    results["pending_bound_rows"] = args.max_deferred_rows + (10 + 1) * host_reads_per_step
    print(f"\n{args.steps} steps, {args.nproc} ranks x {args.threads} thread, scale {args.scale}, batch {args.batch_size}")
    print("| variant | first k/s | last k/s | last / first | engine ms/step, rank 0 (first -> last) | pending rows (first -> max -> last) | peak RSS MiB |")
    print("|---|---:|---:|---:|---|---|---:|")
    for name, r in results["variants"].items():
        p = [i["pending_rows"] for i in r["intervals"]]
        e = [i["engine_ms_per_step"] for i in r["intervals"]]
        print(f"| {name} | {r['first'] / 1e3:.1f} | {r['last'] / 1e3:.1f} | {r['last_over_first']:.3f} | "
              f"{e[1]:.2f} -> {e[-1]:.2f} | {p[1]:,} -> {max(p):,} -> {p[-1]:,} | {max(r['peak_rss_mib_per_rank']):.0f} |")
    print(f"pending bound: {results['pending_bound_rows']:,} rows; command: python {shlex.join(sys.argv)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
