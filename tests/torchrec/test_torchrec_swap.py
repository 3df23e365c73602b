"""The swap takes, however the script plans: a script whose only change is the sharder (and the
pipeline) trains its tables frugal, and equal to stock TorchRec.

Planning (one process, meta models): TorchRec's ``EmbeddingShardingPlanner`` (what
``DistributedModelParallel`` builds when given no plan) given a frugal sharder plans every table
frugal, also where its own estimates prefer a stock type; a user's stock constraint is kept; a
table frugal refuses goes stock with one warning naming it; TorchRec's sharder of feature-processed
collections wrapping ours offers and plans frugal.

Training (2 gloo ranks, one process group): a DLRM in the shape of TorchRec's golden training
script (in-backward row-wise Adagrad, a sharder with quantized-comms codecs, RandomRecDataset)
trained by ``DistributedModelParallel(plan=None)`` and by TorchRec's planner's ``collective_plan``,
each under ``FrugalTrainPipeline``, against stock table_wise under ``TrainPipelineSparseDist`` from
the same initial tables: every loss and final table agree.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import pytest
import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.types import ShardingPlan
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import DataType

from rank_pool import Scenarios, pooled
from torchrec_ranks import full_tables, initial_table, release
from test_torchrec_fp_embeddingbag import FPModel
from torchrec_frugal.config import FrugalConfig
from torchrec_frugal.host.launch import run_ranks
from torchrec_frugal.torchrec import (
    FRUGAL,
    FrugalEmbeddingBagCollectionSharder,
    FrugalFeatureProcessedEmbeddingBagCollectionSharder,
    FrugalShardingPlanner,
    consumer_pcie_topology,
    patches,
)
from torchrec_frugal.torchrec.patches import planner_shims

ROWS = [1000, 3000, 20000, 200000]
DIM = 16
BATCH = 32
STEPS = 12
LR = 0.1
PATH = "model.sparse_arch.embedding_bag_collection"


def dlrm(device: torch.device = torch.device("meta"), fp16_table: Optional[int] = None) -> DLRMTrain:
    tables = [
        EmbeddingBagConfig(
            name=f"t{t}",
            embedding_dim=DIM,
            num_embeddings=n,
            feature_names=[f"f{t}"],
            data_type=DataType.FP16 if t == fp16_table else DataType.FP32,
        )
        for t, n in enumerate(ROWS)
    ]
    return DLRMTrain(
        DLRM(
            embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
            dense_in_features=13,
            dense_arch_layer_sizes=[32, DIM],
            over_arch_layer_sizes=[32, 1],
            dense_device=device,
        )
    )


def kinds(plan: ShardingPlan, path: str = PATH) -> Dict[str, str]:
    return {t: ps.sharding_type for t, ps in plan.plan[path].items()}  # type: ignore[attr-defined]


ADAGRAD = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR}
# NVLink-class bandwidths (TorchRec's default topology): its perf model prefers a stock type there.
CUDA_4 = Topology(world_size=4, compute_device="cuda")


@pytest.mark.parametrize("topology", [Topology(world_size=2, compute_device="cpu"), CUDA_4, consumer_pcie_topology(2)])
def test_torchrec_planner_plans_every_table_of_a_frugal_sharder_frugal(topology: Topology) -> None:
    sharder = FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD)
    plan = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH).plan(dlrm(), [sharder])
    assert kinds(plan) == {f"t{t}": FRUGAL for t in range(len(ROWS))}


def test_without_the_rule_torchrec_s_estimates_would_leave_tables_stock() -> None:
    """What the enumerator shim changes: TorchRec's own choice among the offered types is not frugal."""
    sharder = FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD)
    shim = EmbeddingEnumerator.enumerate
    EmbeddingEnumerator.enumerate = patches.original(next(p for p in planner_shims.PATCHES if p.name == "enumerate"))
    try:
        plan = EmbeddingShardingPlanner(topology=CUDA_4, batch_size=BATCH).plan(dlrm(), [sharder])
    finally:
        EmbeddingEnumerator.enumerate = shim
    assert set(kinds(plan).values()) != {FRUGAL}


def test_a_stock_constraint_is_kept_and_the_rest_go_frugal() -> None:
    constraints = {"t1": ParameterConstraints(sharding_types=["table_wise"]), "t2": ParameterConstraints(pooling_factors=[3.0])}
    planner = EmbeddingShardingPlanner(topology=CUDA_4, batch_size=BATCH, constraints=constraints)
    plan = planner.plan(dlrm(), [FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD)])
    assert kinds(plan) == {"t0": FRUGAL, "t1": "table_wise", "t2": FRUGAL, "t3": FRUGAL}


