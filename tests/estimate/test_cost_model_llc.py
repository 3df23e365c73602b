"""The last-level cache term of the cost model: which share of each table the cache holds, the
row rates it blends, that profiles without it price as before, and the refit on recorded runs
(:func:`torchrec_frugal.estimate.calibration.training_fit.fit_rates`) recovering known rates."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from torchrec_frugal.estimate.calibration.training_fit import TrainingRun, fit_rates
from torchrec_frugal.estimate.cost_model import CostModel, CostTable, DenseModel, Plan, Primitives, Workload, llc_shares, table_traffic
from torchrec_frugal.estimate.profiles import ProfileError, builtin_profiles, load_profile, profile_from_dict

DENSE = DenseModel.mlps((13, 64, 16), (16, 32, 1))
MIB = float(1 << 20)


def cpu_with_llc(llc_bytes: float = 4 * MIB, mem: float = 1e9, llc: float = 4e9):
    return replace(load_profile("cpu"), device_gather_bw=mem, device_scatter_bw=mem / 2, llc_bytes=llc_bytes,
                   llc_gather_bw=llc, llc_scatter_bw=llc / 2)  # fmt: skip


def test_the_smallest_tables_fill_the_cache_first():
    # sorted: 10 (fits, 50 left), 40 (fits, 10 left), 100 (10 of its 100 bytes)
    assert llc_shares([100.0, 40.0, 10.0], 60.0).tolist() == pytest.approx([0.1, 1.0, 1.0])
    assert llc_shares([100.0, 40.0, 10.0], 1000.0).tolist() == [1.0, 1.0, 1.0]
    assert llc_shares([100.0, 40.0, 10.0], 5.0).tolist() == pytest.approx([0.0, 0.0, 0.5])
    # equal sizes: the first in table order fills first
    assert llc_shares([30.0, 30.0], 45.0).tolist() == pytest.approx([1.0, 0.5])


def test_a_resident_share_blends_the_cache_and_memory_rates():
    p = Primitives(cpu_with_llc(mem=1e9, llc=4e9), 1)
    # 1,000 rows of 64 bytes read as 128-byte lines: 128,000 bytes, a quarter at 4 GB/s
    assert p.device_gather(1000, 64, 0.25) == pytest.approx(128_000 * (0.75 / 1e9 + 0.25 / 4e9))
    assert p.device_scatter(1000, 256, 1.0) == pytest.approx(256_000 / 2e9)
    assert p.device_gather(1000, 256, 0.0) == 256_000 / 1e9
    # a profile without the cache fields ignores the share
    plain = Primitives(load_profile("h200"), 1)
    assert plain.device_gather(1000, 256, 0.7) == plain.device_gather(1000, 256)


def test_table_wise_on_one_rank_prices_each_table_at_its_share():
    """Two tables of 32-dim rows with 1 state float (132 bytes a row): 1,000 rows (132,000 bytes)
    fit a 1 MiB cache whole, 100,000 rows (13.2 MB) hold the rest of it."""
    hw = cpu_with_llc(llc_bytes=MIB, mem=1e9, llc=4e9)
    tables = (CostTable.zipf("small", 1_000, 32, 1.1), CostTable.zipf("large", 100_000, 32, 1.1))
    w = Workload(tables=tables, dense=DENSE, batch_size=256, world_size=1)
    c = CostModel(hw).predict(w, Plan("table_wise"))
    share_large = (MIB - 132_000) / 13_200_000
    tr = [table_traffic(t, w, Plan("table_wise"), True) for t in tables]
    u_small, u_large = tr[0].unique_all, tr[1].unique_all
    lookup = u_small * 128 / 4e9 + u_large * 128 * ((1 - share_large) / 1e9 + share_large / 4e9) + 512 * hw.kernel_id_s
    assert c.terms["embedding_lookup"] == pytest.approx(lookup, rel=1e-12)
    update = u_small * 132 * (1 / 4e9 + 1 / 2e9) + u_large * 132 * ((1 - share_large) * (1 / 1e9 + 1 / 0.5e9)
                                                                    + share_large * (1 / 4e9 + 1 / 2e9))  # fmt: skip
    assert c.terms["embedding_update"] == pytest.approx(update, rel=1e-12)


@pytest.mark.parametrize("hw_name", [n for n in builtin_profiles() if n != "cpu"])
def test_profiles_without_the_cache_price_as_before(hw_name):
    """GPU profiles set no cache fields: every table gets no share and the step is unchanged."""
    hw = load_profile(hw_name)
    assert not hw.has_llc
    tables = (CostTable.zipf("a", 5_000, 32, 1.1), CostTable.zipf("b", 500_000, 64, 1.1))
    w = Workload(tables=tables, dense=DENSE, batch_size=512, world_size=2)
    for plan in (Plan("table_wise"), Plan("row_wise"), Plan("frugal")):
        a = CostModel(hw).predict(w, plan)
        b = CostModel(replace(hw, llc_bytes=MIB, llc_gather_bw=hw.device_gather_bw, llc_scatter_bw=hw.device_scatter_bw)).predict(w, plan)
        assert a.step_s == pytest.approx(b.step_s, rel=1e-12)  # the same rate in and out of the cache


def test_the_cache_fields_go_together():
    d = load_profile("cpu").to_json()
    d.update(llc_bytes=MIB, llc_gather_bw=None, llc_scatter_bw=None)
    with pytest.raises(ProfileError, match="go together"):
        profile_from_dict(d, "x.json")
    d.update(llc_gather_bw=1e9, llc_scatter_bw=1e9)
    assert profile_from_dict(d, "x.json").has_llc


def test_the_recorded_refit_recovers_known_rates():
    """Runs "measured" with a known profile (dense rate, memory and cache row rates, a fixed term
    once ranks talk) on small tables that fit the cache and large ones that do not are refitted
    from a profile that lacks them: the fit finds the rates again."""
    base = replace(load_profile("cpu"), framework_step_s=0.0, framework_id_s=0.0, framework_dist_step_s=0.0,
                   dense_thread_efficiency=0.5)  # fmt: skip
    llc = 4 * MIB
    truth = replace(base, dense_flops_per_s=base.dense_flops_per_s * 1.3, device_gather_bw=base.device_gather_bw / 3,
                    device_scatter_bw=base.device_scatter_bw / 3, llc_bytes=llc, llc_gather_bw=base.device_gather_bw * 2,
                    llc_scatter_bw=base.device_scatter_bw * 2, framework_dist_step_s=2e-3)  # fmt: skip
    sizes = {"small": (3_000, 2_000, 1_000), "large": (400_000, 200_000, 100_000)}
    runs = []
    for rows in sizes.values():
        for world in (1, 2, 4):
            for batch in (128, 1024):
                tables = tuple(CostTable.zipf(f"t{i}", n, 32, 1.05) for i, n in enumerate(rows))
                w = Workload(tables=tables, dense=DENSE, batch_size=batch, world_size=world)
                runs.append(TrainingRun(w, Plan("table_wise"), CostModel(truth).predict(w, Plan("table_wise")).samples_per_second))
    fitted, report = fit_rates(runs, base, llc)
    assert report["rms_relative_error"] < 5e-3
    assert (report["parameters"], report["runs"]) == (7, 12)
    assert fitted.llc_bytes == llc
    assert fitted.device_gather_bw == pytest.approx(truth.device_gather_bw, rel=0.01)
    # the cache rate trades off a little against the dense rate and the thread efficiency here
    assert fitted.llc_gather_bw == pytest.approx(truth.llc_gather_bw, rel=0.1)
    assert fitted.framework_dist_step_s == pytest.approx(truth.framework_dist_step_s, rel=0.01)
    steps = np.array([CostModel(fitted).predict(r.workload, r.plan).step_s for r in runs])
    assert steps == pytest.approx(np.array([r.step_s for r in runs]), rel=0.01)
    with pytest.raises(ValueError, match="at least 7"):
        fit_rates(runs[:3], base, llc)
