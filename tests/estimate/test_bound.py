"""cost_model.bound: what bounds a predicted step, on hand-built steps and on the model's own."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from torchrec_frugal.estimate.cli import dlrm_workload, main
from torchrec_frugal.estimate.cost_model import BESIDE, BOUNDS, PATH_PARTS, TERMS, CostModel, Plan, StepCost, bound
from torchrec_frugal.estimate.cost_model.bound import CONTENTION, EXCESS_TERMS
from torchrec_frugal.estimate.profiles import load_profile


def step(details=None, **terms: float) -> StepCost:
    t = dict.fromkeys(TERMS, 0.0)
    t.update(terms)
    return StepCost("x", t, 1.0, True, 0.0, details=details or {})


def test_every_term_has_a_lane():
    named = [t for ts in PATH_PARTS.values() for t in ts]
    assert len(named) == len(set(named)) and set(named) | set(EXCESS_TERMS) == set(TERMS)
    assert set(BOUNDS) == set(PATH_PARTS) | set(BESIDE) | {CONTENTION}


def test_the_paths_largest_part_bounds_when_nothing_outlasts_it():
    b = bound(step(framework=3e-3, engine_host=5e-4, dense_compute=1e-3, output_all_to_all=4e-4))
    assert (b.name, b.runner_up) == ("training thread", "none")
    assert b.seconds == pytest.approx(3.5e-3) and b.path_s == pytest.approx(4.9e-3) and b.margin == pytest.approx(4.9e-3)
    assert b.share == pytest.approx(3.5 / 4.9) and "nothing runs beside it" in b.text()
    # a thread beside the path, shorter than it: the path bounds, by its excess over the thread
    b = bound(step({"exchange_worker_ms": 4.0, "planner_thread_ms": 1.0}, framework=3e-3, host_reads=2e-3))
    assert (b.name, b.runner_up) == ("training thread", "exchange worker") and b.margin == pytest.approx(1e-3)
    assert b.beside == pytest.approx({"exchange worker": 4e-3, "planner": 1e-3})


def test_a_thread_that_outlasts_the_path_bounds_by_its_excess():
    b = bound(step({"exchange_worker_ms": 6.0, "planner_thread_ms": 5.0, "flushers_ms": 0.1},
                   framework=1e-3, host_reads=2e-3, gate_stall=3e-3))  # fmt: skip
    assert (b.name, b.runner_up) == ("exchange worker", "planner")
    assert b.seconds == pytest.approx(6e-3) and b.margin == pytest.approx(1e-3) and b.path_s == pytest.approx(3e-3)
    assert b.seconds == pytest.approx(b.step_s) and "beside the step" in b.text()
    b = bound(step({"uvm_prefetch_ms": 5.0}, framework=1e-3, uvm_reads=0.0, prefetch_stall=4e-3))
    assert (b.name, b.runner_up) == ("cache prefetch", "critical path") and b.margin == pytest.approx(4e-3)


def test_contention_bounds_when_there_is_any():
    b = bound(step(framework=1e-3, contention=2e-3))
    assert (b.name, b.seconds, b.margin) == (CONTENTION, 2e-3, 2e-3)


def test_the_models_steps():
    """Frugal's threads hide beside a long training loop and the slowest bounds the step without one:
    its margin is the gate stall."""
    hw = load_profile("rtx3090")
    w = dlrm_workload("criteo-kaggle", 8, 1024, 1.0, "paper", real_data=True)
    plan = Plan("frugal", 0.05, 10)
    c = CostModel(hw).predict(w, plan)
    b = bound(c)
    slowest = max(BESIDE, key=lambda name: c.details.get(BESIDE[name], 0.0))
    assert b.name == "training thread" and b.runner_up == slowest
    assert b.margin == pytest.approx(b.path_s - 1e-3 * c.details[BESIDE[slowest]])
    assert b.path_s + c.terms["gate_stall"] + c.terms["contention"] == pytest.approx(c.step_s)
    lean = replace(hw, framework_step_s=0.0, framework_id_s=0.0, exchange_step_s=5e-3)  # a slow exchange worker
    c = CostModel(lean).predict(w, plan)
    b = bound(c)
    assert c.terms["gate_stall"] > 0 and b.name == "exchange worker" and b.margin == pytest.approx(c.terms["gate_stall"])
    assert b.seconds == pytest.approx(1e-3 * c.details["exchange_worker_ms"])


def test_estimate_names_both_bounds_of_the_papers_criteo_tb(capsys, tmp_path):
    out = tmp_path / "e.json"
    assert main(["--model", "paper", "--config", "criteo-tb", "--scale", "1", "--gpus", "8", "--batch-size", "1024",
                 "--hardware", "rtx3090", "--json", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "(1 table, 73,391,341 rows, dim 32), paper" in text and "PCIe 3.0" in text
    lines = [x for x in text.splitlines() if x.startswith("- frugal (frugal): ") or x.startswith("- best stock (")]
    assert len(lines) == 2 and all(any(n in x for n in BOUNDS) for x in lines)
    doc = json.loads(out.read_text())
    assert set(doc["bounds"]) == {"frugal", "best stock"} and doc["real_data"] is True
    assert doc["bounds"]["frugal"]["sharding"] == "frugal" and doc["bounds"]["frugal"]["name"] in BOUNDS
