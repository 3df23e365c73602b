"""benchmarks/bench_model.py's bookkeeping, without training anything: the plan a run trained, the
median of repeated runs, the planner's comparison with the best uniform plan, and re-predicting
earlier measurements."""
from __future__ import annotations

import json

import pytest

from torchrec_frugal.estimate.cost_model import CostModel, Plan
from torchrec_frugal.datasets import DATASETS
from torchrec_frugal.estimate.cli import PRESAMPLE_STEPS, dlrm_workload
from torchrec_frugal.estimate.profiles import load_profile

from benchmarks import bench_model as bench

AVAZU_TABLES = DATASETS["avazu"].table_names()


def point(sharder: str, sps: float, ranks: int = 2, plan=None):
    return {"config": "avazu", "batch": 128, "ranks": ranks, "sharder": sharder, "threads": 1, "steps": 10,
            "measured": {"samples_per_second": sps, "plan": plan}}  # fmt: skip


def test_the_plan_of_a_run():
    assert bench.run_plan("row_wise", None) == Plan("row_wise", bench.CACHE_RATIO, bench.LOOKAHEAD)
    recorded = {"shardings": {"a": "frugal", "b": "table_wise", "c": "frugal"}, "cache_ratio": 0.02, "lookahead": 2}
    plan = bench.run_plan("planned", recorded)
    assert plan.sharding == "frugal" and dict(plan.tables) == {"b": "table_wise"}
    assert (plan.cache_ratio, plan.lookahead) == (0.02, 2)
    assert bench.plan_label(recorded) == "frugal x2, table_wise x1; c=0.02, L=2"
    assert bench.plan_label({"shardings": {"a": "row_wise"}, "cache_ratio": None, "lookahead": 10}) == "row_wise x1"
    with pytest.raises(ValueError, match="recorded"):
        bench.run_plan("planned", None)


def test_the_median_run_and_its_spread():
    runs = [{"samples_per_second": v, "wall_s": i} for i, v in enumerate((30.0, 10.0, 20.0, 40.0))]
    m = bench.median_run(runs)
    assert m["samples_per_second"] == 20.0 and m["wall_s"] == 2  # the lower middle of four
    assert m["runs_samples_per_second"] == [30.0, 10.0, 20.0, 40.0]


def test_the_planner_is_judged_against_the_best_measured_uniform_plan():
    plan = {"shardings": {"a": "frugal"}, "cache_ratio": 0.01, "lookahead": 0}
    pts = [point("frugal", 100.0), point("table_wise", 120.0), point("row_wise", 90.0), point("planned", 115.0, plan=plan),
           point("frugal", 100.0, ranks=4), point("planned", 90.0, ranks=4, plan=plan),
           point("table_wise", 50.0, ranks=1)]  # no planned run: no row  # fmt: skip
    rows = bench.planner_rows(pts)
    assert [(r["ranks"], r["best_uniform"]) for r in rows] == [(2, "table_wise"), (4, "frugal")]
    assert rows[0]["ratio"] == pytest.approx(115 / 120) and rows[0]["ok"]  # 4.2% slower: within 5%
    assert rows[1]["ratio"] == pytest.approx(0.9) and not rows[1]["ok"]
    text = bench.planner_markdown(rows)
    assert "1 of 2 points within 5%" in text and "0.900 (miss)" in text


def test_a_prediction_is_of_the_plan_the_run_trained():
    profile = load_profile("cpu")
    plan = {"shardings": {t: ("table_wise" if i < 3 else "frugal") for i, t in enumerate(AVAZU_TABLES)},
            "cache_ratio": 0.02, "lookahead": 5}  # fmt: skip
    w = dlrm_workload("avazu", 2, 128, None, presample_steps=PRESAMPLE_STEPS, threads_per_rank=1)
    assert [t.name for t in w.tables] == AVAZU_TABLES
    q = bench.with_prediction(point("planned", 1000.0, plan=plan), profile, None)
    want = CostModel(profile).predict(w, Plan.of(plan["shardings"], 0.02, 5)).samples_per_second
    assert q["predicted"]["samples_per_second"] == pytest.approx(want)
    assert q["error"] == pytest.approx(want / 1000.0 - 1.0)
    unmeasured = {k: v for k, v in point("planned", 1.0).items() if k != "measured"}
    assert "predicted" not in bench.with_prediction(unmeasured, profile, None)  # its plan is not known yet


def test_repredict_rewrites_predictions_and_keeps_measurements(tmp_path):
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"points": [dict(point("table_wise", 5000.0), predicted={"samples_per_second": 1.0},
                                                   error=123.0)]}))  # fmt: skip
    out = tmp_path / "again.json"
    assert bench.main(["--repredict", str(earlier), "--profile", "cpu", "--json", str(out)]) == 0
    (p,) = json.loads(out.read_text())["points"]
    w = dlrm_workload("avazu", 2, 128, None, presample_steps=PRESAMPLE_STEPS, threads_per_rank=1)
    want = CostModel(load_profile("cpu")).predict(w, Plan("table_wise", bench.CACHE_RATIO, bench.LOOKAHEAD))
    assert p["predicted"]["samples_per_second"] == pytest.approx(want.samples_per_second)
    assert p["measured"]["samples_per_second"] == 5000.0 and p["error"] == pytest.approx(want.samples_per_second / 5000 - 1)
