"""Per-step loss agreement of the DLRM example under several shardings, from equal tables and batches.

Runs ``examples/dlrm/train.py`` once per variant (same config, seed and data) and compares the
per-step losses (mean over ranks) of every pair: the first step where they differ by more than
``--tol``, and the largest difference. Not a timing: it says where two shardings that compute the
same sums in another order part, and how far a run's rounding carries: ``table_wise_perturbed`` is
stock table_wise from initial tables 1e-7 (relative) away from the others'.

    python benchmarks/loss_agreement.py --steps 60 --variants table_wise row_wise frugal table_wise_perturbed
    python benchmarks/loss_agreement.py --steps 60 --variants table_wise frugal table_wise_perturbed --extra --embedding-lr 0.005
    python benchmarks/loss_agreement.py --steps 300 --variants table_wise row_wise data_parallel frugal \
        --out benchmarks/results/loss_agreement_paper.json --extra --model paper --scale 0.05
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from examples.demo import find_train_script, run_train  # noqa: E402

VARIANTS = {
    "table_wise": ["--sharder", "torchrec", "--sharding", "table_wise"],
    "row_wise": ["--sharder", "torchrec", "--sharding", "row_wise"],
    "frugal": ["--sharder", "frugal"],
    # every rank's gradients summed on the rank, then over ranks (all-reduce), as Frugal's owners sum them
    "data_parallel": ["--sharder", "torchrec", "--sharding", "data_parallel"],
    # stock against itself, its initial tables 1e-7 apart: how far the model carries a rounding-sized difference
    "table_wise_perturbed": ["--sharder", "torchrec", "--sharding", "table_wise", "--init-perturbation", "1e-7"],
}


def agreement(a: np.ndarray, b: np.ndarray, tol: float) -> Dict[str, object]:
    """First step where |a - b| > tol (None if none), the largest |a - b| and the largest |a - b| / |b|."""
    d = np.abs(a - b)
    over = np.flatnonzero(d > tol)
    rel = d / np.maximum(np.abs(b), 1e-30)
    return {"first_step_over_tol": int(over[0]) if over.size else None, "max_abs": float(d.max()) if d.size else 0.0,
            "max_rel": float(rel.max()) if rel.size else 0.0, "max_rel_step": int(rel.argmax()) if rel.size else None}


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["table_wise", "row_wise", "frugal"])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--config", default="criteo-kaggle")
    p.add_argument("--tol", type=float, default=1e-5, help="absolute loss difference counted as parting")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train.py arguments, for every variant")
    p.add_argument("--out", default=None, help="write the per-step losses and the agreement as JSON")
    args = p.parse_args(argv)
    train_py = find_train_script()
    common = ["--config", args.config, "--batch-size", str(args.batch_size), "--steps", str(args.steps),
              "--log-every", str(max(1, args.steps // 2)), *args.extra]  # fmt: skip
    losses = {v: np.array(run_train(train_py, [*VARIANTS[v], *common], nproc=args.nproc, threads=1)["step_losses"]) for v in args.variants}
    pairs = {f"{a} / {b}": agreement(losses[a], losses[b], args.tol) for a, b in itertools.combinations(args.variants, 2)}
    for name, r in pairs.items():
        print(f"{name}: first step differing by more than {args.tol:g}: {r['first_step_over_tol']}; largest difference "
              f"{r['max_abs']:.3g} ({r['max_rel']:.3g} relative, step {r['max_rel_step']})")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "losses": {k: v.tolist() for k, v in losses.items()}, "pairs": pairs}, indent=1))


if __name__ == "__main__":
    main()
