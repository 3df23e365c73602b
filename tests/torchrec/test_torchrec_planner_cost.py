"""FrugalShardingPlanner(hardware=...): per-table shardings, cache ratio and L by predicted step.

In-process planning on meta-device models (the DLRM of tests/torchrec/test_torchrec_planner.py) with
modified profiles whose predictions leave no doubt: very slow host reads must send the large
tables to a stock sharding, very slow all-to-alls must keep every table frugal. A mixed plan
(frugal and table_wise tables) chosen by the cost model trains on 2 gloo ranks exactly like
TorchRec's table_wise sharding (the model, data and helpers of tests/torchrec/test_torchrec_distributed.py).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Dict, List

import numpy as np
import pytest
import torch
from torch import nn
from torchrec.distributed.planner import ParameterConstraints, Topology

import torchrec_ranks as trd
from test_torchrec_planner import ADAGRAD, EBC_PATH, ROWS, dlrm, types
from torchrec_frugal.config import FrugalConfig
from torchrec_frugal.estimate.cost_model import PLANNER_SHARDINGS
from torchrec_frugal.estimate.profiles import HardwareProfile, load_profile
from torchrec_frugal.host.launch import run_ranks
from torchrec_frugal.torchrec import FRUGAL, FrugalEmbeddingBagCollectionSharder
from torchrec_frugal.torchrec.planner.plan_choice import TableCandidates
from torchrec_frugal.torchrec.planner.planners import FrugalShardingPlanner

CPU = load_profile("cpu")  # predicts frugal for every table of the test DLRM
RTX3090 = load_profile("rtx3090")  # predicts table_wise for every table
SLOW_HOST_READS = replace(CPU, host_read_random_bw=1e6, host_read_sorted=[(16384.0, 1e6), (1048576.0, 1e6)])
SLOW_ALL_TO_ALL = replace(RTX3090, p2p=False, a2a_bw=1e6, a2a_latency_s=1e-2)
# Host reads and all-to-alls both slow, with ids that make the largest table read many host rows
# (uniform) and every other table one hot row: frugal costs the largest table most, table_wise
# the others, so the cheapest predicted plan mixes them.
MIXED = replace(load_profile("cpu"), host_read_random_bw=1e5, host_read_sorted=[(16384.0, 1e5)], a2a_bw=1e6)


def mixed_id_counts(rows: List[int]) -> Dict[str, torch.Tensor]:
    counts = {f"t{t}": torch.zeros(n) for t, n in enumerate(rows)}
    for c in counts.values():
        c[0] = 1.0
    counts[f"t{len(rows) - 1}"] = torch.ones(rows[-1])
    return counts


def planned(hardware: Any, topology: Topology = Topology(world_size=2, compute_device="cpu"), **kw: Any):
    sharder = FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD, config=FrugalConfig(lookahead=7))
    planner = FrugalShardingPlanner(topology=topology, batch_size=1024, hardware=hardware, **kw)
    return planner.plan(dlrm(), [sharder]), planner, sharder


def test_the_workload_comes_from_the_module_and_the_constraints() -> None:
    model = dlrm()
    sharder = FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD)
    constraints = {"t1": ParameterConstraints(sharding_types=["row_wise"], pooling_factors=[3.0])}
    tables = TableCandidates(model, [sharder], constraints, "cpu")
    assert tables.shapes == {f"t{i}": (n, 16) for i, n in enumerate(ROWS)}
    assert tables.free == {"t0", "t2", "t3"} and tables.candidates["t0"] == PLANNER_SHARDINGS
    assert tables.candidates["t1"] == ("row_wise",) and tables.pooling == {"t0": 1.0, "t1": 3.0, "t2": 1.0, "t3": 1.0}
    dense = sum(p.numel() for p in model.parameters()) - 16 * sum(ROWS)
    assert tables.dense.params == dense and tables.dense.flops_per_sample == 2.0 * dense
    assert tables.dense.ops == 3 * sum(isinstance(m, nn.Linear) for m in model.modules())
    assert tables.state_floats_per_row() == 1.0  # row-wise Adagrad


def test_slow_host_reads_send_the_large_tables_to_a_stock_sharding() -> None:
    assert set(types(planned(CPU)[0]).values()) == {FRUGAL}
    plan, planner, _ = planned(SLOW_HOST_READS)
    got = types(plan)
    assert got["t2"] != FRUGAL and got["t3"] != FRUGAL  # 200,000 and 30,000 rows
    assert planner.predicted["plan"].step_s < planner.predicted[FRUGAL].step_s / 2


def test_slow_all_to_alls_keep_every_table_frugal() -> None:
    assert FRUGAL not in set(types(planned(RTX3090)[0]).values())
    plan, planner, sharder = planned(SLOW_ALL_TO_ALL)
    assert types(plan) == {f"t{i}": FRUGAL for i in range(len(ROWS))}
    assert planner.cache_ratio is not None and planner.lookahead is not None
    ratios = {ps.cache_params.load_factor for ps in plan.plan[EBC_PATH].values()}  # type: ignore[union-attr]
    assert ratios == {planner.cache_ratio}
    given = sharder.config
    (configured,) = planner.sharders()  # the route to the engines
    assert configured.config.lookahead == planner.lookahead and type(configured) is type(sharder)
    assert sharder.config is given and given.lookahead == 7 != planner.lookahead  # the script's config as it was
    assert configured.config == replace(given, lookahead=planner.lookahead)
    for stock in ("table_wise", "row_wise", "table_row_wise"):
        assert planner.predicted["plan"].step_s < planner.predicted[stock].step_s / 2


def test_a_mixed_plan_is_never_predicted_slower_than_a_uniform_one() -> None:
    plan, planner, _ = planned(MIXED, id_counts=mixed_id_counts(ROWS))
    assert [types(plan)[f"t{i}"] for i in range(len(ROWS))] == [FRUGAL] * 3 + ["table_wise"]
    chosen = planner.predicted["plan"]
    assert chosen.sharding == "mixed" and set(chosen.by_sharding) == {FRUGAL, "table_wise"}
    assert all(chosen.step_s < c.step_s for s, c in planner.predicted.items() if s != "plan")


def test_the_cache_ratio_is_the_smaller_of_the_choice_and_device_memory() -> None:
    small = Topology(world_size=4, compute_device="cuda", hbm_cap=int(2e6))
    _, roomy, _ = planned(SLOW_ALL_TO_ALL, Topology(world_size=4, compute_device="cuda"))
    _, tight, _ = planned(SLOW_ALL_TO_ALL, small)
    _, bound, _ = planned(None, small, config=FrugalConfig(cache_ratio=1.0))  # what memory holds
    assert roomy.cache_ratio is not None and bound.cache_ratio is not None
    assert bound.cache_ratio < roomy.cache_ratio
    assert tight.cache_ratio == pytest.approx(bound.cache_ratio)
    assert tight.predicted["plan"].details["cache_ratio"] == tight.cache_ratio  # predicted as sized


def test_the_report_shows_the_predicted_terms(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="torchrec_frugal.torchrec.planner.stats"):
        planned(SLOW_HOST_READS)
    report = "\n".join(r.getMessage() for r in caplog.records if r.name == "torchrec_frugal.torchrec.planner.stats")
    assert "PREDICTED" in report and "predictions, not measurements" in report
    assert "| term (ms per step) | plan | frugal | table_wise | row_wise | table_row_wise |" in report
    for term in ("host_reads", "output_all_to_all", "engine_host", "**step**", "samples/s"):
        assert term in report


def test_without_hardware_the_plan_is_unchanged() -> None:
    plan, planner, sharder = planned(None)
    assert types(plan) == {f"t{i}": FRUGAL for i in range(len(ROWS))}
    assert planner.cache_ratio == FrugalConfig().cache_ratio
    assert planner.lookahead is None and planner.predicted == {} and sharder.config.lookahead == 7


def test_a_profile_is_taken_by_name_or_as_data() -> None:
    _, by_name, _ = planned("rtx3090")
    _, as_data, _ = planned(RTX3090)
    assert isinstance(RTX3090, HardwareProfile)
    assert by_name.predicted["plan"].step_s == as_data.predicted["plan"].step_s


# ---------------------------------------------------------------------------- a mixed plan trains
STEPS = 100
_PLANNERS: List[FrugalShardingPlanner] = []


class MixedPlanner(FrugalShardingPlanner):
    """What ``trd.build`` gets as FrugalShardingPlanner in the ranks: the MIXED profile's choice."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(hardware=MIXED, id_counts=mixed_id_counts(trd.TABLE_ROWS), **kw)
        _PLANNERS.append(self)


