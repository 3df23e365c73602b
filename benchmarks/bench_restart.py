"""Surviving a lost rank: how long a DLRM job takes to recover from a SIGKILLed rank, and what it leaves.

Every run is ``torchrun --standalone --nproc_per_node=2 --max-restarts=2 examples/dlrm/train.py
--sharder frugal ... --checkpoint-dir DIR --checkpoint-every E`` in fresh processes, with
``FRUGAL_EXAMPLE_KILL_AT=<rank>:<step>`` making that rank SIGKILL itself after that step on the
first attempt; torchrun then stops the other rank, restarts both, and they resume from the newest
complete checkpoint.

* ``timing`` (``--timing-runs`` pairs): an uninterrupted run, then one whose rank 1 dies after
  ``--kill-step``. Seconds from the SIGKILL to the first step the restarted job completes, and to
  the job's exit (medians), split into phases by the run's log lines (the example prints the kill
  and the first resumed step with unix times; the other phases are the times their lines reach
  this script); and what the loss cost in wall time, interrupted minus uninterrupted within a
  pair (same moment of the machine).
* ``random`` (``--random-runs``): a random rank killed after a random step (seeded); every run
  must exit 0, resume from the checkpoint before the kill, end with the uninterrupted run's loss
  (bit for bit), and leave no ``frugal_*`` segment in /dev/shm (counted: new names whose creating
  process is gone; live segments of other jobs on the machine are not this run's).

    python benchmarks/bench_restart.py --json benchmarks/results/restart.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from examples.checkpointing import KILL_ENV  # noqa: E402
from torchrec_frugal.host.shm import list_segments  # noqa: E402
from torchrec_frugal.host.launch import leaked_segments  # noqa: E402
from benchmarks.measure import median_or_nan  # noqa: E402
from torchrec_frugal.estimate.timing import children_cpu_s, machine_busy_s  # noqa: E402

TRAIN_PY = ROOT / "examples" / "dlrm" / "train.py"
_UNIX_TIME = re.compile(r"at unix time ([0-9.]+)")


def train_args(args: argparse.Namespace, ckpt: Path, summary: Path) -> List[str]:
    return [
        "--sharder", "frugal", "--scale", str(args.scale), "--batch-size", str(args.batch_size),
        "--steps", str(args.steps), "--warmup", "5", "--lookahead", str(args.lookahead), "--auc-window", "20",
        "--log-every", "0", "--threads", "1", "--no-progress", "--checkpoint-dir", str(ckpt),
        "--checkpoint-every", str(args.checkpoint_every), "--summary", str(summary),
    ]  # fmt: skip


def run(args: argparse.Namespace, kill: Optional[str]) -> Dict[str, Any]:
    """One job; ``kill`` is ``<rank>:<step>`` or None. Returns timings, summary and segments left."""
    with tempfile.TemporaryDirectory(prefix="bench_restart_") as tmp:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=2",
            str(TRAIN_PY), *train_args(args, Path(tmp) / "ckpt", Path(tmp) / "summary.json"),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != KILL_ENV}
        env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1", **({KILL_ENV: kill} if kill else {}))
        before = set(list_segments())
        busy0, cpu0, t0 = machine_busy_s(), children_cpu_s(), time.time()
        arrivals: Dict[str, float] = {}
        lines: List[str] = []
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.time()
            lines.append(line)
            if line.startswith("[fault]"):
                arrivals["kill"] = float(_UNIX_TIME.search(line).group(1))  # type: ignore[union-attr]
            elif line.startswith("[dlrm] criteo") and "kill" in arrivals:
                arrivals.setdefault("restarted", now)  # rank 0 of the new attempt is up, group formed
            elif line.startswith("[checkpoint] resumed from"):
                arrivals["loaded"] = now
            elif line.startswith("[checkpoint] first step after resuming"):
                arrivals["first_step"] = float(_UNIX_TIME.search(line).group(1))  # type: ignore[union-attr]
        rc = proc.wait(timeout=args.timeout)
        t_end = time.time()
        wall = t_end - t0
        foreign = max(0.0, (machine_busy_s() - busy0) - (children_cpu_s() - cpu0)) / (wall * (os.cpu_count() or 1))
        if rc != 0:
            raise SystemExit(f"run with {KILL_ENV}={kill} exited {rc}: {shlex.join(cmd)}\n{''.join(lines)[-6000:]}")
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    out: Dict[str, Any] = {
        "kill": kill, "wall_s": wall, "foreign_cpu_share": foreign, "loss": summary["loss"],
        "resumed_from_step": summary["resumed_from_step"], "segments_left": leaked_segments(before),
    }  # fmt: skip
    if kill:
        k = arrivals["kill"]
        out.update(
            kill_to_restarted_s=arrivals["restarted"] - k,
            kill_to_loaded_s=arrivals["loaded"] - k if "loaded" in arrivals else None,  # None: no checkpoint yet
            kill_to_first_step_s=arrivals["first_step"] - k if "first_step" in arrivals else None,
            kill_to_end_s=t_end - k,
        )
    return out


def main(argv: Optional[List[str]] = None) -> None:
    from tqdm import tqdm

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--scale", type=float, default=0.001, help="criteo-kaggle row-count scale")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lookahead", type=int, default=4)
    p.add_argument("--kill-step", type=int, default=35, help="timing runs: rank 1 dies after this step")
    p.add_argument("--timing-runs", type=int, default=5, help="pairs of uninterrupted and interrupted runs")
    p.add_argument("--random-runs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0, help="seeds the random ranks and steps")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if not 1 <= args.kill_step <= args.steps:
        p.error(f"--kill-step must be in [1, --steps={args.steps}], got {args.kill_step}")

    rng = random.Random(args.seed)
    plan = (
        [("baseline", None), ("timing", f"1:{args.kill_step}")] * args.timing_runs
        + [("random", f"{rng.randrange(2)}:{rng.randint(1, args.steps)}") for _ in range(args.random_runs)]
    )
    runs: Dict[str, List[Dict[str, Any]]] = {"baseline": [], "timing": [], "random": []}
    for kind, kill in tqdm(plan, desc="runs", unit="run"):
        runs[kind].append(run(args, kill))

    reference = runs["baseline"][0]["loss"] if runs["baseline"] else None
    every = args.checkpoint_every
    failures = []
    for r in runs["timing"] + runs["random"]:
        step = int(r["kill"].split(":")[1])
        expected = (step - 1) // every * every or None  # the kill comes before that step's own checkpoint
        if r["resumed_from_step"] != expected:
            failures.append(f"{r['kill']}: resumed from {r['resumed_from_step']}, expected {expected}")
        if reference is not None and r["loss"] != reference:
            failures.append(f"{r['kill']}: loss {r['loss']!r} differs from the uninterrupted run's {reference!r}")
    left = sum(len(r["segments_left"]) for rs in runs.values() for r in rs)
    t = runs["timing"]
    results = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "command": "python " + shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "uninterrupted_wall_s": median_or_nan([r["wall_s"] for r in runs["baseline"]]),
        "interrupted_wall_s": median_or_nan([r["wall_s"] for r in t]),
        "wall_cost_s_paired": median_or_nan([r["wall_s"] - b["wall_s"] for r, b in zip(t, runs["baseline"])]),
        "kill_to_restarted_s": median_or_nan([r["kill_to_restarted_s"] for r in t]),
        "kill_to_loaded_s": median_or_nan([r["kill_to_loaded_s"] for r in t]),
        "kill_to_first_step_s": median_or_nan([r["kill_to_first_step_s"] for r in t]),
        "kill_to_end_s": median_or_nan([r["kill_to_end_s"] for r in t]),
        "random_runs": len(runs["random"]),
        "random_kills_rank_0": sum(r["kill"].startswith("0:") for r in runs["random"]),
        "random_first_step_s_median": median_or_nan([r["kill_to_first_step_s"] for r in runs["random"]]),
        "segments_left": left,
        "failures": failures,
        "max_foreign_cpu_share": max(r["foreign_cpu_share"] for rs in runs.values() for r in rs),
        "runs": runs,
    }
    print(
        f"timing ({len(t)} runs, rank 1 killed after step {args.kill_step} of {args.steps}, checkpoints every {every}): "
        f"SIGKILL -> restarted ranks up {results['kill_to_restarted_s']:.1f} s -> state loaded "
        f"{results['kill_to_loaded_s']:.1f} s -> first step {results['kill_to_first_step_s']:.1f} s; "
        f"-> end {results['kill_to_end_s']:.1f} s (medians)\n"
        f"wall: uninterrupted {results['uninterrupted_wall_s']:.1f} s, interrupted {results['interrupted_wall_s']:.1f} s, "
        f"paired difference {results['wall_cost_s_paired']:.1f} s (medians)\n"
        f"random ({len(runs['random'])} runs, {results['random_kills_rank_0']} of them killing rank 0): "
        f"first step after the kill in {results['random_first_step_s_median']:.1f} s (median); "
        f"frugal_* segments left: {left}; failures: {len(failures)}\n"
        f"other processes used up to {100 * results['max_foreign_cpu_share']:.0f}% of the machine's CPU during a run"
    )
    for f in failures:
        print("FAILED " + f)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    if failures or left:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
