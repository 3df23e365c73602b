"""Fit the planner thread's rates to the recorded ``benchmarks/time_plan.py`` run and print the fit.

The cost model prices the batch planner's work per batch as ``planner_step_s + ids x planner_id_s
+ distinct rows x planner_row_s`` (docs/cost_model.md, "Frugal's threads"). This turns the
recorded medians below into (ids, distinct rows, seconds) points and fits them
(:func:`torchrec_frugal.estimate.calibration.planner_fit.fit_planner`); nothing is timed.

    python benchmarks/fit_planner_rates.py
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Mapping, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: `benchmarks`, `examples`, and `torchrec_frugal` where no installed one wins
    sys.path.append(str(ROOT))

from torchrec_frugal.datasets import get_config  # noqa: E402
from torchrec_frugal.estimate.calibration.planner_fit import fit_planner  # noqa: E402
from torchrec_frugal.estimate.cost_model import RowDistribution  # noqa: E402

TIME_PLAN_RECORDED_MS = {("one-hot", 1024): 1.09, ("one-hot", 4096): 3.72, ("multi-hot", 1024): 3.38,
                         ("multi-hot", 4096): 12.57}  # fmt: skip
"""``benchmarks/time_plan.py --config criteo-kaggle --scale 0.1 --batch-sizes 1024 4096 --repeats 60``:
ms to plan one batch on one thread alone, median of 8 invocations (docs/performance.md, "The DLRM
step's host work, piece by piece")."""


def time_plan_points(
    medians_ms: Mapping[Tuple[str, int], float], config: str = "criteo-kaggle", scale: float = 0.1, hot: int = 3
) -> List[Tuple[float, float, float]]:
    """(ids, expected distinct rows, seconds) of each batch ``benchmarks/time_plan.py`` plans: per
    table of ``config`` at ``scale``, ids r x u^3 (u uniform) of B (one-hot) or B x ``hot`` (multi-hot,
    bags of 0 to 2 hot ids) draws; distinct rows from the exact row probabilities."""
    rows = get_config(config, scale=scale).rows()
    dists = []
    for r in rows:
        k = np.arange(r + 1, dtype=np.float64) / r
        dists.append(RowDistribution.from_counts(np.diff(np.cbrt(k))))
    out = []
    for (shape, batch), ms in sorted(medians_ms.items()):
        n = batch * (1 if shape == "one-hot" else hot)
        out.append((float(n * len(rows)), sum(d.expected_unique(n) for d in dists), 1e-3 * ms))
    return out


def main() -> None:
    pts = time_plan_points(TIME_PLAN_RECORDED_MS)
    fit = fit_planner(pts)
    for (ids, rows, t), key in zip(pts, sorted(TIME_PLAN_RECORDED_MS)):
        pred = fit["planner_step_s"] + fit["planner_id_s"] * ids + fit["planner_row_s"] * rows
        print(f"{key[0]:9s} batch {key[1]:5d}: {ids:8.0f} ids, {rows:8.0f} distinct rows, "
              f"measured {1e3 * t:.2f} ms, fit {1e3 * pred:.2f} ms ({pred / t - 1:+.1%})")
    print({k: float(f"{v:.3g}") for k, v in fit.items()})


if __name__ == "__main__":
    main()
