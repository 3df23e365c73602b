"""The cost model: id statistics against direct computation, the terms' arithmetic, the profiles
and the calibration's fit on synthetic timings (no TorchRec, a few seconds)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from torchrec_frugal.estimate.calibration.least_squares import fit_line
from torchrec_frugal.estimate.calibration.profile_fit import fit_collective, fit_dense, fit_profile, thread_efficiency
from torchrec_frugal.estimate.calibration.training_fit import TrainingRun, fit_training
from torchrec_frugal.estimate.cost_model import (
    FRUGAL,
    SHARDINGS,
    TERMS,
    CostModel,
    CostTable,
    DenseModel,
    frugal_offered,
    planner_shardings,
    shardings_for,
    Plan,
    Primitives,
    RowDistribution,
    Workload,
    assign_tables,
    cache_ratio_choices,
    choose_plan,
    flush_rate,
    predict_all,
    recommend_frugal,
    table_traffic,
)
from torchrec_frugal.estimate.profiles import ProfileError, builtin_profiles, load_profile, profile_from_dict

DENSE = DenseModel.mlps((13, 512, 256, 32), (383, 512, 256, 1))


def workload(world: int = 2, batch: int = 1024, rows=(200_000, 50_000, 5_000), s: float = 1.2) -> Workload:
    tables = tuple(CostTable.zipf(f"t{i}", n, 32, s) for i, n in enumerate(rows))
    return Workload(tables=tables, dense=DENSE, batch_size=batch, world_size=world)


# ---------------------------------------------------------------------------- id statistics
def test_statistics_from_counts_match_a_direct_computation():
    rng = np.random.default_rng(0)
    counts = rng.zipf(1.5, 20_000).astype(np.float64)
    counts[rng.random(counts.size) < 0.3] = 0  # rows never seen
    d = RowDistribution.from_counts(counts)
    p = counts / counts.sum()
    assert d.rows == counts.size
    for draws in (10, 1000, 50_000):
        direct = float((1 - (1 - p) ** draws).sum())
        assert d.expected_unique(draws) == pytest.approx(direct, rel=1e-9)
    for k in (0, 1, 137, 5_000, 20_000):
        top = np.sort(p)[::-1][:k]
        assert float((d.top(k) * d.prob).sum()) == pytest.approx(float(top.sum()), rel=1e-9, abs=1e-12)


def test_grouped_zipf_matches_the_exact_distribution():
    n, s = 300_000, 1.2
    exact = np.arange(1, n + 1, dtype=np.float64) ** -s
    exact /= exact.sum()
    d = RowDistribution.zipf(n, s)
    assert d.rows == n and d.prob.size < 5_000
    for draws in (128, 4096, 100_000):
        assert d.expected_unique(draws) == pytest.approx(float((1 - (1 - exact) ** draws).sum()), rel=5e-3)
    for k in (100, 3_000, 30_000):
        assert float((d.top(k) * d.prob).sum()) == pytest.approx(float(exact[:k].sum()), rel=5e-3)


def test_presampled_hot_set_lies_between_random_rows_and_the_true_top():
    d = RowDistribution.zipf(100_000, 1.2)
    k = 5_000
    true = float((d.top(k) * d.prob).sum())
    assert float((d.hot_set(k, 1e9) * d.prob).sum()) == pytest.approx(true, rel=1e-6)  # everything seen
    small = float((d.hot_set(k, 2_000) * d.prob).sum())
    assert k / 100_000 < small < true
    assert d.hot_set(k, 2_000).sum() == pytest.approx(k)


def test_cache_hit_ratio_is_the_hot_mass_shared_by_the_ranks():
    w = workload(world=4)
    t = w.tables[0]
    x = table_traffic(t, w, Plan("frugal", cache_ratio=0.05), device_is_host=False)
    k = 4 * int(0.05 * t.rows)
    assert x.hit_ratio == pytest.approx(float((t.distribution.top(k) * t.distribution.prob).sum()) / 4)
    assert 0 < x.host_rows < x.unique_rank < x.ids


def test_flush_rate_limits():
    u = np.array([1.0, 0.3, 0.01])
    q = np.array([1.0, 0.2, 0.005])
    assert np.allclose(flush_rate(u, q, 0), u)  # write-through
    assert np.allclose(flush_rate(u, q, 100_000), u)  # an infinite window sees every update
    assert flush_rate(u, q, 10)[0] == pytest.approx(1.0)  # a row read every step: once per step
    assert np.all(flush_rate(u, q, 2) <= u)


# ---------------------------------------------------------------------------- the terms
@pytest.mark.parametrize("profile", ["cpu", "rtx3090", "a30", "h200"])
def test_terms_sum_to_the_step_for_every_sharding(profile):
    hw = load_profile(profile)
    w = workload(world=4)
    for name, c in predict_all(CostModel(hw), w).items():
        assert set(c.terms) == set(TERMS), name
        assert all(v >= 0 for v in c.terms.values()), (name, c.terms)
        assert c.step_s == pytest.approx(sum(c.terms.values()))
        assert c.samples_per_second == pytest.approx(4 * 1024 / c.step_s)
    assert set(predict_all(CostModel(hw), w)) == set(shardings_for(1, hw.device))


def test_all_to_alls_grow_with_the_ranks_as_the_host_bounce_formula_says():
    hw = load_profile("rtx3090")
    assert not hw.p2p
    B, D = 1024, 3 * 32
    for W in (2, 4, 8):
        bw = min(hw.a2a_bw, hw.host_mem_bw / (2 * W))
        sent = B * D * 4 * (W - 1) / W
        expect = 2 * ((W - 1) * hw.a2a_latency_s + sent / bw)
        c = CostModel(hw).predict(workload(world=W, batch=B), Plan("table_wise"))
        assert c.terms["output_all_to_all"] == pytest.approx(expect, rel=1e-9)
    small = Primitives(hw, 2).all_to_all(1 << 20)
    assert Primitives(hw, 8).all_to_all(1 << 20) > small
    with_p2p = Primitives(replace(hw, p2p=True, host_mem_bw=1e9), 8).all_to_all(1 << 20)
    assert with_p2p == pytest.approx(7 * hw.a2a_latency_s + (1 << 20) / hw.a2a_bw)


def test_slow_host_reads_make_frugal_slower_and_leave_stock_shardings_alone():
    hw = load_profile("rtx3090")
    slow = replace(hw, host_read_random_bw=hw.host_read_random_bw / 20,
                   host_read_sorted=[(r, bw / 20) for r, bw in hw.host_read_sorted])  # fmt: skip
    w = workload(world=4)
    plan = Plan("frugal", cache_ratio=0.05, lookahead=10)
    fast_c, slow_c = CostModel(hw).predict(w, plan), CostModel(slow).predict(w, plan)
    assert slow_c.terms["host_reads"] > 5 * fast_c.terms["host_reads"]
    assert slow_c.samples_per_second < fast_c.samples_per_second
    tw = Plan("table_wise")
    assert CostModel(slow).predict(w, tw).samples_per_second == CostModel(hw).predict(w, tw).samples_per_second


def test_bigger_caches_read_less_from_host():
    hw, w = load_profile("rtx3090"), workload(world=4)
    reads = [CostModel(hw).predict(w, Plan("frugal", cache_ratio=c)).terms["host_reads"] for c in (0.01, 0.05, 0.2)]
    assert reads[0] > reads[1] > reads[2]


def test_recommendation_is_the_best_of_its_candidates():
    model, w = CostModel(load_profile("rtx3090")), workload(world=8)
    plan, cost = recommend_frugal(model, w, cache_ratios=(0.01, 0.1), lookaheads=(0, 10))
    for c in (0.01, 0.1):
        for L in (0, 10):
            assert cost.step_s <= model.predict(w, Plan("frugal", c, L)).step_s * (1 + 1e-9)


def test_no_cache_is_a_choice_only_where_the_device_is_host_memory():
    """On a CPU device a cache is a second copy in the same memory: no cache is priced beside the
    ratios, and chosen when predicted faster; an accelerator always keeps some cache."""
    cpu, gpu = load_profile("cpu"), load_profile("rtx3090")
    assert cache_ratio_choices(cpu)[0] == 0.0 and 0.0 not in cache_ratio_choices(gpu)
    model, w = CostModel(cpu), workload(world=2)
    plan, cost = recommend_frugal(model, w)
    assert plan.cache_ratio in cache_ratio_choices(cpu)
    uncached = min(model.predict(w, Plan("frugal", 0.0, L)).step_s for L in (0, 2, 5, 10))
    assert cost.step_s <= uncached * (1 + 1e-9)
    assert recommend_frugal(CostModel(gpu), workload(world=2))[0].cache_ratio > 0


def test_tables_go_to_the_least_loaded_rank():
    assert assign_tables([5.0, 4.0, 3.0, 3.0], 2) == [[0, 3], [1, 2]]


def test_plan_and_workload_reject_nonsense():
    with pytest.raises(ValueError, match="unknown sharding"):
        Plan("column_wise")
    with pytest.raises(ValueError, match="unknown sharding"):
        Plan("frugal", tables={"t0": "column_wise"})
    with pytest.raises(ValueError, match="lacks.*'tx'"):
        CostModel(load_profile("cpu")).predict(workload(), Plan("frugal", tables={"tx": "row_wise"}))
    with pytest.raises(ValueError):
        Workload(tables=(), dense=DENSE, batch_size=1, world_size=1)


# ---------------------------------------------------------------------------- per-table plans
SHARED = ("dense_compute", "dense_allreduce", "framework")
WHOLE_STEP = ("gate_stall", "contention")


@pytest.mark.parametrize("hw_name", ["rtx3090", "cpu"])
def test_a_mixed_step_is_the_shared_terms_plus_each_shardings_own(hw_name):
    """Shared terms once; each sharding's terms as if its tables were the whole model; then the
    gate stall and contention of the whole step. (The share of each table the last-level cache
    holds depends on every table of the node, which one cache serves: without it here, checked
    in tests/estimate/test_cost_model_llc.py.)"""
    hw = replace(load_profile(hw_name), llc_bytes=None, llc_gather_bw=None, llc_scatter_bw=None)
    model, w = CostModel(hw), workload(world=4)
    plan = Plan("frugal", cache_ratio=0.05, lookahead=5, tables={"t0": "table_wise", "t2": "row_wise"})
    mixed = model.predict(w, plan)
    assert mixed.sharding == "mixed" and list(mixed.by_sharding) == ["frugal", "table_wise", "row_wise"]
    alone = {s: model.predict(replace(w, tables=tuple(t for t in w.tables if plan.sharding_of(t.name) == s)),
                              Plan(s, cache_ratio=0.05, lookahead=5))
             for s in mixed.by_sharding}  # fmt: skip
    whole = model.predict(w, Plan("frugal", cache_ratio=0.05, lookahead=5))
    for k in TERMS:
        if k in SHARED:
            assert mixed.terms[k] == pytest.approx(whole.terms[k])
        elif k not in WHOLE_STEP:
            assert mixed.terms[k] == pytest.approx(sum(c.terms[k] for c in alone.values())), k
            assert mixed.terms[k] == pytest.approx(sum(b.get(k, 0.0) for b in mixed.by_sharding.values())), k
    assert mixed.step_s == pytest.approx(sum(mixed.terms.values()))
    assert mixed.details["cache_hit_ratio"] == pytest.approx(alone["frugal"].details["cache_hit_ratio"])


def test_a_uniform_per_table_plan_is_the_one_sharding_plan():
    model, w = CostModel(load_profile("rtx3090")), workload()
    for s in SHARDINGS:
        plan = Plan.of({t.name: s for t in w.tables}, cache_ratio=0.1, lookahead=2)
        assert plan == Plan(s, cache_ratio=0.1, lookahead=2)
        assert model.predict(w, plan).terms == model.predict(w, Plan(s, 0.1, 2)).terms
    assert Plan.of({"a": "row_wise", "b": "frugal", "c": "row_wise"}) == Plan("row_wise", tables={"b": "frugal"})


@pytest.mark.parametrize("hw_name", ["rtx3090", "cpu", "h200"])
def test_the_chosen_plan_is_never_predicted_slower_than_a_uniform_one(hw_name):
    model, w = CostModel(load_profile(hw_name)), workload(world=4)
    choice = choose_plan(model, w)
    assert set(choice.uniform) == set(planner_shardings(1, model.profile.device))
    for s, (plan, cost) in choice.uniform.items():
        assert choice.cost.step_s <= cost.step_s * (1 + 1e-9), s
        assert model.predict(w, plan).step_s == pytest.approx(cost.step_s)
    assert model.predict(w, choice.plan).step_s == pytest.approx(choice.cost.step_s)
    assert list(choice.predicted())[0] == "plan"


def test_one_rank_on_a_host_memory_device_is_not_offered_frugal():
    """One CPU rank: Frugal has no all-to-all to spare and no link to the host table, so the
    planner leaves it out (unless a table may take nothing else); on a GPU it stays a choice."""
    cpu, gpu = CostModel(load_profile("cpu")), CostModel(load_profile("rtx3090"))
    assert (frugal_offered(cpu.profile, 1), frugal_offered(cpu.profile, 2), frugal_offered(gpu.profile, 1)) == (False, True, True)
    one = choose_plan(cpu, workload(world=1))
    assert FRUGAL not in one.uniform and FRUGAL not in one.plan.groups(workload(world=1))
    assert set(one.uniform) == set(planner_shardings(1, "cpu")) - {FRUGAL}
    fixed = choose_plan(cpu, workload(world=1), candidates={"t0": (FRUGAL,)})
    assert fixed.plan.sharding_of("t0") == FRUGAL
    assert FRUGAL in choose_plan(cpu, workload(world=2)).uniform
    assert FRUGAL in choose_plan(gpu, workload(world=1)).uniform


def test_the_choice_mixes_when_each_sharding_suits_different_tables():
    """Slow host reads and slow all-to-alls; the largest table's ids uniform (many host rows), the
    others' on one row: frugal for those, a stock sharding for the largest."""
    hw = replace(load_profile("cpu"), host_read_random_bw=1e5, host_read_sorted=[(16384.0, 1e5)], a2a_bw=1e6)
    hot = RowDistribution.from_counts([1.0] + [0.0] * 999)
    tables = (CostTable("big", 100_000, 16, RowDistribution.uniform(100_000)),
              CostTable("a", 1000, 16, hot), CostTable("b", 1000, 16, hot))  # fmt: skip
    w = Workload(tables=tables, dense=DENSE, batch_size=256, world_size=2)
    choice = choose_plan(CostModel(hw), w)
    assert choice.plan.sharding_of("a") == choice.plan.sharding_of("b") == "frugal"
    assert choice.plan.sharding_of("big") != "frugal"
    assert all(choice.cost.step_s < c.step_s for _, c in choice.uniform.values())
    fixed = choose_plan(CostModel(hw), w, candidates={"big": ("frugal",)})
    assert fixed.plan.sharding_of("big") == "frugal"


