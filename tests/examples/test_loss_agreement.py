"""benchmarks/loss_agreement.py: where two runs' per-step losses part, and the example's perturbed init."""
from __future__ import annotations

import numpy as np
import torch

from benchmarks import loss_agreement as la


def test_agreement_finds_the_first_step_apart_and_the_largest_difference() -> None:
    a = np.array([0.7, 0.6, 0.5, 0.4])
    assert la.agreement(a, a.copy(), 1e-5) == {"first_step_over_tol": None, "max_abs": 0.0, "max_rel": 0.0, "max_rel_step": 0}
    b = a + np.array([0.0, 1e-6, 3e-5, 2e-3])
    r = la.agreement(a, b, 1e-5)
    assert r["first_step_over_tol"] == 2 and abs(r["max_abs"] - 2e-3) < 1e-12
    assert r["max_rel_step"] == 3 and abs(r["max_rel"] - 2e-3 / 0.402) < 1e-12


def test_a_perturbed_init_is_the_same_table_times_one_plus_or_minus_epsilon() -> None:
    from examples.common import seeded_init

    plain = seeded_init(0.1, 7)(torch.empty(300, 4))
    moved = seeded_init(0.1, 7, 1e-3)(torch.empty(300, 4))
    ratio = (moved / plain).flatten()
    assert torch.allclose(ratio.abs(), torch.ones_like(ratio), atol=2e-3)
    assert set(torch.round((ratio - 1) * 1e3).int().tolist()) == {-1, 1}