def _planned_and_table_wise(rank: int, world: int) -> Dict[str, Any]:
    import torchrec_frugal.torchrec.planner.planners as planner_module

    planner_module.FrugalShardingPlanner = MixedPlanner  # type: ignore[misc]  # build() plans with it
    dmp, optimizer, key = trd.build(world, "frugal", "adagrad")
    planner_module.FrugalShardingPlanner = FrugalShardingPlanner  # type: ignore[misc]
    losses = trd.train(dmp, optimizer, trd.ZipfBatches(rank).batches(0, STEPS))
    out: Dict[str, Any] = {
        "planned": {
            "losses": np.array(losses),
            "tables": trd.full_tables(dmp, key, trd.table_shapes("dlrm")),
            "types": trd.sharding_types(dmp),
            "engine_lookahead": sorted({lookup.lookahead() for lookup in trd.frugal_lookups(dmp)}),
            "planner_lookahead": _PLANNERS[-1].lookahead,
        }
    }
    trd.release(dmp)
    out["tw"] = trd.run_training(world, "table_wise", "adagrad", steps=STEPS)
    return out


def test_a_mixed_plan_chosen_by_the_cost_model_trains_like_table_wise() -> None:
    results = run_ranks(2, _planned_and_table_wise)
    n = len(trd.TABLE_ROWS)
    for res in results:
        assert [res["planned"]["types"][f"t{t}"] for t in range(n)] == [FRUGAL] * (n - 1) + ["table_wise"]
        assert res["planned"]["engine_lookahead"] == [res["planned"]["planner_lookahead"]]
    trd.assert_same_training(results, "planned", "tw")