# ---------------------------------------------------------------------------- profiles
def test_every_shipped_profile_loads():
    assert {"cpu", "h200", "rtx3090", "rtx4090", "a30"} <= set(builtin_profiles())
    for name in builtin_profiles():
        assert load_profile(name).name == name


def test_a_user_profile_file_loads_and_a_malformed_one_names_the_field(tmp_path):
    d = load_profile("rtx3090").to_json()
    d["name"] = "mine"
    ok = tmp_path / "mine.json"
    ok.write_text(json.dumps(d))
    assert load_profile(str(ok)).name == "mine"
    for field, value, msg in (
        ("a2a_bw", "fast", "'a2a_bw' must be a finite number"),
        ("h2d_bw", 0, "'h2d_bw' must be > 0"),
        ("p2p", "no", "'p2p' must be true or false"),
        ("host_read_sorted", [[100, 1e9], [10, 2e9]], "'host_read_sorted'"),
        ("device", "tpu", "'device' must be one of"),
    ):
        bad = dict(d, **{field: value})
        p = tmp_path / f"bad_{field}.json"
        p.write_text(json.dumps(bad))
        with pytest.raises(ProfileError, match=msg):
            load_profile(str(p))
    missing = {k: v for k, v in d.items() if k != "host_write_bw"}
    with pytest.raises(ProfileError, match="missing field.*host_write_bw"):
        profile_from_dict(missing)
    with pytest.raises(ProfileError, match="unknown field.*speed"):
        profile_from_dict(dict(d, speed=1))
    with pytest.raises(ProfileError, match="no profile"):
        load_profile("no-such-profile")


