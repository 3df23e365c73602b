"""The planner thread's rates (``planner_step_s``, ``planner_id_s``, ``planner_row_s``) from timed
batches of the batch planner (``benchmarks/fit_planner_rates.py`` fits the recorded ones)."""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np

from .least_squares import nonnegative_lstsq


def fit_planner(points: Sequence[Tuple[float, float, float]]) -> Dict[str, float]:
    """planner_step_s + planner_id_s x ids + planner_row_s x distinct rows, least squares with every
    coefficient >= 0, from (ids, distinct rows, seconds) points."""
    a = np.array([[1.0, i, u] for i, u, _ in points])
    x = nonnegative_lstsq(a, np.array([t for *_, t in points]))
    return {"planner_step_s": float(x[0]), "planner_id_s": float(x[1]), "planner_row_s": float(x[2])}
