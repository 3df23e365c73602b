"""fused_params under the frugal sharding against stock TorchRec (CPU, gloo, 2 ranks).

The rule: what stock TorchRec does with a fused_params key, frugal tables do the same, or the key
is refused when the sharder shards (and when FrugalShardingPlanner plans), naming the key, its
value and the table (docs/torchrec.md, "fused_params"). Checked here, each frugal run against
TorchRec's own sharding of the same model from the same weights (losses at every step, pooled
outputs, final tables):

- gradient_clipping / max_gradient with EXACT_SGD and EXACT_ROWWISE_ADAGRAD, against table_wise
  (MEAN bags, a table with two features) and row_wise (weighted bags), with a max_gradient that
  bites: the stock run without clipping differs by far more than the tolerance;
- output_dtype FP16 against table_wise's FP16 (EmbeddingBagCollection and EmbeddingCollection,
  with clipping on), and frugal_row_wise's against row_wise's on 2 simulated nodes; BF16, which
  FBGEMM's CPU kernels do not output (stock fails at its first forward), against table_wise FP32
  whose model rounds the pooled embeddings to BF16, which is what FBGEMM's CUDA kernel returns;
- refusals: at shard time (DistributedModelParallel) and plan time, for the sharder's keys, an
  in-backward optimizer's, and the plan's per-table output_dtype.

The ranks are spawned once per layout (a module-scoped pool each: one node, two nodes); each test
runs the scenarios it reads. Each key's status and the planner's refusals are checked in this process.
"""
from __future__ import annotations

import os
import traceback
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from rank_pool import Scenarios, pooled
from torchrec_ranks import (
    BATCH,
    DENSE_IN,
    DIM,
    VARIANT_TABLES,
    VariantBatches,
    VariantsModel,
    ZipfBatches,
    full_tables,
    initial_table,
    release,
    table_shapes,
)

STEPS = 12
LR = 0.05
# Bites: stock without clipping ends 4.3 (SGD), 0.96 and 0.74 (row-wise Adagrad) of its updates away.
MAX_GRADIENT = 2e-4
REL_TOL = 1e-4  # FBGEMM's kernels against the engine's, as in tests/torchrec/test_torchrec_distributed.py
# A 16-bit output can round one unit apart where sums were taken in another order (measured: 1e-5).
HALF_REL_TOL = 1e-3
EC_ROWS = [300, 500]