def test_host_read_bandwidth_interpolates_in_log_rows():
    hw = replace(load_profile("h200"), host_read_sorted=[(1000.0, 1e9), (100_000.0, 3e9)], host_read_random_bw=0.5e9)
    assert hw.host_read_bw(10, 128) == 1e9
    assert hw.host_read_bw(10_000, 128) == pytest.approx(2e9)
    assert hw.host_read_bw(1e7, 128) == 3e9
    assert hw.host_read_bw(1e7, 128, ordered=False) == 0.5e9


# ---------------------------------------------------------------------------- calibration arithmetic
def test_fits_recover_synthetic_constants():
    rate, overhead, ops = 2e11, 3e-5, 54.0
    pts = [(f, ops, f / rate + ops * overhead) for f in (1e8, 8e8)]
    r, o = fit_dense(pts)
    assert r == pytest.approx(rate) and o == pytest.approx(overhead)
    bw, lat = fit_collective([(b, 2 * 1e-4 + b / 3e9) for b in (4096, 8 << 20)], calls_latency=2.0)
    assert bw == pytest.approx(3e9) and lat == pytest.approx(1e-4)
    assert fit_line([1, 2, 3], [5, 7, 9]) == pytest.approx((3.0, 2.0))
    assert thread_efficiency(1.0, 2, 1.0 / 1.6) == pytest.approx(0.6)
    assert thread_efficiency(1.0, 2, 3.0) == 0.0  # a slower run with more threads: no gain, not negative
    with pytest.raises(ValueError):
        fit_line([1, 1], [2, 3])