@pytest.mark.parametrize("planner_kind", ["torchrec", "frugal"])
def test_a_table_frugal_refuses_goes_stock_with_one_warning(planner_kind: str, caplog: pytest.LogCaptureFixture) -> None:
    topology = Topology(world_size=2, compute_device="cpu")
    planner: Any = (
        EmbeddingShardingPlanner(topology=topology, batch_size=BATCH)
        if planner_kind == "torchrec"
        else FrugalShardingPlanner(topology=topology, batch_size=BATCH)
    )
    with caplog.at_level(logging.WARNING, logger="torchrec_frugal"):
        plan = planner.plan(dlrm(fp16_table=2), [FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD)])
    got = kinds(plan)
    assert got["t2"] != FRUGAL and {got[t] for t in ("t0", "t1", "t3")} == {FRUGAL}
    refusals = [r.getMessage() for r in caplog.records if "not frugal" in r.getMessage()]
    assert len(refusals) == 1 and "'t2'" in refusals[0] and "FP32" in refusals[0], refusals


def test_unsupported_fused_params_leave_every_table_stock_with_a_warning_each(caplog: pytest.LogCaptureFixture) -> None:
    sharder = FrugalEmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.PARTIAL_ROWWISE_ADAM})
    with caplog.at_level(logging.WARNING, logger="torchrec_frugal"):
        plan = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), batch_size=BATCH).plan(
            dlrm(), [sharder]
        )
    assert FRUGAL not in kinds(plan).values()
    refusals = [r.getMessage() for r in caplog.records if "not frugal" in r.getMessage()]
    assert sorted(m.split("'")[1] for m in refusals) == [f"t{t}" for t in range(len(ROWS))]


def test_torchrec_s_feature_processed_sharder_wrapping_ours_offers_and_plans_frugal() -> None:
    wrapped = FeatureProcessedEmbeddingBagCollectionSharder(ebc_sharder=FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD))
    assert wrapped.sharding_types("cpu")[0] == FRUGAL and wrapped.compute_kernels(FRUGAL, "cpu") == ["fused"]
    stock = FeatureProcessedEmbeddingBagCollectionSharder(ebc_sharder=EmbeddingBagCollectionSharder())
    assert FRUGAL not in stock.sharding_types("cpu")
    ours = FrugalFeatureProcessedEmbeddingBagCollectionSharder()
    assert ours.sharding_types("cpu").count(FRUGAL) == 1
    for sharder in (wrapped, ours):
        plan = EmbeddingShardingPlanner(topology=CUDA_4, batch_size=BATCH).plan(FPModel(), [sharder])
        assert set(kinds(plan, "fp").values()) == {FRUGAL}


# ---------------------------------------------------------------------------------------------
# Training: the golden script's shape, planned three ways.


def train(how: str) -> Dict[str, Any]:
    """One run: ``how`` is "stock" (table_wise, TrainPipelineSparseDist), "dmp" (frugal sharder,
    DistributedModelParallel(plan=None)) or "torchrec_planner" (frugal sharder, TorchRec's planner)."""
    from torchrec.datasets.random import RandomRecDataset
    from torchrec.distributed import DistributedModelParallel, TrainPipelineSparseDist
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from torchrec_frugal.torchrec import FrugalTrainPipeline

    world = dist.get_world_size()
    torch.manual_seed(0)  # the same dense weights in every run
    model = dlrm(torch.device("cpu"))
    apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": LR})
    plan: Optional[ShardingPlan] = None
    sharder: Any
    if how == "stock":
        sharder = EmbeddingBagCollectionSharder()
        ebc = model.model.sparse_arch.embedding_bag_collection
        gen = {f"t{t}": table_wise(rank=t % world, compute_kernel="fused") for t in range(len(ROWS))}
        plan = ShardingPlan({PATH: construct_module_sharding_plan(ebc, gen, sharder=sharder, local_size=world, world_size=world)})
    else:
        codecs = get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16))
        sharder = FrugalEmbeddingBagCollectionSharder(qcomm_codecs_registry=codecs, config=FrugalConfig(lookahead=3, cache_ratio=0.05))
        if how == "torchrec_planner":
            planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"), batch_size=BATCH)
            plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    sd = dmp.state_dict()
    for t, n in enumerate(ROWS):
        sd[f"{PATH}.embedding_bags.t{t}.weight"] = initial_table(t, n, DIM)
    dmp.load_state_dict(sd)
    dense = KeyedOptimizerWrapper(dict(dmp.named_parameters()), lambda params: torch.optim.Adagrad(params, lr=LR))
    pipeline: Any = (TrainPipelineSparseDist if how == "stock" else FrugalTrainPipeline)(dmp, dense, torch.device("cpu"))
    batches = iter(
        RandomRecDataset(
            keys=[f"f{t}" for t in range(len(ROWS))],
            batch_size=BATCH,
            hash_sizes=ROWS,
            ids_per_feature=2,
            num_dense=13,
            manual_seed=dist.get_rank(),
            num_generated_batches=-1,
            num_batches=STEPS,
        )
    )
    losses: List[float] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        while True:
            try:
                losses.append(pipeline.progress(batches)[0].item())
            except StopIteration:
                break
    frugal_modules = [m for m in dmp.modules() if hasattr(m, "frugal_plan_report")]
    out = {
        "kinds": kinds(dmp.plan),
        "losses": np.array(losses),
        "tables": full_tables(dmp, f"{PATH}.embedding_bags", [(n, DIM) for n in ROWS]),
        "report": frugal_modules[0].frugal_plan_report if frugal_modules else "",
        "stock_warnings": [str(w.message) for w in caught if "no frugal table" in str(w.message)],
    }
    release(dmp)
    return out


