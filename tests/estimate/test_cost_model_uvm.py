"""TorchRec's offloading in the cost model (fused_uvm_caching with and without the prefetch
pipeline, fused_uvm) and Frugal's threads beside the step, against hand-computed small cases."""
from __future__ import annotations

from dataclasses import replace

import pytest

from torchrec_frugal.estimate.cost_model import (
    FRUGAL,
    UVM_CHOICES,
    CostModel,
    CostTable,
    DenseModel,
    Plan,
    RowDistribution,
    Workload,
    choose_plan,
    predict_all,
    split_choice,
    uvm_cache,
)
from torchrec_frugal.estimate.profiles import ProfileError, load_profile, profile_from_dict

DENSE = DenseModel(flops_per_sample=1e3, params=1000, ops=3)


def one_table(rows: int, world: int = 1, batch: int = 100, dist: RowDistribution = None) -> Workload:
    t = CostTable("t", rows, 32, dist or RowDistribution.uniform(rows))
    return Workload(tables=(t,), dense=DENSE, batch_size=batch, world_size=world)


def test_lru_of_uniform_rows_misses_the_share_the_cache_does_not_hold():
    # Che: the cache holds C of N equally likely rows, so a distinct row of a step misses with 1 - C/N
    n, rows, cap = 100, 1000, 200
    touched = 1 - (1 - 1 / rows) ** n
    [(miss, hit)] = uvm_cache([RowDistribution.uniform(rows)], [n], cap)
    assert miss == pytest.approx(rows * touched * (1 - cap / rows), rel=1e-6)
    assert hit == pytest.approx(cap / rows, rel=1e-6)
    assert uvm_cache([RowDistribution.uniform(rows)], [n], rows) == [(0.0, 1.0)]


def test_lfu_bound_caches_the_hottest_rows():
    # 10 hot rows (prob 0.05 each) and 1000 cold (prob 0.0005): a cache of 10 holds exactly the hot ones
    d = RowDistribution(prob=__import__("numpy").array([0.05, 0.0005]), count=__import__("numpy").array([10.0, 1000.0]))
    n = 50
    [(miss, _)] = uvm_cache([d], [n], 10, "lfu")
    assert miss == pytest.approx(1000 * (1 - (1 - 0.0005) ** n))
    [(lru_miss, _)] = uvm_cache([d], [n], 10, "lru")
    assert lru_miss > miss  # LRU also loses hot rows to cold ones; LFU's set is the bound


def test_a_cache_shared_by_two_tables_splits_by_their_draws():
    a, b = RowDistribution.uniform(1000), RowDistribution.uniform(1000)
    (ma, _), (mb, _) = uvm_cache([a, b], [100, 100], 400)
    assert ma == pytest.approx(mb)
    [(alone, _)] = uvm_cache([a], [100], 200)
    assert ma == pytest.approx(alone, rel=1e-6)  # equal streams: each table gets half the cache


def test_fused_uvm_caching_terms_by_hand():
    hw = load_profile("rtx3090")
    rows, batch = 10_000, 1000
    w = one_table(rows, batch=batch)
    plan = Plan("table_wise:fused_uvm_caching", uvm_load_factor=0.1)
    c = CostModel(hw).predict(w, plan)
    d = RowDistribution.uniform(rows)
    unique = d.expected_unique(batch)
    [(miss, _)] = uvm_cache([d], [batch], 0.1 * rows)
    rb = 32 * 4
    assert c.terms["uvm_reads"] == pytest.approx(miss * rb / hw.host_read_bw(miss, rb, ordered=False))
    assert c.terms["uvm_writes"] == pytest.approx(miss * rb / hw.host_write_bw)
    # FBGEMM's cache management: 3 operators, one more pass over the ids, a 32-way set probe (512 B)
    # per distinct row, and the insert per miss
    manage = 3 * hw.op_overhead_s + batch * hw.kernel_id_s + unique * 512 / hw.device_gather_bw + miss * hw.uvm_miss_cost_s
    assert c.terms["embedding_lookup"] == pytest.approx(unique * rb / hw.device_gather_bw + batch * hw.kernel_id_s + manage)
    # the device holds the cache and the row-wise state; the host holds the table
    assert c.memory_bytes_per_device == pytest.approx(0.1 * rows * rb + rows * 4 + DENSE.params * 4 * 3)
    assert c.host_memory_bytes_per_node == pytest.approx(rows * rb)
    # with the prefetch pipeline the same fill runs beside the step: only its excess waits
    pf = CostModel(hw).predict(w, replace(plan, sharding="table_wise:fused_uvm_caching+prefetch"))
    fill = c.terms["uvm_reads"] + c.terms["uvm_writes"] + manage
    assert pf.terms["embedding_lookup"] == pytest.approx(c.terms["embedding_lookup"] - manage)
    assert pf.terms["uvm_reads"] == pf.terms["uvm_writes"] == 0.0
    assert pf.details["uvm_prefetch_ms"] == pytest.approx(1e3 * fill)
    rest = pf.step_s - pf.terms["prefetch_stall"] - pf.terms["contention"]
    assert pf.terms["prefetch_stall"] == pytest.approx(max(0.0, fill - rest))