def test_fit_profile_turns_synthetic_timings_into_a_profile():
    gb = 1e9
    m = {
        "machine": "synthetic", "cores": 16, "device": "cuda",
        "memcpy": {"bytes": 10 * gb, "s": 1.0}, "memcpy_parallel": {"bytes": 80 * gb, "s": 1.0},
        "device_gather": {"bytes": 500 * gb, "s": 1.0}, "device_scatter": {"bytes": 400 * gb, "s": 1.0},
        "device_stream": {"bytes": 900 * gb, "s": 1.0},
        "host_read_sorted": [{"rows": 1000.0, "s": 1000 * 128 / (5 * gb)}, {"rows": 1e6, "s": 1e6 * 128 / (20 * gb)}],
        "host_read_random": {"bytes": 3 * gb, "s": 1.0}, "host_write": {"bytes": 7 * gb, "s": 1.0},
        "h2d": {"bytes": 25 * gb, "s": 1.0}, "d2h": {"bytes": 26 * gb, "s": 1.0},
        "dense": [{"flops": f, "ops": 54.0, "s": f / 1e13 + 54 * 1e-5} for f in (1e9, 8e9)],
        "dense_threads": {"threads": 16, "one_s": 1.0, "many_s": 1.0},
        "per_id": {"ids": 1e6, "s": 1e-3},
        "all_to_all": [{"bytes": b, "s": 5e-5 + b / 12e9} for b in (4096.0, 8e6)],
        "all_reduce": [{"bytes": b, "s": 2 * 4e-5 + b / 10e9} for b in (4096.0, 8e6)],
        "engine": [{"lookahead": L, "rows": r, "s": 2e-4 + r * (3e-7 + (1e-7 if L else 0.0))}
                   for L in (0, 10) for r in (500.0, 2500.0)],
    }  # fmt: skip
    p = fit_profile(m, load_profile("h200"), "synthetic")
    assert p.host_memcpy_bw == pytest.approx(10 * gb) and p.host_mem_bw == pytest.approx(80 * gb)
    assert p.h2d_bw == pytest.approx(25 * gb) and p.d2h_bw == pytest.approx(26 * gb)
    assert p.dense_flops_per_s == pytest.approx(1e13) and p.op_overhead_s == pytest.approx(1e-5)
    assert p.a2a_bw == pytest.approx(12e9) and p.a2a_latency_s == pytest.approx(5e-5)
    assert p.allreduce_bw == pytest.approx(10e9) and p.allreduce_latency_s == pytest.approx(4e-5)
    assert p.host_read_sorted[-1][1] == pytest.approx(20 * gb)
    assert p.kernel_id_s == pytest.approx(1e-9)
    assert p.exchange_step_s == pytest.approx(2e-4) and p.exchange_row_s == pytest.approx(3e-7)
    assert p.lookahead_row_s == pytest.approx(1e-7)
    assert p.dense_thread_efficiency == 0.0  # cuda
    assert p.device_memory_bytes == load_profile("h200").device_memory_bytes  # from the base
    # a GPU calibration keeps the base's network (one machine cannot measure one) and reads host memory
    assert p.network_bw == load_profile("h200").network_bw and p.host_memory_bytes == load_profile("h200").host_memory_bytes
    p = fit_profile(dict(m, host_memory_bytes=64 * 2**30), load_profile("h200"), "synthetic")
    assert p.host_memory_bytes == 64 * 2**30
    # on a CPU device, nodes simulated on the machine talk like its ranks: loopback gloo
    cpu = fit_profile(dict(m, device="cpu"), load_profile("cpu"), "synthetic_cpu")
    assert cpu.network_bw == pytest.approx(2 * 12e9) and cpu.network_latency_s == pytest.approx(5e-5)


