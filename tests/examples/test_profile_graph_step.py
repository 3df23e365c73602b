"""benchmarks/profile_graph_step.py's step timeline, from known points, without training anything."""
from __future__ import annotations

import pytest

from benchmarks import profile_graph_step as profile


def points(open_s: float, handed: float, start: float, staged: float, updated: float, steps: int = 3) -> dict:
    """One rank's points of ``steps`` identical steps 20 ms apart (seconds from its first gate)."""
    at = dict(gate_open=open_s, handed_over=handed, worker_start=start, all_staged=staged, updated=updated)
    return {k: {s: t + 0.020 * s for s in range(steps)} for k, t in at.items()}


def test_the_spans_of_the_critical_path_are_measured_across_ranks() -> None:
    ranks = [points(0.0, 0.010, 0.011, 0.013, 0.016), points(0.0005, 0.012, 0.0125, 0.013, 0.018)]
    spans = profile.timeline_spans(ranks, range(0, 10))  # the last step has no next gate: left out
    want = {
        "forward and backward (the gate open to the hand-over)": [10.0, 11.5],
        "the hand-over to the exchange worker's start": [1.0, 0.5],
        "the worker's start to every rank's gradients staged": [2.0, 0.5],
        "the later rank's hand-over after the earlier's": [2.0, 2.0],
        "the last rank's hand-over to every rank's gradients staged": [1.0, 1.0],
        "every rank staged to UPDATED (the sum and the update)": [3.0, 5.0],
        "the last owner's UPDATED to the next gate open": [2.0, 2.5],
        "step (gate open to gate open)": [20.0, 20.0],
    }
    assert spans.keys() == want.keys()
    for k, v in want.items():
        assert spans[k] == pytest.approx(v, abs=1e-9), k
