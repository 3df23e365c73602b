"""FrugalShardingPlanner, the sharders' type lists, the frugal() plan generator, the PCIe topology.

Planning runs in one process on meta-device models (no process group needed for plan()).
collective_plan is exercised by tests/torchrec/test_torchrec_distributed.py.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, List, Optional

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.types import CollectiveType, ShardingOption
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
from torchrec.distributed.types import ShardingPlan
from torchrec.models.dlrm import DLRM, DLRMTrain

from torchrec_frugal.config import FrugalConfig
from torchrec_frugal.torchrec import FRUGAL, FrugalEmbeddingBagCollectionSharder, FrugalEmbeddingCollectionSharder
from torchrec_frugal.torchrec.checkpoint import row_blocks
from torchrec_frugal.torchrec.planner.planners import FrugalShardingPlanner, frugal
from torchrec_frugal.torchrec.embedding_kernel import optimizer_spec
from torchrec_frugal.torchrec.planner.topology import CONSUMER_GPUS, consumer_pcie_topology

ROWS = [1000, 5000, 200000, 30000]
EBC_PATH = "model.sparse_arch.embedding_bag_collection"
ADAGRAD = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1}


def dlrm() -> DLRMTrain:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=n, feature_names=[f"f{i}"])
        for i, n in enumerate(ROWS)
    ]
    return DLRMTrain(
        DLRM(
            embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
            dense_in_features=13,
            dense_arch_layer_sizes=[32, 16],
            over_arch_layer_sizes=[32, 1],
            dense_device=torch.device("meta"),
        )
    )


def types(plan: ShardingPlan, path: str = EBC_PATH) -> Dict[str, str]:
    return {t: ps.sharding_type for t, ps in plan.plan[path].items()}


def plan_with(
    topology: Topology,
    constraints: Optional[Dict[str, ParameterConstraints]] = None,
    config: Optional[FrugalConfig] = None,
    callbacks: Optional[List[Callable[[List[ShardingOption]], List[ShardingOption]]]] = None,
) -> "tuple[ShardingPlan, FrugalShardingPlanner]":
    planner = FrugalShardingPlanner(
        topology=topology, batch_size=128, constraints=constraints, config=config, callbacks=callbacks
    )
    return planner.plan(dlrm(), [FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD)]), planner


def test_sharders_offer_frugal_and_every_stock_type_on_cpu() -> None:
    ebc = FrugalEmbeddingBagCollectionSharder()
    assert ebc.sharding_types("cpu")[0] == FRUGAL
    assert {"row_wise", "table_row_wise", "grid_shard", "table_wise", "data_parallel"} <= set(ebc.sharding_types("cpu"))
    assert ebc.compute_kernels(FRUGAL, "cpu") == ["fused"]
    assert ebc.compute_kernels("table_wise", "cpu") == ["fused"]
    ec = FrugalEmbeddingCollectionSharder()
    assert set(ec.sharding_types("cpu")) == {FRUGAL, "data_parallel", "table_wise", "column_wise", "row_wise"}


@pytest.mark.parametrize("world", [2, 4])
def test_every_table_goes_frugal_by_default(world: int) -> None:
    plan, planner = plan_with(Topology(world_size=world, compute_device="cpu"))
    params = plan.plan[EBC_PATH]
    assert types(plan) == {f"t{i}": FRUGAL for i in range(len(ROWS))}
    for t, ps in params.items():
        assert ps.compute_kernel == "fused" and ps.ranks == list(range(world))
        shards = ps.sharding_spec.shards  # type: ignore[union-attr]
        assert [(s.shard_offsets[0], s.shard_sizes[0]) for s in shards] == row_blocks(ROWS[int(t[1:])], world)
        assert ps.cache_params.load_factor == FrugalConfig().cache_ratio  # type: ignore[union-attr]
    assert planner.cache_ratio == FrugalConfig().cache_ratio


@pytest.mark.parametrize("stock", ["table_wise", "row_wise", "table_row_wise", "column_wise", "data_parallel"])
def test_constraints_keep_a_table_on_a_stock_type(stock: str) -> None:
    constraints = {"t1": ParameterConstraints(sharding_types=[stock])}
    plan, _ = plan_with(Topology(world_size=2, compute_device="cpu"), constraints)
    assert types(plan) == {"t0": FRUGAL, "t1": stock, "t2": FRUGAL, "t3": FRUGAL}


def test_constraints_without_sharding_types_still_default_to_frugal() -> None:
    constraints = {"t2": ParameterConstraints(pooling_factors=[4.0])}
    plan, _ = plan_with(Topology(world_size=2, compute_device="cpu"), constraints)
    assert types(plan)["t2"] == FRUGAL


def test_cache_ratio_is_sized_from_device_memory() -> None:
    ratios = []
    for hbm in [int(2e6), int(3e6), 16 * 1024**3]:
        _, planner = plan_with(
            Topology(world_size=4, compute_device="cuda", hbm_cap=hbm), config=FrugalConfig(cache_ratio=0.2)
        )
        ratios.append(planner.cache_ratio)
    assert ratios[0] < ratios[1] < 0.2 and ratios[2] == 0.2


def test_cached_rows_fit_in_what_the_topology_leaves() -> None:
    planned: List[List[ShardingOption]] = []  # the final plan, as TorchRec's callbacks see it
    plan_with(
        Topology(world_size=4, compute_device="cuda", hbm_cap=int(2.5e6)),
        config=FrugalConfig(cache_ratio=0.2),
        callbacks=[lambda best: planned.append(best) or best],
    )
    (best,) = planned
    for rank in range(4):
        used = sum(s.storage.hbm for so in best for s in so.shards if s.rank == rank)  # type: ignore[union-attr]
        assert used <= 2.5e6


def test_a_user_cache_ratio_is_kept() -> None:
    from torchrec.distributed.types import CacheParams

    constraints = {"t0": ParameterConstraints(sharding_types=[FRUGAL], cache_params=CacheParams(load_factor=0.01))}
    plan, _ = plan_with(Topology(world_size=2, compute_device="cpu"), constraints)
    assert plan.plan[EBC_PATH]["t0"].cache_params.load_factor == 0.01  # type: ignore[union-attr]
    assert plan.plan[EBC_PATH]["t1"].cache_params.load_factor == FrugalConfig().cache_ratio  # type: ignore[union-attr]


def test_embedding_collection_goes_frugal() -> None:
    ec = EmbeddingCollection(
        tables=[EmbeddingConfig(name=f"t{i}", embedding_dim=8, num_embeddings=n, feature_names=[f"f{i}"]) for i, n in enumerate(ROWS)],
        device=torch.device("meta"),
    )
    plan = FrugalShardingPlanner(topology=Topology(world_size=2, compute_device="cpu")).plan(
        ec, [FrugalEmbeddingCollectionSharder(fused_params=ADAGRAD)]
    )
    assert set(types(plan, "").values()) == {FRUGAL}


def test_torchrec_planner_understands_frugal() -> None:
    """TorchRec's own planner (what DMP builds without a plan) enumerates and places frugal tables."""
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), batch_size=128)
    plan = planner.plan(dlrm(), [FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD)])
    assert set(types(plan).values()) == {FRUGAL}
    forced = EmbeddingShardingPlanner(
        topology=consumer_pcie_topology(4),
        batch_size=128,
        constraints={f"t{i}": ParameterConstraints(sharding_types=[FRUGAL]) for i in range(len(ROWS))},
    ).plan(dlrm(), [FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD)])
    assert set(types(forced).values()) == {FRUGAL}