def _train(rank: int, world: int, how: str) -> Dict[str, Any]:
    return train(how)


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    yield from pooled(2, {how: (_train, (how,)) for how in ("stock", "dmp", "torchrec_planner")})


@pytest.mark.parametrize("how", ["dmp", "torchrec_planner"])
def test_the_swapped_script_plans_frugal_and_trains_as_stock(world2: Scenarios, how: str) -> None:
    for res in world2:
        assert res[how]["kinds"] == {f"t{t}": FRUGAL for t in range(len(ROWS))}
        assert res["stock"]["kinds"] == {f"t{t}": "table_wise" for t in range(len(ROWS))}
        assert len(res[how]["losses"]) == STEPS
        np.testing.assert_allclose(res[how]["losses"], res["stock"]["losses"], rtol=1e-5)
    for t, (x, y) in enumerate(zip(world2[0][how]["tables"], world2[0]["stock"]["tables"])):
        moved = np.abs(y - initial_table(t, ROWS[t], DIM).numpy()).max()
        assert moved > 1e-3, (t, moved)  # the tables trained
        assert np.abs(x - y).max() <= 1e-4 * moved, (t, np.abs(x - y).max(), moved)


def test_the_plan_report_names_every_table_and_its_cache(world2: Scenarios) -> None:
    report = world2[0]["dmp"]["report"].splitlines()
    assert report[0] == f"torchrec_frugal plan of {PATH}:"
    assert report[1].split() == ["table", "sharding", "rows", "x", "dim", "cached", "rows", "per", "rank", "expected", "hit", "ratio"]
    for t, n in enumerate(ROWS):
        cells = report[2 + t].split()
        # 5% of the rows per rank; no pre-sample was given, so no row is known to be hot
        assert cells[:5] == [f"t{t}", FRUGAL, str(n), "x", str(DIM)] and cells[5] == str(int(0.05 * n)), cells
        assert " ".join(cells[6:]) == "no pre-sample"


def test_frugal_train_pipeline_warns_once_on_a_model_without_frugal_tables(world2: Scenarios) -> None:
    for res in world2:
        assert res["dmp"]["stock_warnings"] == []
    # The stock run used TrainPipelineSparseDist; the warning is checked on FrugalTrainPipeline below.


def _stock_model_under_frugal_pipeline(rank: int, world: int) -> List[str]:
    """Warnings of FrugalTrainPipeline over 4 steps of an all-table_wise model."""
    from torchrec.datasets.random import RandomRecDataset
    from torchrec.distributed import DistributedModelParallel

    from torchrec_frugal.torchrec import FrugalTrainPipeline

    torch.set_num_threads(1)
    model = dlrm(torch.device("cpu"))
    sharder = EmbeddingBagCollectionSharder(fused_params=ADAGRAD)
    dmp = DistributedModelParallel(module=model, device=torch.device("cpu"), sharders=[sharder])
    dense = torch.optim.SGD([p for p in dmp.parameters() if p.requires_grad], lr=LR)
    pipeline = FrugalTrainPipeline(dmp, dense, torch.device("cpu"))
    batches = iter(
        RandomRecDataset(
            keys=[f"f{t}" for t in range(len(ROWS))], batch_size=BATCH, hash_sizes=ROWS, ids_per_feature=1,
            num_dense=13, manual_seed=rank, num_batches=4,
        )
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            pipeline.progress(batches)
    return [str(w.message) for w in caught if "FrugalTrainPipeline" in str(w.message)]


def test_frugal_train_pipeline_on_a_stock_model_warns_once() -> None:
    for got in run_ranks(2, _stock_model_under_frugal_pipeline):
        assert len(got) == 1 and "no frugal table" in got[0], got