def fused(opt: str, **extra: Any) -> Dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    kind = {"sgd": EmbOptimType.EXACT_SGD, "adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}[opt]
    return {"optimizer": kind, "learning_rate": LR, **extra}


def clipped(opt: str, **extra: Any) -> Dict[str, Any]:
    return fused(opt, gradient_clipping=True, max_gradient=MAX_GRADIENT, **extra)


class PooledModel(VariantsModel):
    """The variants model (two dims, MEAN or weighted bags, a table with two features), keeping the
    pooled embeddings of its first forward; ``cast`` rounds them to a dtype first (the stock
    reference of an output dtype FBGEMM's CPU kernels lack); ``data_type``: that of the tables' weights."""

    def __init__(self, weighted: bool, cast: Optional[torch.dtype] = None, data_type: Optional[Any] = None) -> None:
        from dataclasses import replace

        from torchrec import EmbeddingBagCollection

        super().__init__(weighted)
        if data_type is not None:  # the tables' weights in another data type
            configs = [replace(c, data_type=data_type) for c in self.ebc.embedding_bag_configs()]
            self.ebc = EmbeddingBagCollection(tables=configs, is_weighted=weighted, device=torch.device("meta"))
        self.cast = cast
        self.first: Optional[torch.Tensor] = None

    def forward(self, batch: Any) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        by_key = self.ebc(batch.sparse_features).to_dict()  # in key order: stock orders by shard
        pooled = torch.cat([by_key[k] for k in sorted(by_key)], dim=1)
        pooled = pooled if self.cast is None else pooled.to(self.cast)
        if self.first is None:
            self.first = pooled.detach().clone()
        logits = self.over(torch.cat([pooled, batch.dense_features], dim=1)).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


class SequenceModel(nn.Module):
    """An EmbeddingCollection, its per-id embeddings summed per bag in fp32, then linear; keeps the
    embeddings of its first forward."""

    def __init__(self) -> None:
        from torchrec import EmbeddingCollection, EmbeddingConfig

        super().__init__()
        self.ec = EmbeddingCollection(
            tables=[
                EmbeddingConfig(name=f"t{t}", embedding_dim=DIM, num_embeddings=n, feature_names=[f"f{t}"])
                for t, n in enumerate(EC_ROWS)
            ],
            device=torch.device("meta"),
        )
        self.over = nn.Linear(len(EC_ROWS) * DIM + DENSE_IN, 1)
        self.first: Optional[torch.Tensor] = None

    def forward(self, batch: Any) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        embs = self.ec(batch.sparse_features)
        if self.first is None:
            self.first = torch.cat([embs[f"f{t}"].values().detach() for t in range(len(EC_ROWS))])
        pooled = []
        for t in range(len(EC_ROWS)):
            jt = embs[f"f{t}"]
            bags = torch.repeat_interleave(torch.arange(BATCH), jt.lengths())
            pooled.append(torch.zeros(BATCH, DIM).index_add(0, bags, jt.values().float()))
        logits = self.over(torch.cat(pooled + [batch.dense_features], dim=1)).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


def build(
    sharding: str,
    fused_params: Dict[str, Any],
    model_kind: str,
    cast: Optional[torch.dtype] = None,
    table_output_dtype: Optional[Dict[str, Any]] = None,
    in_backward: Optional[Dict[str, Any]] = None,
    data_type: Optional[Any] = None,
) -> Tuple[nn.Module, Any, str]:
    """A DMP-wrapped model, its CombinedOptimizer and its tables' key prefix.

    sharding: "frugal" or "frugal_row_wise" (their plan generators), "planner"
    (FrugalShardingPlanner.collective_plan; "planner_only_frugal": every table constrained to frugal), or TorchRec's "table_wise" or "row_wise" through its
    own sharder. model_kind: "variants", "weighted_variants" (PooledModel) or "ec" (SequenceModel).
    table_output_dtype: per table, the plan's ParameterSharding.output_dtype. in_backward: the
    kwargs of an SGD that apply_optimizer_in_backward gives table t1 of a pooled model. data_type:
    that of a pooled model's tables' weights.
    """
    from dataclasses import replace

    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import Topology
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from torchrec_frugal.config import FrugalConfig
    from torchrec_frugal.torchrec import (
        FrugalEmbeddingBagCollectionSharder,
        FrugalEmbeddingCollectionSharder,
        FrugalShardingPlanner,
        frugal,
        frugal_row_wise,
    )

    torch.manual_seed(0)  # the same dense initial weights in every run
    config = FrugalConfig(lookahead=2, cache_ratio=0.05)
    model: nn.Module
    if model_kind == "ec":
        model = SequenceModel()
        path, prefix, module, names = "ec", "embeddings", model.ec, [f"t{t}" for t in range(len(EC_ROWS))]
        shapes = [(r, DIM) for r in EC_ROWS]
        sharder: Any = (
            EmbeddingCollectionSharder(fused_params=fused_params)
            if sharding in ("table_wise", "row_wise")
            else FrugalEmbeddingCollectionSharder(fused_params=fused_params, config=config)
        )
    else:
        model = PooledModel(model_kind == "weighted_variants", cast, data_type)
        path, prefix, module, names = "ebc", "embedding_bags", model.ebc, [t[0] for t in VARIANT_TABLES]
        if in_backward is not None:
            apply_optimizer_in_backward(torch.optim.SGD, [model.ebc.embedding_bags["t1"].weight], in_backward)
        shapes = table_shapes(model_kind)
        sharder = (
            EmbeddingBagCollectionSharder(fused_params=fused_params)
            if sharding in ("table_wise", "row_wise")
            else FrugalEmbeddingBagCollectionSharder(fused_params=fused_params, config=config)
        )
    world = dist.get_world_size()
    if sharding in ("planner", "planner_only_frugal"):
        from torchrec.distributed.planner import ParameterConstraints

        only = {n: ParameterConstraints(sharding_types=["frugal"]) for n in names} if sharding.endswith("frugal") else None
        topology = Topology(world_size=world, compute_device="cpu")
        planner = FrugalShardingPlanner(topology=topology, batch_size=BATCH, constraints=only)
        plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    else:
        gen = {
            "frugal": lambda t: frugal(),
            "frugal_row_wise": lambda t: frugal_row_wise(),
            "table_wise": lambda t: table_wise(rank=t % world, compute_kernel="fused"),
            "row_wise": lambda t: row_wise(compute_kernel="fused"),
        }[sharding]
        module_plan = construct_module_sharding_plan(
            module,
            {name: gen(t) for t, name in enumerate(names)},
            sharder=sharder,
            local_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
            world_size=world,
            device_type="cpu",
        )
        for name, dtype in (table_output_dtype or {}).items():
            module_plan[name] = replace(module_plan[name], output_dtype=dtype)
        plan = ShardingPlan({path: module_plan})
    env = ShardingEnv.from_process_group(dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, env=env, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    sd = dmp.state_dict()
    for t, (name, (rows, dim)) in enumerate(zip(names, shapes)):
        sd[f"{path}.{prefix}.{name}.weight"] = initial_table(t, rows, dim)
    dmp.load_state_dict(sd)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda ps: torch.optim.SGD(ps, lr=LR)
    )
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense]), f"{path}.{prefix}"