def test_frugal_generator_for_construct_module_sharding_plan() -> None:
    model = dlrm()
    sharder = FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD)
    ebc = model.model.sparse_arch.embedding_bag_collection
    plan = construct_module_sharding_plan(
        ebc,
        {"t0": frugal(), "t1": frugal(cache_ratio=0.1), "t2": table_wise(rank=1, compute_kernel="fused"), "t3": frugal()},
        sharder=sharder,
        local_size=2,
        world_size=2,
        device_type="cpu",
    )
    assert {t: ps.sharding_type for t, ps in plan.items()} == {"t0": FRUGAL, "t1": FRUGAL, "t2": "table_wise", "t3": FRUGAL}
    assert plan["t0"].cache_params is None and plan["t1"].cache_params.load_factor == 0.1  # type: ignore[union-attr]
    assert [s.placement.device().type for s in plan["t3"].sharding_spec.shards] == ["cpu", "cpu"]  # type: ignore[union-attr]


@pytest.mark.parametrize("gpu", sorted(CONSUMER_GPUS))
def test_consumer_pcie_topology(gpu: str) -> None:
    spec = CONSUMER_GPUS[gpu]
    topo = consumer_pcie_topology(4, gpu=gpu)
    assert topo.compute_device == "cuda" and topo.world_size == 4 and topo.local_world_size == 4
    assert all(d.storage.hbm == spec.hbm_bytes for d in topo.devices)
    pcie = spec.pcie_gb_per_s * 1024**3 / 1000
    assert topo.hbm_to_ddr_mem_bw == pcie
    for kind in CollectiveType:
        assert topo.comms_bandwidths.get_bw(4, 4, kind) == pcie / 2  # device -> host -> device
    nvlink = Topology(world_size=4, compute_device="cuda")
    assert topo.comms_bandwidths.get_bw(4, 4, CollectiveType.ALL_TO_ALL) < nvlink.comms_bandwidths.get_bw(
        4, 4, CollectiveType.ALL_TO_ALL
    ) / 10


