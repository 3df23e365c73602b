"""The least-squares fits every stage of a calibration is made of: a line, and a linear fit with
coefficients >= 0 (rates and overheads cannot be negative)."""
from __future__ import annotations

import itertools
from typing import Sequence, Tuple

import numpy as np


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("fit_line needs at least two distinct x values")
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin |a x - b| over x >= 0, by trying every support (a handful of unknowns)."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(b**2))
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            x_s = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            if np.all(x_s >= 0):
                x = np.zeros(a.shape[1])
                x[list(cols)] = x_s
                err = float(np.sum((a @ x - b) ** 2))
                if err < best_err:
                    best, best_err = x, err
    return best