def test_fused_uvm_reads_every_distinct_row_over_the_link():
    hw = load_profile("rtx3090")
    w = one_table(10_000, batch=1000)
    c = CostModel(hw).predict(w, Plan("row_wise:fused_uvm"))
    unique = RowDistribution.uniform(10_000).expected_unique(1000)
    rb = 128
    read = unique * rb / hw.host_read_bw(unique, rb, ordered=False)
    assert c.terms["uvm_reads"] == pytest.approx(2 * read)  # the forward, then the optimizer's read
    assert c.terms["uvm_writes"] == pytest.approx(unique * rb / hw.host_write_bw)


def test_a_table_too_large_for_the_devices_fits_offloaded():
    hw = profile_from_dict({**load_profile("rtx3090").to_json(), "device_memory_bytes": 4 * 2**20})
    w = one_table(100_000, world=2, dist=RowDistribution.zipf(100_000, 1.2))
    costs = predict_all(CostModel(hw), w, shardings=("table_wise", "row_wise", "table_wise:fused_uvm_caching"))
    assert not costs["table_wise"].fits and not costs["row_wise"].fits
    assert costs["table_wise:fused_uvm_caching"].fits
    choice = choose_plan(CostModel(hw), w, {"t": ("table_wise", "row_wise", "table_wise:fused_uvm_caching")})
    assert choice.plan.sharding == "table_wise:fused_uvm_caching" and choice.cost.fits


def test_offloading_is_refused_on_a_cpu_device():
    with pytest.raises(ValueError, match="CUDA kernel"):
        CostModel(load_profile("cpu")).predict(one_table(1000), Plan(UVM_CHOICES[0]))
    assert split_choice("row_wise:fused_uvm_caching+prefetch") == ("row_wise", "fused_uvm_caching", True)
    assert split_choice("table_wise") == ("table_wise", "fused", False)


def test_frugal_threads_run_beside_the_step():
    hw = load_profile("rtx3090")
    w = one_table(100_000, world=2, batch=1000, dist=RowDistribution.zipf(100_000, 1.2))
    c = CostModel(hw).predict(w, Plan(FRUGAL, lookahead=0))
    assert c.terms["engine_host"] == hw.frugal_train_thread_s  # flat on the training thread
    planner = hw.planner_step_s + c.details["ids_per_rank"] * hw.planner_id_s + c.details["unique_rows_per_rank"] * hw.planner_row_s
    assert c.details["planner_thread_ms"] == pytest.approx(1e3 * planner)
    # a planner slower than the step is on the critical path, by its excess
    slow = profile_from_dict({**hw.to_json(), "planner_id_s": 1e-5})
    s = CostModel(slow).predict(w, Plan(FRUGAL, lookahead=0))
    rest = s.step_s - s.terms["gate_stall"] - s.terms["contention"]
    assert s.terms["gate_stall"] == pytest.approx(1e-3 * s.details["planner_thread_ms"] - rest)
    # more threads than cores: the contention term
    few = profile_from_dict({**slow.to_json(), "host_cores": 1})
    assert CostModel(few).predict(w, Plan(FRUGAL, lookahead=0)).terms["contention"] > 0


