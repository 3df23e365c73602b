"""The cost model against measurement: the DLRM example's samples/s next to the profile's prediction.

For every point (config x batch per rank x ranks x sharder) it runs ``examples/dlrm/train.py`` in
fresh processes (``torchrun``, as ``benchmarks/bench_dlrm.py`` does; samples/s is train.py's figure
after its warm-up steps), predicts the same run with :mod:`torchrec_frugal.estimate.cost_model` on
``--profile`` (frugal with train.py's cache ratio and lookahead, 50 pre-sampled batches per rank;
``threads`` per rank as the run gets them), and reports predicted / measured - 1 per point.

The sharder ``planned`` is the planner's own choice: train.py with ``--sharder frugal --hardware
PROFILE`` (FrugalShardingPlanner picks each table's sharding, the cache ratio and L by the model);
its prediction is that plan's, and the report sets its measured samples/s against the best
measured uniform plan of the same point (the planner's goal: never more than 5% slower).

    python benchmarks/bench_model.py --json benchmarks/results/model_cpu.json --markdown benchmarks/results/model_cpu.md
    python benchmarks/bench_model.py --configs avazu --batches 128 --ranks 1 --sharders table_wise --steps 60   # one point

The default grid is the issue's: criteo-kaggle and avazu at their default scales, batch 128 and
1024, 1, 2 and 4 ranks, frugal / table_wise / row_wise / planned (48 runs, about 25 minutes on 2
cores). The sharders of one point run one after the other, ``--repeats`` times in turn
(samples/s: the median).

The second stage of a calibration: ``--fit-profile OUT`` runs the real training loop on a few
points of its own (table_wise, criteo-kaggle, batch 256 and 2048, 1, 2 and 4 ranks; none of them
a validation point) and fits the framework terms of ``--profile`` to them
(:func:`torchrec_frugal.estimate.calibration.training_fit.fit_training`), writing the profile to OUT:

    python -m torchrec_frugal.estimate --calibrate my_box.json                      # stage 1: microbenchmarks
    python benchmarks/bench_model.py --fit-profile my_box.json --profile my_box.json  # stage 2: the training loop
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from torchrec_frugal.estimate.calibration.training_fit import TrainingRun, fit_rates, fit_training  # noqa: E402
from torchrec_frugal.estimate.cost_model import CostModel, Plan  # noqa: E402
from torchrec_frugal.config import CACHE_RATIO, LOOKAHEAD  # noqa: E402  train.py's defaults
from torchrec_frugal.estimate.cli import PRESAMPLE_STEPS, dlrm_workload  # noqa: E402
from torchrec_frugal.estimate.profiles import HardwareProfile, load_profile  # noqa: E402

from examples.demo import TrainRunError, run_plan, run_train  # noqa: E402

UNIFORM = ("frugal", "table_wise", "row_wise")
SHARDERS = (*UNIFORM, "planned")
PLANNER_SLACK = 0.05  # the planner's goal: its plan measures at most 5% below the best uniform plan
FIT_CONFIG, FIT_BATCHES, FIT_RANKS, FIT_SHARDER = "criteo-kaggle", (256, 2048), (1, 2, 4), "table_wise"


def default_steps(batch: int) -> int:
    """About 10-20 s of training per run on 2 cores (as bench_dlrm's runs)."""
    return 100 if batch >= 2048 else 200 if batch >= 1024 else 600


def train_args(config: str, batch: int, sharder: str, steps: int, scale: Optional[float], hardware: str) -> List[str]:
    args = ["--config", config, "--batch-size", str(batch), "--steps", str(steps), "--log-every", "0"]
    if scale is not None:
        args += ["--scale", f"{scale:g}"]
    if sharder == "frugal":
        return args + ["--sharder", "frugal", "--cache-ratio", f"{CACHE_RATIO:g}", "--lookahead", str(LOOKAHEAD)]
    if sharder == "planned":
        return args + ["--sharder", "frugal", "--hardware", hardware]
    return args + ["--sharder", "torchrec", "--sharding", sharder]


def workload(config: str, batch: int, ranks: int, threads: int, scale: Optional[float]) -> Any:
    return dlrm_workload(config, ranks, batch, scale, presample_steps=PRESAMPLE_STEPS, threads_per_rank=threads)


def predict(profile: HardwareProfile, config: str, batch: int, ranks: int, plan: Plan, threads: int,
            scale: Optional[float]) -> Dict[str, Any]:  # fmt: skip
    c = CostModel(profile).predict(workload(config, batch, ranks, threads, scale), plan)
    return {"samples_per_second": c.samples_per_second, "terms_ms": {k: 1e3 * v for k, v in c.terms.items() if v},
            "details": c.details}  # fmt: skip


def plan_label(plan: Optional[Dict[str, Any]]) -> str:
    """``frugal x22, L=0, c=0.01`` for a planned run's recorded plan."""
    if not plan:
        return "-"
    counts: Dict[str, int] = {}
    for s in plan["shardings"].values():
        counts[s] = counts.get(s, 0) + 1
    kinds = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return kinds + (f"; c={plan['cache_ratio']:g}, L={plan['lookahead']}" if "frugal" in counts else "")


def planner_rows(points: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per point with a planned run: its measured samples/s against the best measured uniform plan."""
    rows = []
    key = lambda p: (p["config"], p["batch"], p["ranks"])  # noqa: E731
    for k in dict.fromkeys(key(p) for p in points):
        group = {p["sharder"]: p for p in points if key(p) == k and p.get("measured")}
        uniform = {s: group[s]["measured"]["samples_per_second"] for s in UNIFORM if s in group}
        if "planned" not in group or not uniform:
            continue
        best = max(uniform, key=uniform.__getitem__)
        planned = group["planned"]["measured"]["samples_per_second"]
        rows.append({"config": k[0], "batch": k[1], "ranks": k[2], "plan": group["planned"]["measured"].get("plan"),
                     "planned": planned, "best_uniform": best, "best_uniform_sps": uniform[best],
                     "ratio": planned / uniform[best], "ok": planned >= (1 - PLANNER_SLACK) * uniform[best]})  # fmt: skip
    return rows


def planner_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    lines = ["The planner's plan (train.py `--hardware`) against the best uniform plan, both measured in the same run "
             f"of this harness; goal: planned >= {1 - PLANNER_SLACK:.0%} of the best uniform.\n",
             "| config | batch/rank | ranks | planned plan | planned | best uniform | its samples/s | planned / best |",
             "|---|---:|---:|---|---:|---|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['config']} | {r['batch']} | {r['ranks']} | {plan_label(r['plan'])} | {r['planned']:,.0f} | "
                     f"{r['best_uniform']} | {r['best_uniform_sps']:,.0f} | {r['ratio']:.3f}{'' if r['ok'] else ' (miss)'} |")  # fmt: skip
    if rows:
        lines.append(f"\n{sum(r['ok'] for r in rows)} of {len(rows)} points within {PLANNER_SLACK:.0%} of the best "
                     f"uniform plan; median planned / best {statistics.median(r['ratio'] for r in rows):.3f}")  # fmt: skip
    return "\n".join(lines)


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


def measure_point(train_py: Path, config: str, batch: int, ranks: int, sharder: str, threads: int, steps: int,
                  args: argparse.Namespace) -> Dict[str, Any]:  # fmt: skip
    """One run of train.py: its samples/s and what the report needs of its summary."""
    s = run_train(train_py, train_args(config, batch, sharder, steps, args.scale, args.profile), nproc=ranks,
                  threads=threads, timeout_s=args.timeout)  # fmt: skip
    return {"samples_per_second": s["samples_per_second"], "foreign_cpu_share": s.get("foreign_cpu_share"),
            "cache_hit_ratio": (s.get("frugal") or {}).get("cache_hit_ratio"), "wall_s": s["wall_s"],
            "plan": s.get("plan") if sharder == "planned" else None}  # fmt: skip


def median_run(runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The run of median samples/s (the lower middle one of an even count), with every run's figure."""
    order = sorted(runs, key=lambda r: r["samples_per_second"])
    return dict(order[(len(order) - 1) // 2], runs_samples_per_second=[r["samples_per_second"] for r in runs])


def with_prediction(p: Dict[str, Any], profile: HardwareProfile, scale: Optional[float]) -> Dict[str, Any]:
    """``p`` with the prediction of the plan it ran, and the error when it was measured."""
    m = p.get("measured")
    if p["sharder"] == "planned" and not m:
        return p  # the plan is known once the run made it
    plan = run_plan(p["sharder"], m.get("plan") if m else None)
    q = dict(p, predicted=predict(profile, p["config"], p["batch"], p["ranks"], plan, p["threads"], scale))
    if m:
        q["error"] = q["predicted"]["samples_per_second"] / m["samples_per_second"] - 1.0
    return q


def repredict(args: argparse.Namespace, profile: HardwareProfile) -> int:
    """The points an earlier run measured, predicted again with ``profile`` (a profile compared
    on the same measurements, without running them again)."""
    earlier = json.loads(args.repredict.read_text())
    points = [with_prediction({k: v for k, v in p.items() if k not in ("predicted", "error")}, profile, args.scale)
              for p in earlier["points"]]  # fmt: skip
    write_report(args, profile, points, {"measured_in": str(args.repredict)})
    return 0


def recorded_runs(points: Sequence[Dict[str, Any]], scale: Optional[float]) -> List[Tuple[str, TrainingRun]]:
    """(config, run) of every measured point: its workload, the plan it ran, its samples/s."""
    return [(p["config"], TrainingRun(workload(p["config"], p["batch"], p["ranks"], p["threads"], scale),
                                      run_plan(p["sharder"], p["measured"].get("plan")), p["measured"]["samples_per_second"]))
            for p in points if p.get("measured")]  # fmt: skip


def fit_recorded_stage(args: argparse.Namespace, profile: HardwareProfile) -> int:
    """Refit ``--profile`` on recorded runs, timing nothing: the measured points of ``--repredict``
    and the stage-2 runs the profile holds (``extra.training_fit.points``), with the last-level
    cache of ``--llc-bytes`` (:func:`torchrec_frugal.estimate.calibration.training_fit.fit_rates`). Then the same fit leaving
    out each config in turn, predicting the left-out config's points (how far the fit carries)."""
    llc = args.llc_bytes or profile.llc_bytes
    if not llc:
        raise SystemExit("--fit-recorded needs --llc-bytes (the last-level cache of one node) or a profile that has it")
    points = json.loads(args.repredict.read_text())["points"] + profile.extra.get("training_fit", {}).get("points", [])
    runs = recorded_runs(points, args.scale)
    fitted, report = fit_rates([r for _, r in runs], profile, llc)
    held_out: Dict[str, Any] = {}
    for config in dict.fromkeys(c for c, _ in runs):
        part, _ = fit_rates([r for c, r in runs if c != config], profile, llc)
        model = CostModel(part)
        errs = [abs(model.predict(r.workload, r.plan).step_s / r.step_s - 1.0) for c, r in runs if c == config]
        held_out[config] = {"points": len(errs), "median_abs_step_error": statistics.median(errs),
                            "within_20pct": sum(e <= 0.2 for e in errs)}  # fmt: skip
        print(f"left out {config}: median |step error| {100 * held_out[config]['median_abs_step_error']:.1f}%, "
              f"within 20%: {held_out[config]['within_20pct']} of {len(errs)}")  # fmt: skip
    report["leave_one_config_out"] = held_out
    report["measured_in"] = [str(args.repredict), "extra.training_fit.points"]
    out = dataclasses.replace(
        fitted, name=args.fit_recorded.stem,
        notes=(profile.notes + "; " if profile.notes else "") + f"{', '.join(report['fitted'])} refitted to {len(runs)} "
        f"recorded runs of examples/dlrm/train.py (benchmarks/bench_model.py --fit-recorded; docs/cost_model.md)",
        extra={**profile.extra, "recorded_fit": report},
    )  # fmt: skip
    out.save(args.fit_recorded)
    print(json.dumps(report["fitted"], indent=1))
    print(f"rms relative error of the fit: {100 * report['rms_relative_error']:.1f}%; wrote {args.fit_recorded}")
    return 0


def write_report(args: argparse.Namespace, profile: HardwareProfile, points: List[Dict[str, Any]],
                 extra: Dict[str, Any]) -> None:  # fmt: skip
    table = markdown([p for p in points if "predicted" in p], profile.name)
    rows = planner_rows(points)
    text = table + ("\n\n" + planner_markdown(rows) if rows else "")
    print("\n" + text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"profile": profile.to_json(), **extra, "points": points, "planner": rows,
                                         "table_markdown": text}, indent=1) + "\n")  # fmt: skip
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")


def fit_profile_stage(args: argparse.Namespace, profile: HardwareProfile, train_py: Path, cores: int) -> int:
    """Stage 2 of a calibration: run the fit points, fit the framework terms, write the profile."""
    runs, measured = [], []
    for batch, ranks in tqdm(list(itertools.product(FIT_BATCHES, FIT_RANKS)), desc="training-loop calibration"):
        threads = max(1, cores // ranks)
        m = measure_point(train_py, FIT_CONFIG, batch, ranks, FIT_SHARDER, threads, args.steps or default_steps(batch), args)
        runs.append(TrainingRun(workload(FIT_CONFIG, batch, ranks, threads, args.scale), Plan(FIT_SHARDER),
                                m["samples_per_second"]))  # fmt: skip
        measured.append({"config": FIT_CONFIG, "batch": batch, "ranks": ranks, "sharder": FIT_SHARDER, "threads": threads,
                         "measured": m})  # fmt: skip
    fitted, report = fit_training(runs, profile)
    out = dataclasses.replace(
        fitted,
        name=args.fit_profile.stem,
        notes=(profile.notes + "; " if profile.notes else "") + "framework terms and dense thread efficiency fitted to "
        f"{len(runs)} runs of examples/dlrm/train.py (benchmarks/bench_model.py --fit-profile)",
        extra={**profile.extra, "training_fit": {**report, "points": measured}},
    )
    out.save(args.fit_profile)
    print(json.dumps(report["fitted"], indent=1))
    print(f"rms relative error of the fit: {100 * report['rms_relative_error']:.1f}%; wrote {args.fit_profile}")
    return 0


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["criteo-kaggle", "avazu"])
    ap.add_argument("--batches", nargs="+", type=int, default=[128, 1024])
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--sharders", nargs="+", choices=SHARDERS, default=list(SHARDERS))
    ap.add_argument("--repeats", type=int, default=1, help="runs of each point, in turn with the point's other sharders")
    ap.add_argument("--scale", type=float, default=None, help="row-count scale (default: each config's)")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per rank (default: 100 at batch >= 2048, 200 at >= 1024, else 600)")
    ap.add_argument("--profile", default="cpu", help="hardware profile of the prediction (and of the planned runs)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="print the predictions and the runs, run nothing")
    ap.add_argument("--repredict", type=Path, metavar="JSON",
                    help="run nothing: predict the measured points of an earlier --json with --profile")
    ap.add_argument("--fit-profile", type=Path, metavar="OUT",
                    help="calibration stage 2: fit --profile's framework terms to runs of the training loop, write OUT")
    ap.add_argument("--fit-recorded", type=Path, metavar="OUT",
                    help="run nothing: refit --profile's rates on the runs of --repredict JSON (and the profile's "
                         "stage-2 runs), write OUT")  # fmt: skip
    ap.add_argument("--llc-bytes", type=float, default=None,
                    help="last-level cache of one node for --fit-recorded (default: the profile's)")
    args = ap.parse_args(argv)
    if args.fit_recorded and not args.repredict:
        ap.error("--fit-recorded needs --repredict JSON (the recorded runs)")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    profile = load_profile(args.profile)
    if args.fit_recorded:
        return fit_recorded_stage(args, profile)
    if args.repredict:
        return repredict(args, profile)
    train_py = ROOT / "examples" / "dlrm" / "train.py"
    cores = os.cpu_count() or 1
    if args.fit_profile:
        return fit_profile_stage(args, profile, train_py, cores)
    points: List[Dict[str, Any]] = []
    t0 = time.perf_counter()
    groups = list(itertools.product(args.configs, args.batches, args.ranks))
    bar = tqdm(total=len(groups) * len(args.sharders) * args.repeats, desc="bench_model runs", disable=args.dry_run)
    for config, batch, ranks in groups:
        threads, steps = max(1, cores // ranks), args.steps or default_steps(batch)
        runs: Dict[str, List[Dict[str, Any]]] = {s: [] for s in args.sharders}
        failures: Dict[str, str] = {}
        for _ in range(1 if args.dry_run else args.repeats):
            for sharder in args.sharders:
                cmd = train_args(config, batch, sharder, steps, args.scale, args.profile)
                if args.dry_run:
                    print(f"{config} b{batch} x{ranks} {sharder}: torchrun --nproc_per_node={ranks} examples/dlrm/train.py "
                          f"{' '.join(cmd)} --threads {threads}")  # fmt: skip
                    continue
                try:
                    runs[sharder].append(measure_point(train_py, config, batch, ranks, sharder, threads, steps, args))
                except TrainRunError as e:
                    failures[sharder] = str(e)[-2000:]
                    print(f"{config} b{batch} x{ranks} {sharder}: FAILED {str(e)[-500:]}", flush=True)
                bar.update()
        for sharder in args.sharders:
            p: Dict[str, Any] = {"config": config, "batch": batch, "ranks": ranks, "sharder": sharder, "threads": threads,
                                 "steps": steps}  # fmt: skip
            if runs[sharder]:
                p["measured"] = median_run(runs[sharder])
            if sharder in failures:
                p["failure"] = failures[sharder]
            p = with_prediction(p, profile, args.scale)
            if "error" in p:
                bar.write(f"{config} b{batch} x{ranks} {sharder}: measured {p['measured']['samples_per_second']:,.0f}, "
                          f"predicted {p['predicted']['samples_per_second']:,.0f} ({100 * p['error']:+.1f}%)")  # fmt: skip
            points.append(p)
    bar.close()
    if args.dry_run:
        return 0
    write_report(args, profile, points, {"cpus": cores, "wall_s": time.perf_counter() - t0, "repeats": args.repeats})
    return 1 if any("failure" in p for p in points) else 0


if __name__ == "__main__":
    sys.exit(main())