def test_a_table_too_large_for_the_gpus_is_planned_on_uvm_caching() -> None:
    """On a CUDA topology whose devices hold none of the large table (FUSED) the planner may offload
    it: TorchRec's fused_uvm_caching kernel in the plan, with the chosen cache_load_factor."""
    hbm = 6 * 2**20
    hw = replace(RTX3090, device_memory_bytes=float(hbm))
    plan, planner, _ = planned(hw, Topology(world_size=2, compute_device="cuda", hbm_cap=hbm))
    chosen = planner.predicted["plan"]
    assert chosen.fits
    big = plan.plan[EBC_PATH]["t2"]  # 200,000 rows x 16: 12.8 MB
    assert big.compute_kernel == "fused_uvm_caching" and big.sharding_type in ("table_wise", "row_wise")
    assert big.cache_params is not None and big.cache_params.load_factor == planner.chosen.uvm_load_factor  # type: ignore[union-attr]


def test_on_a_cpu_topology_only_the_kernels_the_cpu_sharder_offers_are_candidates() -> None:
    """TorchRec's CPU sharders offer only fused: a CPU topology never gets an offloading candidate,
    even with a GPU profile, and every planned table keeps the fused kernel (or frugal)."""
    sharder = FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD)
    assert sharder.compute_kernels("table_wise", "cpu") == ["fused"]
    tables = TableCandidates(dlrm(), [sharder], {}, "cpu")
    assert all(":" not in s for c in tables.candidates.values() for s in c)
    plan, _, _ = planned(RTX3090, Topology(world_size=2, compute_device="cpu"))
    assert {ps.compute_kernel for ps in plan.plan[EBC_PATH].values()} == {"fused"}
