"""examples/demo.py's comparison: frugal and stock runs alternate from equal tables, and the loss
agreement it prints is computed from the runs' per-step losses."""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.demo import compare, loss_agreement, report  # noqa: E402

TRAIN = ROOT / "examples" / "dlrm" / "train.py"
TINY = ["--scale", "0.001", "--batch-size", "64", "--steps", "30", "--warmup", "5", "--log-every", "0", "--lookahead", "4"]


@pytest.fixture(scope="module")
def tiny_comparison():
    said = []
    result = compare(TRAIN, TINY, nproc=2, threads=1, repeats=1, say=said.append, timeout_s=300)
    return result, said


def test_the_demo_compares_alternated_runs_from_equal_tables(tiny_comparison) -> None:
    result, said = tiny_comparison
    f, t = result["runs"]["frugal"][0], result["runs"]["torchrec"][0]
    assert [line.split(",")[1].strip() for line in said if line.startswith("== run")] == [
        "Frugal (cache 0.05", "TorchRec table_wise: torchrun --nproc_per_node=2 examples/dlrm/train.py --sharder torchrec "
        "--sharding table_wise " + " ".join(TINY)]  # fmt: skip
    assert len(f["step_losses"]) == len(t["step_losses"]) == 30
    # the agreement is the per-step one, recomputed here from the summaries
    diffs = [abs(a - b) for a, b in zip(f["step_losses"], t["step_losses"])]
    agree = result["agreement"]
    assert agree["max_abs"] == max(diffs) and agree["worst_step"] == diffs.index(max(diffs))
    assert agree["steps"] == 30 and agree["pairs"] == 1
    # Equal initial tables: the first step's losses are equal, and they stay within float rounding.
    # A one-ulp difference in a row's update can flip a ReLU of the dense layers some 25 steps in,
    # which moves the loss by about 1e-5 (relative) from then on: with seeds 0-3, 6 of 8 runs stayed
    # within 1e-5 for all 30 steps and the others left it at step 27 and step 30, one run with the
    # row-wise Adagrad's rounding of FBGEMM's kernels and one with that of addcdiv_. A wrong update
    # departs within the first steps.
    assert diffs[0] <= 1e-6 and agree["max_abs"] < 1e-4 and agree["agree_steps"] >= 20, diffs
    assert result["samples_per_second"] == {"frugal": f["samples_per_second"], "torchrec": t["samples_per_second"]}
    text = "\n".join(report(result))
    assert "x samples/s" in text and f"max |frugal - stock| {agree['max_abs']:.2g}" in text
    assert "cannot show the PCIe-bound speed-up" in text


def test_the_loss_agreement_sees_one_step_off(tiny_comparison) -> None:
    result, _ = tiny_comparison
    f, t = result["runs"]["frugal"][0], result["runs"]["torchrec"][0]
    off = copy.deepcopy(f)
    off["step_losses"][7] += 0.01
    agree = loss_agreement([off], [t])
    assert agree["max_abs"] == pytest.approx(0.01, abs=1e-4) and agree["worst_step"] == 7
    assert agree["agree_steps"] == 7 and agree["max_rel"] > 1e-3
    short = copy.deepcopy(f)
    short["step_losses"] = short["step_losses"][:-1]
    with pytest.raises(ValueError, match="different steps"):
        loss_agreement([short], [t])
    with pytest.raises(ValueError, match="no step_losses"):
        loss_agreement([{**f, "step_losses": []}], [t])


def test_loss_agreement_of_summaries_by_hand() -> None:
    a = {"sharder": "frugal", "step_losses": [0.7, 0.6, 0.5], "step_losses_from": 0}
    b = {"sharder": "torchrec", "step_losses": [0.7, 0.6, 0.55], "step_losses_from": 0}
    agree = loss_agreement([a, a], [b])
    assert agree["max_abs"] == pytest.approx(0.05) and agree["max_rel"] == pytest.approx(0.05 / 0.55)
    assert (agree["worst_step"], agree["agree_steps"], agree["steps"], agree["pairs"]) == (2, 2, 3, 2)
    assert loss_agreement([a], [a])["max_abs"] == 0.0
    assert os.path.isfile(TRAIN)
