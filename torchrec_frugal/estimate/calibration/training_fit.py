"""Stage 2 of a calibration: the fields microbenchmarks cannot see (the training loop's own time,
the dense thread efficiency, the cache-resident row rate), fitted so that the cost model's step
times match measured runs of the real training loop."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Sequence, Tuple

import numpy as np

from ..cost_model import CostModel, Plan, Workload
from ..profiles import HardwareProfile
from .least_squares import nonnegative_lstsq

FRAMEWORK_FIELDS = ("framework_step_s", "framework_id_s", "framework_dist_step_s")
EFFICIENCY_GRID = tuple(np.round(np.linspace(0.0, 1.0, 21), 2))


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """One measured run of a real training loop: its workload, its plan and its samples/s."""

    workload: Workload
    plan: Plan
    samples_per_second: float

    @property
    def step_s(self) -> float:
        return self.workload.world_size * self.workload.batch_size / self.samples_per_second

    def features(self) -> np.ndarray:
        """What the framework term multiplies: 1, the rank's ids, and whether ranks talk (W > 1)."""
        ids = sum(self.workload.batch_size * t.pooling for t in self.workload.tables)
        return np.array([1.0, ids, float(self.workload.world_size > 1)])


def fit_training(runs: Sequence[TrainingRun], base: HardwareProfile, iterations: int = 20) -> Tuple[HardwareProfile, Dict[str, Any]]:
    """The second stage of a calibration: the framework terms (and, on a CPU device, the dense
    thread efficiency) that make the model's step times match measured runs of the real training
    loop, least squares in relative error.

    The microbenchmarks time each part alone; inside a training step the same work runs slower
    and the loop adds its own (the pipeline, TorchRec's input handling, the ranks' collectives
    and their switches on shared cores). That remainder is what the framework term holds:
    ``framework_step_s + framework_id_s x ids + framework_dist_step_s x [W > 1]``, all >= 0.
    The model's step is piecewise linear in the framework term (it may enter through the
    contention of ranks sharing cores), so the fit linearizes it around the current guess and
    solves again until it settles; the thread efficiency is searched on a grid.
    """
    if len(runs) < 2:
        raise ValueError("fit_training needs at least two measured runs")
    measured = np.array([r.step_s for r in runs])
    x = np.stack([r.features() for r in runs])
    eps = 1e-4
    efficiencies = EFFICIENCY_GRID if base.device_is_host else (base.dense_thread_efficiency,)
    best: Tuple[float, HardwareProfile, np.ndarray] = (float("inf"), base, measured)

    def steps(prof: HardwareProfile) -> np.ndarray:
        model = CostModel(prof)
        return np.array([model.predict(r.workload, r.plan).step_s for r in runs])

    for eff in efficiencies:
        theta = np.zeros(len(FRAMEWORK_FIELDS))
        prof = dataclasses.replace(base, dense_thread_efficiency=float(eff), **dict(zip(FRAMEWORK_FIELDS, theta)))
        for _ in range(iterations):
            pred = steps(prof)
            slope = (steps(dataclasses.replace(prof, framework_step_s=prof.framework_step_s + eps)) - pred) / eps
            offset = pred - slope * (x @ theta)
            new = nonnegative_lstsq(slope[:, None] * x / measured[:, None], (measured - offset) / measured)
            prof = dataclasses.replace(prof, **dict(zip(FRAMEWORK_FIELDS, map(float, new))))
            if np.allclose(new, theta, rtol=1e-6, atol=1e-12):
                break
            theta = new
        pred = steps(prof)
        err = float(np.sqrt(np.mean((pred / measured - 1.0) ** 2)))
        if err < best[0]:
            best = (err, prof, pred)
    err, prof, pred = best
    report = {
        "rms_relative_error": err,
        "fitted": {k: getattr(prof, k) for k in ("dense_thread_efficiency", *FRAMEWORK_FIELDS)},
        "runs": [{"world_size": r.workload.world_size, "batch_size": r.workload.batch_size, "plan": r.plan.sharding,
                  "measured_step_s": float(m), "predicted_step_s": float(p)}
                 for r, m, p in zip(runs, measured, pred)],
    }  # fmt: skip
    return prof, report


RATE_FIELDS = ("dense_flops_per_s", "device_rows_bw", "llc_rows_bw", *FRAMEWORK_FIELDS, "dense_thread_efficiency")
"""What :func:`fit_rates` fits: the dense rate, the memory and last-level-cache row rates (each a
factor on the base's gather and scatter rates), the framework terms and the thread efficiency."""
_RATE_UNITS = np.array([1.0, 1.0, 1.0, 1e-3, 1e-6, 1e-3, 1.0])  # framework terms solved in ms, us per id, ms