def test_old_profiles_with_the_engine_fields_still_load():
    d = load_profile("rtx3090").to_json()
    d.update(engine_step_s=2e-4, engine_row_s=2e-7)
    assert profile_from_dict(d).name == "rtx3090"


def test_the_real_datas_tail_adds_compulsory_misses():
    """A table whose every row is read once an epoch: the rows Zipf leaves undrawn over the epoch's
    draws are read too, each a compulsory miss of the UVM cache (and a distinct row for everyone)."""
    hw = load_profile("rtx3090")
    rows, batch, epoch = 1_000_000, 1000, 5e6
    d = RowDistribution.zipf(rows, 1.2)
    synthetic = CostTable("t", rows, 32, d)
    real = replace(synthetic, epoch_draws=epoch)
    rate = (rows - d.expected_unique(epoch)) / epoch
    assert synthetic.tail_rate() == 0.0 and real.tail_rate() == pytest.approx(rate)
    assert 0.1 < rate < 0.2  # Zipf(1.2) draws 5M times and leaves most of a 1M-row table unread
    plan = Plan("table_wise:fused_uvm_caching", uvm_load_factor=0.1)
    costs = [CostModel(hw).predict(Workload(tables=(t,), dense=DENSE, batch_size=batch, world_size=1), plan)
             for t in (synthetic, real)]  # fmt: skip
    [(miss, _)] = uvm_cache([d], [batch], 0.1 * rows)
    tail = batch * rate
    assert costs[1].terms["uvm_writes"] == pytest.approx((miss + tail) * 128 / hw.host_write_bw)
    assert costs[0].terms["uvm_writes"] == pytest.approx(miss * 128 / hw.host_write_bw)
    # the tail rows are distinct rows of the step for every sharding, never hits of Frugal's cache
    fr = [CostModel(hw).predict(Workload(tables=(t,), dense=DENSE, batch_size=batch, world_size=2), Plan(FRUGAL))
          for t in (synthetic, real)]  # fmt: skip
    assert fr[1].details["unique_rows_per_rank"] == pytest.approx(fr[0].details["unique_rows_per_rank"] + tail)
    assert fr[1].details["host_rows_per_rank"] == pytest.approx(fr[0].details["host_rows_per_rank"] + tail)
    assert fr[1].details["cache_hit_ratio"] == pytest.approx(fr[0].details["cache_hit_ratio"] * (1 - rate))
    # a table the distribution already covers has no tail
    small = CostTable.zipf("s", 1000, 32, 1.2, epoch_draws=1e7)
    assert small.tail_rate() == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="epoch_draws"):
        CostTable.zipf("s", 1000, 32, 1.2, epoch_draws=0)


def test_cache_management_costs_the_profiles_time_per_miss():
    hw = load_profile("rtx3090")
    w = one_table(100_000, batch=1000, dist=RowDistribution.zipf(100_000, 1.2))
    plan = Plan("table_wise:fused_uvm_caching", uvm_load_factor=0.05)
    base = CostModel(hw).predict(w, plan)
    slow = CostModel(replace(hw, uvm_miss_s=1e-6)).predict(w, plan)
    [(miss, _)] = uvm_cache([w.tables[0].distribution], [1000], 0.05 * 100_000)
    extra = slow.terms["embedding_lookup"] - base.terms["embedding_lookup"]
    assert hw.uvm_miss_s is None and extra == pytest.approx(miss * (1e-6 - hw.uvm_miss_cost_s))
    # the field is optional in a profile file, and checked when present
    d = hw.to_json()
    assert profile_from_dict({**d, "uvm_miss_s": 2e-8}).uvm_miss_cost_s == 2e-8
    with pytest.raises(ProfileError, match="uvm_miss_s"):
        profile_from_dict({**d, "uvm_miss_s": -1.0})
