"""Two checkouts of this project side by side: an example's samples/s and last loss, paired.

Does a change (a restructuring, say) keep the step's speed and its numbers? Each pair runs the
DLRM example (``examples/dlrm/train.py``) or the knowledge-graph example (``examples/graph/train.py``,
TransE on a synthetic graph) with ``--sharder frugal`` once from each checkout (``PYTHONPATH`` the
checkout, so each runs its own package), alternating which goes first; the ratio within a pair
is what counts on a machine whose speed drifts. The losses must be equal bit for bit.

    git worktree add ../before <commit>
    python benchmarks/paired_commits.py ../before . --world 2 --batch-size 1024 --steps 60 --pairs 3
    python benchmarks/paired_commits.py ../before . --example graph --world 2 --batch-size 512 --steps 200 --pairs 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict


# What each example trains: the DLRM example's frugal default; TransE (dim 400) on a synthetic graph
# of 1M entities, as the KG speed benchmark's model (docs/performance.md), without the evaluation.
EXAMPLE_ARGS = {
    "dlrm": ["--cache-ratio", "0.05", "--lookahead", "10", "--config", "criteo-kaggle"],
    "graph": ["--dataset", "synthetic", "--synthetic-entities", "1000000", "--model", "transe_l1", "--dim", "400",
              "--gamma", "12", "--adversarial-temperature", "1", "--no-eval"],
}


def run(root: Path, args: argparse.Namespace) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        summary = os.path.join(d, "summary.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.world}",
               f"examples/{args.example}/train.py", "--sharder", "frugal", "--batch-size", str(args.batch_size),
               "--steps", str(args.steps), "--seed", "0", "--log-every", "0", "--threads", "1", "--no-progress",
               "--summary", summary] + EXAMPLE_ARGS[args.example]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, timeout=args.timeout)
        return json.loads(Path(summary).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--example", choices=sorted(EXAMPLE_ARGS), default="dlrm")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    ratios, same = [], True
    for i in range(args.pairs):
        order = [("before", args.before), ("after", args.after)][:: 1 if i % 2 == 0 else -1]
        r = {name: run(root.resolve(), args) for name, root in order}
        ratios.append(r["after"]["samples_per_second"] / r["before"]["samples_per_second"])
        same &= r["after"]["loss"] == r["before"]["loss"]
        print(f"pair {i}: samples/s before {r['before']['samples_per_second']:,.0f}, after "
              f"{r['after']['samples_per_second']:,.0f} ({ratios[-1]:.3f}x); loss before {r['before']['loss']!r}, "
              f"after {r['after']['loss']!r}", flush=True)  # fmt: skip
    print(f"{args.example} example, world {args.world}, batch {args.batch_size}: after / before, median of {args.pairs} pairs "
          f"{statistics.median(ratios):.3f}x; losses {'equal' if same else 'DIFFER'}")  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
