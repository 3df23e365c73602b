"""The cost model against measurement: the DLRM example's samples/s next to the profile's prediction.

For every point (config x batch per rank x ranks x sharder) it runs ``examples/dlrm/train.py`` in
fresh processes (``torchrun``, as ``benchmarks/bench_dlrm.py`` does; samples/s is train.py's figure
after its warm-up steps), predicts the same run with :mod:`torchrec_frugal.cost_model` on
``--profile`` (frugal with train.py's cache ratio and lookahead, 50 pre-sampled batches per rank;
``threads`` per rank as the run gets them), and reports predicted / measured - 1 per point.

    python benchmarks/bench_model.py --json benchmarks/results/model_cpu.json --markdown benchmarks/results/model_cpu.md
    python benchmarks/bench_model.py --configs avazu --batches 128 --ranks 1 --sharders table_wise --steps 60   # one point

The default grid is the issue's: criteo-kaggle and avazu at their default scales, batch 128 and
1024, 1, 2 and 4 ranks, frugal / table_wise / row_wise (36 runs, about 20 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the package and examples of this checkout

from torchrec_frugal.cost_model import CostModel, Plan  # noqa: E402
from torchrec_frugal.estimate import PRESAMPLE_STEPS, dlrm_workload  # noqa: E402
from torchrec_frugal.profiles import load_profile  # noqa: E402

from examples.demo import TrainRunError, run_train  # noqa: E402

SHARDERS = ("frugal", "table_wise", "row_wise")
CACHE_RATIO, LOOKAHEAD = 0.05, 10  # train.py's defaults


def default_steps(batch: int) -> int:
    """About 10-20 s of training per run on 2 cores (as bench_dlrm's runs)."""
    return 200 if batch >= 1024 else 600


def train_args(config: str, batch: int, sharder: str, steps: int, scale: Optional[float]) -> List[str]:
    args = ["--config", config, "--batch-size", str(batch), "--steps", str(steps), "--log-every", "0"]
    if scale is not None:
        args += ["--scale", f"{scale:g}"]
    if sharder == "frugal":
        return args + ["--sharder", "frugal", "--cache-ratio", f"{CACHE_RATIO:g}", "--lookahead", str(LOOKAHEAD)]
    return args + ["--sharder", "torchrec", "--sharding", sharder]


def predict(profile: Any, config: str, batch: int, ranks: int, sharder: str, threads: int, scale: Optional[float]) -> Dict[str, Any]:
    w = dlrm_workload(config, ranks, batch, scale, presample_steps=PRESAMPLE_STEPS, threads_per_rank=threads)
    c = CostModel(profile).predict(w, Plan(sharder, cache_ratio=CACHE_RATIO, lookahead=LOOKAHEAD))
    return {"samples_per_second": c.samples_per_second, "terms_ms": {k: 1e3 * v for k, v in c.terms.items() if v},
            "details": c.details}  # fmt: skip


def markdown(points: Sequence[Dict[str, Any]], profile: str) -> str:
    lines = [f"Predicted (`{profile}` profile) against measured samples/s of examples/dlrm/train.py; "
             "error = predicted / measured - 1; "
             "other load: CPU other processes used during the run (a loaded machine measures low).\n",
             "| config | batch/rank | ranks | sharder | measured | predicted | error | measured hits | predicted hits "
             "| other load |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for p in points:
        m = p.get("measured")
        hits_m = m.get("cache_hit_ratio") if m else None
        hits_p = p["predicted"]["details"].get("cache_hit_ratio")
        load = m.get("foreign_cpu_share") if m else None
        lines.append(
            f"| {p['config']} | {p['batch']} | {p['ranks']} | {p['sharder']} | "
            + (f"{m['samples_per_second']:,.0f}" if m else "failed")
            + f" | {p['predicted']['samples_per_second']:,.0f} | "
            + (f"{100 * p['error']:+.1f}%" if p.get("error") is not None else "-")
            + f" | {'-' if hits_m is None else f'{100 * hits_m:.1f}%'} | {'-' if hits_p is None else f'{100 * hits_p:.1f}%'}"
            + f" | {'-' if load is None else f'{100 * load:.0f}%'} |"
        )
    errs = [abs(p["error"]) for p in points if p.get("error") is not None]
    if errs:
        lines.append(f"\n{len(errs)} points: median |error| {100 * statistics.median(errs):.1f}%, "
                     f"largest {100 * max(errs):.1f}%, within 20%: {sum(e <= 0.2 for e in errs)} of {len(errs)}")  # fmt: skip
    return "\n".join(lines)


def repredict(args: argparse.Namespace, profile: Any) -> int:
    """The points an earlier run measured, predicted again with ``profile`` (a profile compared
    on the same measurements, without running them again)."""
    earlier = json.loads(args.repredict.read_text())
    points = []
    for p in earlier["points"]:
        q = dict(p, predicted=predict(profile, p["config"], p["batch"], p["ranks"], p["sharder"], p["threads"], args.scale))
        if p.get("measured"):
            q["error"] = q["predicted"]["samples_per_second"] / p["measured"]["samples_per_second"] - 1.0
        points.append(q)
    table = markdown(points, profile.name)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"profile": profile.to_json(), "measured_in": str(args.repredict), "points": points,
                                         "table_markdown": table}, indent=1) + "\n")  # fmt: skip
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return 0


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["criteo-kaggle", "avazu"])
    ap.add_argument("--batches", nargs="+", type=int, default=[128, 1024])
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--sharders", nargs="+", choices=SHARDERS, default=list(SHARDERS))
    ap.add_argument("--scale", type=float, default=None, help="row-count scale (default: each config's)")
    ap.add_argument("--steps", type=int, default=None, help="steps per rank (default: 200 at batch >= 1024, else 600)")
    ap.add_argument("--profile", default="cpu", help="hardware profile of the prediction")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="print the predictions and the runs, run nothing")
    ap.add_argument("--repredict", type=Path, metavar="JSON",
                    help="run nothing: predict the measured points of an earlier --json with --profile")
    return ap.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    profile = load_profile(args.profile)
    if args.repredict:
        return repredict(args, profile)
    train_py = ROOT / "examples" / "dlrm" / "train.py"
    cores = os.cpu_count() or 1
    points: List[Dict[str, Any]] = []
    t0 = time.perf_counter()
    for config, batch, ranks, sharder in itertools.product(args.configs, args.batches, args.ranks, args.sharders):
        threads = max(1, cores // ranks)
        steps = args.steps or default_steps(batch)
        p: Dict[str, Any] = {"config": config, "batch": batch, "ranks": ranks, "sharder": sharder, "threads": threads,
                             "steps": steps, "predicted": predict(profile, config, batch, ranks, sharder, threads, args.scale)}  # fmt: skip
        cmd = train_args(config, batch, sharder, steps, args.scale)
        if args.dry_run:
            print(f"{config} b{batch} x{ranks} {sharder}: predicted {p['predicted']['samples_per_second']:,.0f} samples/s; "
                  f"torchrun --nproc_per_node={ranks} examples/dlrm/train.py {' '.join(cmd)} --threads {threads}")  # fmt: skip
            continue
        try:
            s = run_train(train_py, cmd, nproc=ranks, threads=threads, timeout_s=args.timeout)
            p["measured"] = {"samples_per_second": s["samples_per_second"], "foreign_cpu_share": s.get("foreign_cpu_share"),
                             "cache_hit_ratio": (s.get("frugal") or {}).get("cache_hit_ratio"), "wall_s": s["wall_s"]}  # fmt: skip
            p["error"] = p["predicted"]["samples_per_second"] / s["samples_per_second"] - 1.0
            print(f"{config} b{batch} x{ranks} {sharder}: measured {s['samples_per_second']:,.0f}, predicted "
                  f"{p['predicted']['samples_per_second']:,.0f} ({100 * p['error']:+.1f}%)", flush=True)  # fmt: skip
        except TrainRunError as e:
            p["failure"] = str(e)[-2000:]
            print(f"{config} b{batch} x{ranks} {sharder}: FAILED {str(e)[-500:]}", flush=True)
        points.append(p)
    if args.dry_run:
        return 0
    table = markdown(points, profile.name)
    print("\n" + table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"profile": profile.to_json(), "cpus": cores, "wall_s": time.perf_counter() - t0,
                                         "points": points, "table_markdown": table}, indent=1) + "\n")  # fmt: skip
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table + "\n")
    return 1 if any("failure" in p for p in points) else 0


if __name__ == "__main__":
    sys.exit(main())