@pytest.mark.parametrize("hw_name", ["cpu", "rtx3090"])
def test_training_fit_recovers_the_framework_terms_of_synthetic_runs(hw_name):
    """Runs "measured" with a known profile (framework terms, thread efficiency) are fitted from a
    profile that lacks them: the fit finds them again, through the contention of ranks sharing
    cores (cpu) and without it (rtx3090), and the fitted model reproduces every run."""
    base = replace(load_profile(hw_name), framework_step_s=0.0, framework_id_s=0.0, framework_dist_step_s=0.0)
    truth = replace(base, framework_step_s=1.5e-3, framework_id_s=4e-8, framework_dist_step_s=5e-3,
                    dense_thread_efficiency=0.7 if base.device_is_host else base.dense_thread_efficiency)  # fmt: skip
    grid = [(world, batch, plan) for world in (1, 2, 4) for batch in (256, 2048) for plan in ("table_wise", "frugal")]
    runs = []
    for world, batch, plan in grid:
        w = workload(world=world, batch=batch)
        runs.append(TrainingRun(w, Plan(plan), CostModel(truth).predict(w, Plan(plan)).samples_per_second))
    fitted, report = fit_training(runs, replace(base, dense_thread_efficiency=0.0))
    assert fitted.framework_step_s == pytest.approx(truth.framework_step_s, rel=1e-3)
    assert fitted.framework_id_s == pytest.approx(truth.framework_id_s, rel=1e-3)
    assert fitted.framework_dist_step_s == pytest.approx(truth.framework_dist_step_s, rel=1e-3)
    assert fitted.dense_thread_efficiency == pytest.approx(truth.dense_thread_efficiency)
    assert report["rms_relative_error"] < 1e-6
    for r, row in zip(runs, report["runs"]):
        assert row["predicted_step_s"] == pytest.approx(r.step_s, rel=1e-6)
    # the framework term adds to every rank's step; it is fitted >= 0 even when the runs are faster
    fast = [TrainingRun(r.workload, r.plan, r.samples_per_second * 3) for r in runs]
    fitted_fast, _ = fit_training(fast, base)
    assert min(getattr(fitted_fast, k) for k in ("framework_step_s", "framework_id_s", "framework_dist_step_s")) >= 0.0
    with pytest.raises(ValueError, match="two measured runs"):
        fit_training(runs[:1], base)