def first_output(dmp: nn.Module) -> torch.Tensor:
    model = dmp.module
    assert model.first is not None
    return model.first


def with_unused_feature(batch: Any) -> Any:
    """``batch`` whose KJT also carries a feature no table serves (first, so the served ones move)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = batch.sparse_features
    stride = kjt.stride()
    lengths = torch.full((stride,), 2, dtype=kjt.lengths().dtype)
    unused = torch.arange(2 * stride, dtype=kjt.values().dtype) + 10**9  # out of every table's range
    batch.sparse_features = KeyedJaggedTensor(
        keys=["unused"] + kjt.keys(),
        values=torch.cat([unused, kjt.values()]),
        lengths=torch.cat([lengths, kjt.lengths()]),
        stride=stride,
    )
    return batch


def run_training(
    sharding: str, fused_params: Dict[str, Any], model_kind: str, cast: Optional[torch.dtype] = None,
    unused_feature: bool = False,
) -> Dict[str, Any]:
    """Losses per step, the first step's embeddings (dtype and values) and the final tables (rank 0)."""
    dmp, optimizer, key = build(sharding, fused_params, model_kind, cast)
    rank = dist.get_rank()
    batches: Iterator[Any]
    if model_kind == "ec":
        batches = ZipfBatches(rank, EC_ROWS).batches(0, STEPS)
        shapes = [(r, DIM) for r in EC_ROWS]
    else:
        batches = VariantBatches(rank, model_kind == "weighted_variants").batches(0, STEPS)
        shapes = table_shapes(model_kind)
    losses = []
    for batch in batches:
        if unused_feature:
            batch = with_unused_feature(batch)
        optimizer.zero_grad()
        loss, _ = dmp(batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    first = first_output(dmp)
    result = {
        "losses": np.array(losses),
        "dtype": str(first.dtype),
        "first": first.float().numpy(),
        "tables": full_tables(dmp, key, shapes),
    }
    release(dmp)
    return result


def refusal(fn: Callable[[], Any]) -> Optional[Tuple[str, str]]:
    """The message of the ValueError ``fn`` raises and where: "plan" (inside collective_plan),
    "shard" (inside a sharder's shard), else "elsewhere"; None if it raises none."""
    try:
        fn()
    except ValueError as e:
        frames = {f.name for f in traceback.extract_tb(e.__traceback__)}
        return str(e), "plan" if "collective_plan" in frames else "shard" if "shard" in frames else "elsewhere"
    return None


def refusal_cases() -> Dict[str, Callable[[], Any]]:
    """What DistributedModelParallel (shard time) and FrugalShardingPlanner.collective_plan (plan
    time) are given that frugal tables do not honour, by case: each builds, to be refused."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from torchrec.modules.embedding_configs import DataType

    cases: Dict[str, Callable[[], Any]] = {
        "shard_max_norm": lambda: build("frugal", fused("adagrad", max_norm=1.0), "variants"),
        "shard_int8_output": lambda: build("frugal", fused("sgd", output_dtype=SparseType.INT8), "variants"),
        "shard_mixed_output": lambda: build(
            "frugal", fused("sgd"), "variants", table_output_dtype={"t2": SparseType.FP16}
        ),
        "shard_ec_unknown_key": lambda: build("frugal", fused("sgd", lr=0.1), "ec"),
        "shard_in_backward_weight_decay": lambda: build(
            "frugal", fused("sgd"), "variants", in_backward={"lr": LR, "weight_decay": 0.01}
        ),
        "shard_fp16_weights": lambda: build("frugal", fused("sgd"), "variants", data_type=DataType.FP16),
        "plan_weight_decay_mode": lambda: build(
            "planner_only_frugal", fused("adagrad", weight_decay_mode=2), "weighted_variants"
        ),
    }
    return cases


def _scenarios() -> Dict[str, Tuple[str, Dict[str, Any], str, Optional[torch.dtype]]]:
    from fbgemm_gpu.split_embedding_configs import SparseType

    return {
        # gradient clipping: table_wise (MEAN bags), row_wise (weighted bags)
        "clip_sgd_frugal": ("planner", clipped("sgd"), "variants", None),
        "clip_sgd_tw": ("table_wise", clipped("sgd"), "variants", None),
        "sgd_tw": ("table_wise", fused("sgd"), "variants", None),
        "clip_adagrad_frugal": ("frugal", clipped("adagrad"), "variants", None),
        "clip_adagrad_tw": ("table_wise", clipped("adagrad"), "variants", None),
        "adagrad_tw": ("table_wise", fused("adagrad"), "variants", None),
        "clip_adagrad_weighted_frugal": ("frugal", clipped("adagrad"), "weighted_variants", None),
        "clip_adagrad_weighted_rw": ("row_wise", clipped("adagrad"), "weighted_variants", None),
        "adagrad_weighted_rw": ("row_wise", fused("adagrad"), "weighted_variants", None),
        # output dtypes
        "fp16_frugal": ("frugal", clipped("adagrad", output_dtype=SparseType.FP16), "variants", None),
        "fp16_tw": ("table_wise", clipped("adagrad", output_dtype=SparseType.FP16), "variants", None),
        "bf16_frugal": ("frugal", fused("sgd", output_dtype=SparseType.BF16), "weighted_variants", None),
        "bf16_cast_tw": ("table_wise", fused("sgd"), "weighted_variants", torch.bfloat16),
        "ec_fp16_frugal": ("frugal", clipped("sgd", output_dtype=SparseType.FP16), "ec", None),
        "ec_fp16_tw": ("table_wise", clipped("sgd", output_dtype=SparseType.FP16), "ec", None),
    }


def _training(rank: int, world: int, *args: Any) -> Dict[str, Any]:
    return run_training(*args)


def _refusal(rank: int, world: int, case: str) -> Optional[Tuple[str, str]]:
    return refusal(refusal_cases()[case])


def _unused_feature(rank: int, world: int, sharding: str) -> Dict[str, Any]:
    """A KJT with a feature no table serves."""
    return run_training(sharding, fused("adagrad"), "variants", unused_feature=True)


def _row_wise(rank: int, world: int, sharding: str) -> Dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import SparseType

    return run_training(sharding, clipped("adagrad", output_dtype=SparseType.FP16), "weighted_variants")


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    yield from pooled(2, {
        **{name: (_training, args) for name, args in _scenarios().items()},
        **{f"refusal_{case}": (_refusal, (case,)) for case, _, _ in REFUSALS},
        **{f"unused_feature_{sharding}": (_unused_feature, (sharding,)) for sharding in ("frugal", "table_wise")},
    })


@pytest.fixture(scope="module")
def nodes2() -> Iterator[Scenarios]:
    """2 ranks as 2 nodes of one rank: frugal_row_wise's output dist divides the gradient by the
    nodes, its engine by the node's ranks."""
    yield from pooled(2, {name: (_row_wise, (name,)) for name in ("frugal_row_wise", "row_wise")}, nodes=2)


# ---------------------------------------------------------------------------------------------
# Assertions.


def differences(results: Sequence[Mapping[str, Any]], a: str, b: str) -> Tuple[float, float]:
    """Largest relative difference of the losses (every rank, every step), and largest difference
    of the final tables relative to the largest change run ``b`` made to each table."""
    loss = max(float((np.abs(r[a]["losses"] - r[b]["losses"]) / np.abs(r[b]["losses"])).max()) for r in results)
    update = max(
        float(np.abs(x - y).max() / np.abs(y - initial_table(t, *y.shape).numpy()).max())
        for t, (x, y) in enumerate(zip(results[0][a]["tables"], results[0][b]["tables"]))
    )
    return loss, update


def assert_same_training(results: Sequence[Mapping[str, Any]], a: str, b: str, tol: float = REL_TOL) -> None:
    loss, update = differences(results, a, b)
    assert loss <= tol and update <= tol, f"{a} vs {b}: losses {loss:.3g}, tables {update:.3g} of the updates, relative"


@pytest.mark.parametrize(
    "frugal, stock, unclipped",
    [
        ("clip_sgd_frugal", "clip_sgd_tw", "sgd_tw"),
        ("clip_adagrad_frugal", "clip_adagrad_tw", "adagrad_tw"),
        ("clip_adagrad_weighted_frugal", "clip_adagrad_weighted_rw", "adagrad_weighted_rw"),
    ],
)
def test_gradient_clipping_matches_stock(world2: Scenarios, frugal: str, stock: str, unclipped: str) -> None:
    """FBGEMM clamps its output's gradient per element (a bag's, before weights and MEAN's 1/L);
    the frugal sharding trains the same, and the clamp bites: without it stock trains otherwise."""
    assert_same_training(world2, frugal, stock)
    _, update = differences(world2, unclipped, stock)
    assert update > 0.1, f"max_gradient={MAX_GRADIENT} does not bite ({unclipped} vs {stock}: {update:.3g})"


def test_a_feature_no_table_serves_is_ignored_as_stock_ignores_it(world2: Scenarios) -> None:
    assert_same_training(world2, "unused_feature_frugal", "unused_feature_table_wise")
    assert_same_training(world2, "unused_feature_frugal", "adagrad_tw")  # as if the feature were not there


def test_fp16_output_matches_stock(world2: Scenarios) -> None:
    for r in world2:
        assert r["fp16_frugal"]["dtype"] == r["fp16_tw"]["dtype"] == "torch.float16"
        np.testing.assert_allclose(r["fp16_frugal"]["first"], r["fp16_tw"]["first"], rtol=1e-3, atol=1e-6)
    assert_same_training(world2, "fp16_frugal", "fp16_tw", HALF_REL_TOL)


def test_bf16_output_is_the_fp32_output_rounded(world2: Scenarios) -> None:
    """FBGEMM's CPU kernels have no BF16 output; its CUDA kernel rounds the pooled sums, as the
    reference model does to stock FP32 output here."""
    for r in world2:
        assert r["bf16_frugal"]["dtype"] == r["bf16_cast_tw"]["dtype"] == "torch.bfloat16"
        np.testing.assert_allclose(r["bf16_frugal"]["first"], r["bf16_cast_tw"]["first"], rtol=8e-3, atol=1e-6)
    assert_same_training(world2, "bf16_frugal", "bf16_cast_tw", HALF_REL_TOL)


def test_embedding_collection_fp16_output_and_clipping_match_stock(world2: Scenarios) -> None:
    for r in world2:
        assert r["ec_fp16_frugal"]["dtype"] == r["ec_fp16_tw"]["dtype"] == "torch.float16"
        np.testing.assert_allclose(r["ec_fp16_frugal"]["first"], r["ec_fp16_tw"]["first"], rtol=1e-3, atol=1e-6)
    assert_same_training(world2, "ec_fp16_frugal", "ec_fp16_tw", HALF_REL_TOL)


def test_frugal_row_wise_fp16_output_and_clipping_match_row_wise(nodes2: Scenarios) -> None:
    for r in nodes2:
        assert r["frugal_row_wise"]["dtype"] == r["row_wise"]["dtype"] == "torch.float16"
        np.testing.assert_allclose(r["frugal_row_wise"]["first"], r["row_wise"]["first"], rtol=1e-3, atol=1e-6)
    assert_same_training(nodes2, "frugal_row_wise", "row_wise", HALF_REL_TOL)


REFUSALS = [  # (case of refusal_cases, where it must be refused, what the message must name)
    ("shard_max_norm", "shard", ["'max_norm'", "1.0", "table 't0'"]),
    ("shard_int8_output", "shard", ["'output_dtype'", "INT8", "table 't0'"]),
    ("shard_mixed_output", "shard", ["table 't2'", "output_dtype", "table 't0'"]),
    ("shard_ec_unknown_key", "shard", ["'lr'", "0.1", "table 't0'"]),
    ("shard_in_backward_weight_decay", "shard", ["weight_decay", "table 't1'"]),
    ("shard_fp16_weights", "shard", ["FP32", "table 't0'"]),
    ("plan_weight_decay_mode", "plan", ["'weight_decay_mode'", "2", "table 't0'"]),
]


@pytest.mark.parametrize("case, stage, words", REFUSALS, ids=[case for case, _, _ in REFUSALS])
def test_unhonoured_fused_params_are_refused_by_name(
    world2: Scenarios, case: str, stage: str, words: List[str]
) -> None:
    """Refused on every rank, when DistributedModelParallel shards or the planner plans."""
    for r in world2:
        seen = r[f"refusal_{case}"]
        assert seen is not None, case
        message, where = seen
        assert where == stage and all(w in message for w in words), (where, message)


# ---------------------------------------------------------------------------------------------
# In one process: each key's status, and the planner's refusals (plan() needs no process group).


def small_ebc(data_types: Sequence[Any] = ()) -> nn.Module:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=f"t{t}", embedding_dim=DIM, num_embeddings=1000, feature_names=[f"f{t}"], **kw)
            for t, kw in enumerate([{"data_type": d} for d in data_types] or [{}, {}])
        ],
        device=torch.device("meta"),
    )