def test_consumer_topology_rejects_unknown_gpus_and_feeds_the_planner() -> None:
    with pytest.raises(ValueError, match="a100"):
        consumer_pcie_topology(2, gpu="a100")
    plan, planner = plan_with(consumer_pcie_topology(2, gpu="rtx4090"))
    assert set(types(plan).values()) == {FRUGAL} and planner.cache_ratio == FrugalConfig().cache_ratio


@pytest.mark.parametrize(
    "fused,kind,lr",
    [
        ({}, "sgd", 0.01),
        ({"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.3}, "sgd", 0.3),
        ({"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05, "eps": 1e-6}, "rowwise_adagrad", 0.05),
        # FBGEMM's Adagrad kernel takes no weight decay: accepted without effect, as stock
        ({"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": 0.1, "weight_decay": 0.5}, "adagrad", 0.1),
        ({"optimizer": EmbOptimType.ADAM}, "adam", 0.01),
        (
            {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.2, "eps": 1e-6, "beta1": 0.8, "beta2": 0.9, "weight_decay": 0.5},
            "adam",
            0.2,
        ),
    ],
)
def test_fused_params_map_to_the_engine_optimizer(fused: Dict[str, object], kind: str, lr: float) -> None:
    spec = optimizer_spec(fused, "t0")
    assert (spec.kind, spec.lr) == (kind, lr)
    assert spec.eps == fused.get("eps", 1e-8)
    adam = kind == "adam"  # FBGEMM's defaults where fused_params omit them; only Adam reads the rest
    assert (spec.beta1, spec.beta2) == ((fused.get("beta1", 0.9), fused.get("beta2", 0.999)) if adam else (0.9, 0.999))
    assert spec.weight_decay == (fused.get("weight_decay", 0.0) if adam else 0.0)


@pytest.mark.parametrize(
    "fused",
    [
        {"optimizer": EmbOptimType.PARTIAL_ROWWISE_ADAM},
        {"weight_decay": 0.1},
        {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "weight_decay": 0.1},
        {"optimizer": EmbOptimType.ADAM, "beta2": 1.0},
    ],
)
def test_unsupported_fused_optimizers_are_refused_by_name(fused: Dict[str, object]) -> None:
    with pytest.raises(ValueError, match="table 'tX'"):
        optimizer_spec(fused, "tX")


def test_row_blocks_cover_every_row_once() -> None:
    for rows, world in [(10, 4), (5, 4), (3, 4), (200000, 3)]:
        blocks: List[tuple] = row_blocks(rows, world)
        assert len(blocks) == world and sum(s for _, s in blocks) == rows
        assert all(o + s <= rows for o, s in blocks)
        assert [o for o, s in blocks if s] == sorted(o for o, s in blocks if s)


def test_cache_ratio_cap_comes_from_the_sharder_config_unless_the_planner_has_one() -> None:
    sharder = FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD, config=FrugalConfig(cache_ratio=0.02))
    planner = FrugalShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"))
    planner.plan(dlrm(), [sharder])
    assert planner.cache_ratio == 0.02
    planner = FrugalShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), config=FrugalConfig(cache_ratio=0.03))
    planner.plan(dlrm(), [sharder])
    assert planner.cache_ratio == 0.03


def test_without_sharders_the_planner_uses_the_frugal_ones() -> None:
    plan = FrugalShardingPlanner(topology=Topology(world_size=2, compute_device="cpu")).plan(dlrm())
    assert set(types(plan).values()) == {FRUGAL}


def test_the_lookahead_goes_into_copies_never_into_the_script_s_sharders() -> None:
    from torchrec_frugal.config import FrugalConfig
    from torchrec_frugal.torchrec import FrugalEmbeddingBagCollectionSharder
    from torchrec_frugal.torchrec.fp_embeddingbag import FrugalFeatureProcessedEmbeddingBagCollectionSharder
    from torchrec_frugal.torchrec.planner.planners import with_lookahead

    config = FrugalConfig(lookahead=7)
    ebc = FrugalEmbeddingBagCollectionSharder(config=config)
    for sharder in (ebc, FrugalFeatureProcessedEmbeddingBagCollectionSharder(ebc)):
        out = with_lookahead(sharder, 2)
        assert type(out) is type(sharder) and out is not sharder and out.config.lookahead == 2
        assert sharder.config is config and config.lookahead == 7
    assert with_lookahead(ebc, 7) is ebc and with_lookahead(ebc, None) is ebc


def test_torchrec_prices_a_frugal_shard_with_the_cost_model() -> None:
    """FrugalPerfEvaluator on a hand-computed case: uniform ids over N rows, W ranks, n ids per rank,
    no cache, L = 10 (FrugalConfig's default), dim 16 (64-byte rows, 68 with row-wise state: one
    128-byte line in device memory and in host writes), TorchRec's bandwidths per millisecond."""
    from torchrec.distributed.planner.estimator.types import HardwarePerfConfig, ShardPerfContext

    from torchrec_frugal.torchrec.patches.perf_evaluator import FrugalPerfEvaluator

    N, W, n, dev, link = 1000, 2, 64, 1000.0, 10.0
    ctx = ShardPerfContext(sharding_type="frugal", compute_kernel="fused", hash_size=N // W, emb_dim=16,
                           batch_sizes=[n], num_poolings=[1.0], input_lengths=[1.0], world_size=W,
                           device_bw=dev, hbm_to_ddr_mem_bw=link, caching_ratio=0.0)  # fmt: skip
    perf = FrugalPerfEvaluator().compute_perf(ctx, HardwarePerfConfig())

    def touched(d: float) -> float:
        return 1.0 - (1.0 - 1.0 / N) ** d

    u1, owned = N * touched(n), N * touched(W * n) / W  # a rank's distinct rows; an owner's rows
    u, q = touched(W * n), touched((W - 1) * n)
    inline = N * u * q / W  # rows due at the next step (L >= 1), every row host-resident
    # forward: every distinct row from host (no cache), then the owner's uncached rows with their state
    assert perf.fwd_compute == pytest.approx(u1 * 64 / link + owned * 68 / link)
    assert perf.fwd_comms == 0.0
    # backward: the owner's update in device memory, the rows due next step written to host
    assert perf.bwd_compute == pytest.approx(2 * owned * 128 / dev + inline * 128 / link)
    # gradients: device to host, staged and read through host memory (ids beside), the owned sums back
    assert perf.bwd_comms == pytest.approx((u1 * 64 + 2 * u1 * (64 + 8) + owned * 64) / link)
    cached = FrugalPerfEvaluator().compute_perf(replace(ctx, caching_ratio=0.5), HardwarePerfConfig())
    assert cached.fwd_compute < perf.fwd_compute  # a rank's cached rows come from device memory