def _rates_profile(base: HardwareProfile, llc_bytes: float, theta: np.ndarray) -> HardwareProfile:
    """``base`` with :data:`RATE_FIELDS` set from ``theta`` (log factors for the rates, then the
    framework terms in :data:`_RATE_UNITS` and the thread efficiency)."""
    dense, mem, llc = np.exp(theta[:3])
    fw = theta[3:6] * _RATE_UNITS[3:6]
    return dataclasses.replace(
        base, dense_flops_per_s=float(base.dense_flops_per_s * dense), device_gather_bw=float(base.device_gather_bw * mem),
        device_scatter_bw=float(base.device_scatter_bw * mem), llc_bytes=float(llc_bytes),
        llc_gather_bw=float(base.device_gather_bw * llc), llc_scatter_bw=float(base.device_scatter_bw * llc),
        dense_thread_efficiency=float(theta[6]), **dict(zip(FRAMEWORK_FIELDS, map(float, fw))),
    )  # fmt: skip


def _project(theta: np.ndarray) -> np.ndarray:
    """Framework terms >= 0, thread efficiency in [0, 1]."""
    out = theta.copy()
    out[3:6] = np.maximum(out[3:6], 0.0)
    out[6] = min(max(out[6], 0.0), 1.0)
    return out


def fit_rates(
    runs: Sequence[TrainingRun], base: HardwareProfile, llc_bytes: float, iterations: int = 40
) -> Tuple[HardwareProfile, Dict[str, Any]]:
    """Refit a CPU profile on recorded runs of the training loop (no new timing): the fields of
    :data:`RATE_FIELDS`, with the last-level cache of ``llc_bytes`` priced at its own row rate
    (docs/cost_model.md, "The last-level cache"). Least squares in relative error by damped
    Gauss-Newton (Levenberg-Marquardt) with a numerical Jacobian, the framework terms kept >= 0 and
    the thread efficiency in [0, 1]; the rates as log factors on ``base``'s, so they stay > 0.

    The microbenchmarks time a gather over one buffer of the cache's size, so they cannot tell
    the cache-resident rate from the memory rate; the runs can, when their tables' sizes differ."""
    if len(runs) < len(RATE_FIELDS):
        raise ValueError(f"fit_rates needs at least {len(RATE_FIELDS)} measured runs, got {len(runs)}")
    measured = np.array([r.step_s for r in runs])

    def residuals(theta: np.ndarray) -> np.ndarray:
        model = CostModel(_rates_profile(base, llc_bytes, theta))
        return np.array([model.predict(r.workload, r.plan).step_s for r in runs]) / measured - 1.0

    fw = np.array([getattr(base, k) for k in FRAMEWORK_FIELDS]) / _RATE_UNITS[3:6]
    theta = np.concatenate([[0.0, 0.0, 0.0], fw, [base.dense_thread_efficiency]])
    res = residuals(theta)
    cost, damping, h = float(res @ res), 1e-2, 1e-4
    for _ in range(iterations):
        jac = np.stack([(residuals(theta + h * e) - res) / h for e in np.eye(len(theta))], axis=1)
        jtj, g = jac.T @ jac, jac.T @ res
        while damping < 1e8:
            cand = _project(theta - np.linalg.solve(jtj + damping * (np.diag(np.diag(jtj)) + np.eye(len(theta))), g))
            cand_res = residuals(cand)
            cand_cost = float(cand_res @ cand_res)
            if cand_cost < cost:
                break
            damping *= 4.0
        else:
            break
        done = cost - cand_cost < 1e-7 * cost
        theta, res, cost, damping = cand, cand_res, cand_cost, damping / 3.0
        if done:
            break
    prof = _rates_profile(base, llc_bytes, theta)
    report = {
        "rms_relative_error": float(np.sqrt(np.mean(res**2))),
        "fitted": {k: getattr(prof, k) for k in ("dense_flops_per_s", "device_gather_bw", "device_scatter_bw", "llc_bytes",
                                                  "llc_gather_bw", "llc_scatter_bw", "dense_thread_efficiency",
                                                  *FRAMEWORK_FIELDS)},
        "parameters": len(RATE_FIELDS),
        "runs": len(runs),
    }  # fmt: skip
    return prof, report