def plan_small(
    fused_params: Dict[str, Any], constraints: Optional[Dict[str, Any]] = None, data_types: Sequence[Any] = ()
) -> Any:
    from torchrec.distributed.planner import Topology

    from torchrec_frugal.torchrec import FrugalEmbeddingBagCollectionSharder, FrugalShardingPlanner

    planner = FrugalShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), constraints=constraints)
    return planner.plan(small_ebc(data_types), [FrugalEmbeddingBagCollectionSharder(fused_params=fused_params)])


def test_the_planner_plans_a_table_of_fp16_weights_stock() -> None:
    """Free, the table of FP16 weights goes to a stock type (the frugal sharder refuses it) and the
    FP32 one to frugal."""
    from torchrec.modules.embedding_configs import DataType

    plan = plan_small(fused("sgd"), data_types=[DataType.FP16, DataType.FP32])
    kinds = {name: ps.sharding_type for name, ps in plan.plan[""].items()}
    assert kinds["t1"] == "frugal" and kinds["t0"] not in ("frugal", "frugal_row_wise"), kinds


def test_each_key_is_honoured_accepted_or_refused() -> None:
    """Every key of the table in docs/torchrec.md: honoured keys map onto the engine, keys without effect are
    accepted with any value, keys accepted only when off are refused when on, others are refused."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

    from torchrec_frugal.torchrec.fused_params import OFF_ONLY, WITHOUT_EFFECT, frugal_fused_params

    params = frugal_fused_params(clipped("adagrad", eps=1e-6, output_dtype=SparseType.BF16), "t0")
    assert (params.optimizer.kind, params.optimizer.lr, params.optimizer.eps) == ("rowwise_adagrad", LR, 1e-6)
    assert (params.output_dtype, params.max_gradient) == (torch.bfloat16, MAX_GRADIENT)
    assert frugal_fused_params({"gradient_clipping": True}, "t0").max_gradient == 1.0  # FBGEMM's default
    assert frugal_fused_params({"gradient_clipping": False, "max_gradient": -1.0}, "t0").max_gradient is None
    for key in WITHOUT_EFFECT:
        frugal_fused_params({key: object()}, "t0")
    for key in OFF_ONLY:
        frugal_fused_params({key: None}, "t0")
        with pytest.raises(ValueError, match=f"table 't0'.*'{key}'=1"):
            frugal_fused_params({key: 1}, "t0")
    frugal_fused_params({"weight_decay_mode": WeightDecayMode.NONE, "max_norm": 0.0}, "t0")
    # Every mode is honoured (tests/torchrec/test_torchrec_bounds_check.py): V2_* as the first version's, the
    # key unset as FBGEMM's default WARNING.
    assert frugal_fused_params({}, "t0").bounds_check == "WARNING"
    for mode in BoundsCheckMode:
        expected = mode.name[3:] if mode.name.startswith("V2_") else mode.name
        assert frugal_fused_params({"bounds_check_mode": mode}, "t0").bounds_check == expected, mode
    refused = [
        ({"bounds_check_mode": "SOMETIMES"}, "'bounds_check_mode'='SOMETIMES'"),
        ({"bounds_check_mode": 1}, "'bounds_check_mode'=1"),
        ({"weight_decay_mode": WeightDecayMode.DECOUPLE}, "'weight_decay_mode'=<WeightDecayMode.DECOUPLE"),
        ({"output_dtype": SparseType.INT8}, "'output_dtype'=<SparseType.INT8"),
        ({"gradient_clipping": 1}, "'gradient_clipping'=1"),
        ({"gradient_clipping": True, "max_gradient": -0.5}, "'max_gradient'=-0.5"),
        ({"weights_precision": SparseType.FP16}, "'weights_precision'"),
        ({"lr": 0.1}, "'lr'=0.1"),
        ({"weight_decay": 0.1}, "weight_decay"),  # refused as before
        ({"optimizer": EmbOptimType.LAMB}, "LAMB|lamb"),
        ({"optimizer": EmbOptimType.ADAM, "beta1": 1.5}, "beta1"),
    ]
    for fused_params, words in refused:
        with pytest.raises(ValueError, match="table 'tX'") as e:
            frugal_fused_params(fused_params, "tX")
        assert any(w in str(e.value) for w in words.split("|")), str(e.value)


def test_the_planner_refuses_what_frugal_tables_do_not_honour(caplog: pytest.LogCaptureFixture) -> None:
    """A free table the frugal sharder would refuse goes to TorchRec's best stock type, with one log
    line naming the table and the reason; constrained to frugal it is refused (a key, a per-table
    output dtype that differs from the other tables'); the same keys on tables constrained to a
    stock type are TorchRec's business."""
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.modules.embedding_configs import DataType

    with caplog.at_level("WARNING", logger="torchrec_frugal.torchrec.planner.planners"):
        plan = plan_small(fused("adagrad", max_norm=0.5))
    assert all(ps.sharding_type not in ("frugal", "frugal_row_wise") for ps in plan.plan[""].values())
    lines = [r.getMessage() for r in caplog.records if "not frugal" in r.getMessage()]
    assert len(lines) == 2 and all("'max_norm'=0.5" in line for line in lines), lines
    assert {line.split("'")[1] for line in lines} == {"t0", "t1"}
    only_frugal = {f"t{t}": ParameterConstraints(sharding_types=["frugal"]) for t in range(2)}
    with pytest.raises(ValueError, match="table 't0'.*'max_norm'=0.5"):
        plan_small(fused("adagrad", max_norm=0.5), only_frugal)
    with pytest.raises(ValueError, match="table 't1'.*output_dtype.*table 't0'"):
        plan_small(fused("sgd"), {"t1": ParameterConstraints(output_dtype=DataType.FP16)})
    stock = {f"t{t}": ParameterConstraints(sharding_types=["table_wise"]) for t in range(2)}
    plan = plan_small(fused("adagrad", max_norm=0.5), stock)
    assert {ps.sharding_type for ps in plan.plan[""].values()} == {"table_wise"}
    plan = plan_small(clipped("sgd", output_dtype=DataType.FP16, cache_load_factor=0.2, prefetch_pipeline=True))
    assert {ps.sharding_type for ps in plan.plan[""].values()} == {"frugal"}
