"""Frugal sharding inside TorchRec against TorchRec's own sharding (CPU, gloo, 2 and 4 ranks).

TorchRec's DLRM (in DLRMTrain) with 8 tables of 1,000 to 200,000 rows (dim 16) trains 300 steps on
Zipf-skewed ids, each rank on its own batches, from the same initial weights and with the same
fused optimizer (EXACT_SGD, EXACT_ROWWISE_ADAGRAD), once with frugal tables and once with
TorchRec's table_wise and row_wise shardings. Each rank's loss at every step and the final tables
must agree within 1e-4 relative. Also: a plan mixing frugal and table_wise tables, an
EmbeddingCollection model, FrugalTrainPipeline against TrainPipelineSparseDist, RandomRecDataset,
TorchRec's default planner given the frugal sharder, bad inputs, learning-rate changes, and a
checkpoint saved at step k and loaded into fresh processes, which must continue bit-for-bit.

Each world size spawns its ranks once and runs every scenario in them (module-scoped fixtures).
"""
from __future__ import annotations

import gc
import os
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from torchrec_frugal.host.launch import run_ranks

TABLE_ROWS = [1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000]
FEATURES = [f"f{i}" for i in range(len(TABLE_ROWS))]
DIM = 16
BATCH = 32
DENSE_IN = 13
STEPS = 300
LR = 0.05
REL_TOL = 1e-4
LOOKAHEAD = 6
CPU = torch.device("cpu")

# ---------------------------------------------------------------------------------------------
# Data: each rank's batches, Zipf(1.2) ids over a permutation of each table's rows.


class ZipfBatches:
    """Deterministic per-rank batches (torchrec.datasets.utils.Batch) with variable bag sizes."""

    def __init__(self, rank: int, table_rows: List[int] = TABLE_ROWS, seed: int = 0) -> None:
        from torchrec_frugal.workload import ZipfIds

        self.rank = rank
        self.seed = seed
        self.tables = [ZipfIds(n, 1.2, seed * 1000 + t) for t, n in enumerate(table_rows)]
        self.keys = [f"f{t}" for t in range(len(table_rows))]

    def batch(self, step: int) -> Any:
        from torchrec.datasets.utils import Batch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        rng = np.random.default_rng([self.seed, self.rank, step])
        lengths = rng.integers(0, 5, size=(len(self.tables), BATCH))
        values = np.concatenate([t.sample(int(n.sum()), rng) for t, n in zip(self.tables, lengths)])
        return Batch(
            dense_features=torch.from_numpy(rng.standard_normal((BATCH, DENSE_IN)).astype(np.float32)),
            sparse_features=KeyedJaggedTensor.from_lengths_sync(
                keys=self.keys,
                values=torch.from_numpy(values.astype(np.int64)),
                lengths=torch.from_numpy(lengths.reshape(-1).astype(np.int64)),
            ),
            labels=torch.from_numpy(rng.integers(0, 2, BATCH).astype(np.float32)),
        )

    def batches(self, start: int, stop: int) -> Iterator[Any]:
        return (self.batch(s) for s in range(start, stop))


def initial_table(t: int, rows: int, dim: int = DIM) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + t)
    return torch.rand(rows, dim, generator=g) * 0.1 - 0.05


# An EmbeddingBagCollection with what DLRM does not exercise: two embedding dims (two engines), a
# table serving two features, a feature served by two tables, and either MEAN pooling (t1) or
# per-id weights (is_weighted, all SUM). Weighted MEAN is left out on purpose: FBGEMM 1.8's CPU
# kernel divides by the bag size in forward but not in backward, frugal's gradient does both.
# (name, rows, dim, features, mean pooling unless weighted)
VARIANT_TABLES = [("t0", 500, 8, ["f0"], False), ("t1", 800, 16, ["f1", "f2"], True), ("t2", 300, 8, ["f2"], False)]
VARIANT_FEATURES = ["f0", "f1", "f2"]


class VariantBatches:
    """Per-rank batches for the variants model (ids below every serving table's size)."""

    def __init__(self, rank: int, weighted: bool) -> None:
        self.rank = rank
        self.weighted = weighted

    def batch(self, step: int) -> Any:
        from torchrec.datasets.utils import Batch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        rng = np.random.default_rng([7, self.rank, step])
        lengths = rng.integers(0, 5, size=(len(VARIANT_FEATURES), BATCH))
        limits = [500, 800, 300]
        values = np.concatenate([rng.integers(0, lim, int(n.sum())) for lim, n in zip(limits, lengths)])
        return Batch(
            dense_features=torch.from_numpy(rng.standard_normal((BATCH, DENSE_IN)).astype(np.float32)),
            sparse_features=KeyedJaggedTensor.from_lengths_sync(
                keys=VARIANT_FEATURES,
                values=torch.from_numpy(values.astype(np.int64)),
                lengths=torch.from_numpy(lengths.reshape(-1).astype(np.int64)),
                weights=(
                    torch.from_numpy(rng.uniform(0.5, 1.5, values.shape[0]).astype(np.float32)) if self.weighted else None
                ),
            ),
            labels=torch.from_numpy(rng.integers(0, 2, BATCH).astype(np.float32)),
        )

    def batches(self, start: int, stop: int) -> Iterator[Any]:
        return (self.batch(s) for s in range(start, stop))


class VariantsModel(nn.Module):
    def __init__(self, weighted: bool) -> None:
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

        super().__init__()
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=name,
                    embedding_dim=dim,
                    num_embeddings=rows,
                    feature_names=features,
                    pooling=PoolingType.MEAN if mean and not weighted else PoolingType.SUM,
                )
                for name, rows, dim, features, mean in VARIANT_TABLES
            ],
            is_weighted=weighted,
            device=torch.device("meta"),
        )
        self.over = nn.Linear(8 + 16 + 16 + 8 + DENSE_IN, 1)

    def forward(self, batch: Any) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        pooled = self.ebc(batch.sparse_features).to_dict()
        x = torch.cat([pooled[k] for k in sorted(pooled)] + [batch.dense_features], dim=1)
        logits = self.over(x).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


# ---------------------------------------------------------------------------------------------
# Models and sharding set-ups.


class ECModel(nn.Module):
    """A small model over an EmbeddingCollection: per-id embeddings, summed per bag, then linear."""

    def __init__(self, table_rows: List[int]) -> None:
        from torchrec import EmbeddingCollection, EmbeddingConfig

        super().__init__()
        self.keys = [f"f{t}" for t in range(len(table_rows))]
        self.ec = EmbeddingCollection(
            tables=[
                EmbeddingConfig(name=f"t{t}", embedding_dim=DIM, num_embeddings=n, feature_names=[f"f{t}"])
                for t, n in enumerate(table_rows)
            ],
            device=torch.device("meta"),
        )
        self.over = nn.Linear(len(table_rows) * DIM + DENSE_IN, 1)

    def forward(self, batch: Any) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        embs = self.ec(batch.sparse_features)
        pooled = []
        for k in self.keys:
            jt = embs[k]
            values = jt.values()
            bags = torch.repeat_interleave(torch.arange(BATCH, device=values.device), jt.lengths())
            pooled.append(torch.zeros(BATCH, DIM, device=values.device).index_add(0, bags, values))
        logits = self.over(torch.cat(pooled + [batch.dense_features], dim=1)).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


def fused_params(opt: str) -> Dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    kind = {"sgd": EmbOptimType.EXACT_SGD, "adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}[opt]
    return {"optimizer": kind, "learning_rate": LR}


def build(
    world: int,
    sharding: str,
    opt: str,
    model_kind: str = "dlrm",
    table_rows: List[int] = TABLE_ROWS,
    config: Optional[Any] = None,
    device: torch.device = CPU,
    data_parallel_wrapper: Optional[Any] = None,
    fused_extra: Optional[Dict[str, Any]] = None,
) -> Tuple[nn.Module, Any, str]:
    """A DMP-wrapped model on ``device``, its CombinedOptimizer, and the key prefix of its embedding tables.

    sharding: "frugal" (FrugalShardingPlanner), "frugal_nodes" (FrugalShardingPlanner on a topology
    of LOCAL_WORLD_SIZE ranks per node), "default" (DistributedModelParallel's own planner
    given the frugal sharder), "mixed" (FrugalShardingPlanner, half the tables constrained to
    table_wise), "frugal_two_groups" (FrugalShardingPlanner, t0 with its own cache ratio, hence
    its own engine), or through construct_module_sharding_plan a stock type ("table_wise", "row_wise")
    or "frugal_row_wise" (nodes of LOCAL_WORLD_SIZE ranks).
    model_kind: "dlrm" (DLRMTrain), "ec" (ECModel), "variants" or "weighted_variants" (VariantsModel).
    fused_extra: fused_params added to the optimizer's (every sharder's), e.g. a bounds_check_mode.
    """
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import ParameterConstraints, Topology
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from torchrec.distributed.types import CacheParams

    from torchrec_frugal.config import FrugalConfig
    from torchrec_frugal.torchrec import FRUGAL, FrugalEmbeddingBagCollectionSharder, FrugalEmbeddingCollectionSharder
    from torchrec_frugal.torchrec.planner.planners import FrugalShardingPlanner, frugal_row_wise

    torch.manual_seed(0)  # the same dense initial weights in every run
    fp = {**fused_params(opt), **(fused_extra or {})}
    n = len(table_rows)
    if model_kind == "dlrm":
        model: nn.Module = DLRMTrain(
            DLRM(
                embedding_bag_collection=EmbeddingBagCollection(
                    tables=[
                        EmbeddingBagConfig(name=f"t{t}", embedding_dim=DIM, num_embeddings=r, feature_names=[f"f{t}"])
                        for t, r in enumerate(table_rows)
                    ],
                    device=torch.device("meta"),
                ),
                dense_in_features=DENSE_IN,
                dense_arch_layer_sizes=[32, DIM],
                over_arch_layer_sizes=[32, 1],
                dense_device=torch.device("cpu"),
            )
        )
        path, prefix = "model.sparse_arch.embedding_bag_collection", "embedding_bags"
        module = model.model.sparse_arch.embedding_bag_collection
        frugal_sharder: Any = FrugalEmbeddingBagCollectionSharder(
            fused_params=fp, config=config or FrugalConfig(lookahead=LOOKAHEAD, cache_ratio=0.05)
        )
        stock_sharder: Any = EmbeddingBagCollectionSharder(fused_params=fp)
    elif model_kind in ("variants", "weighted_variants"):
        model = VariantsModel(weighted=model_kind == "weighted_variants")
        path, prefix = "ebc", "embedding_bags"
        module = model.ebc
        frugal_sharder = FrugalEmbeddingBagCollectionSharder(
            fused_params=fp, config=config or FrugalConfig(lookahead=LOOKAHEAD, cache_ratio=0.05)
        )
        stock_sharder = EmbeddingBagCollectionSharder(fused_params=fp)
    else:
        model = ECModel(table_rows)
        path, prefix = "ec", "embeddings"
        module = model.ec
        frugal_sharder = FrugalEmbeddingCollectionSharder(
            fused_params=fp, config=config or FrugalConfig(lookahead=LOOKAHEAD, cache_ratio=0.05)
        )
        stock_sharder = EmbeddingCollectionSharder(fused_params=fp)
    names = [t[0] for t in VARIANT_TABLES] if "variants" in model_kind else [f"t{t}" for t in range(n)]

    env = ShardingEnv.from_process_group(dist.GroupMember.WORLD)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if sharding == "frugal_nodes" else world
    topology = Topology(world_size=world, compute_device=device.type, local_world_size=local)
    plan: Optional[ShardingPlan]
    if sharding in ("frugal", "frugal_nodes", "mixed", "frugal_two_groups"):
        constraints = {
            "frugal": None,
            "frugal_nodes": None,
            "mixed": {f"t{t}": ParameterConstraints(sharding_types=["table_wise"]) for t in range(n // 2, n)},
            "frugal_two_groups": {
                "t0": ParameterConstraints(sharding_types=[FRUGAL], cache_params=CacheParams(load_factor=0.01))
            },
        }[sharding]
        planner = FrugalShardingPlanner(topology=topology, batch_size=BATCH, constraints=constraints)
        plan = planner.collective_plan(model, [frugal_sharder], dist.GroupMember.WORLD)
        sharder = planner.sharders()[0]
    elif sharding == "default":
        plan, sharder = None, frugal_sharder
    else:
        gen = {
            "table_wise": lambda t: table_wise(rank=t % world, compute_kernel="fused"),
            "row_wise": lambda t: row_wise(compute_kernel="fused"),
            "frugal_row_wise": lambda t: frugal_row_wise(),
        }[sharding]
        sharder = frugal_sharder if sharding == "frugal_row_wise" else stock_sharder
        plan = ShardingPlan(
            {
                path: construct_module_sharding_plan(
                    module,
                    {name: gen(t) for t, name in enumerate(names)},
                    sharder=sharder,
                    local_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
                    world_size=world,
                    device_type=device.type,
                )
            }
        )
    dmp = DistributedModelParallel(
        model, env=env, device=device, plan=plan, sharders=[sharder], data_parallel_wrapper=data_parallel_wrapper
    )
    sd = dmp.state_dict()
    for t, (name, (rows, dim)) in enumerate(zip(names, table_shapes(model_kind, table_rows))):
        sd[f"{path}.{prefix}.{name}.weight"] = initial_table(t, rows, dim)
    dmp.load_state_dict(sd)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda ps: torch.optim.SGD(ps, lr=LR)
    )
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense]), f"{path}.{prefix}"


def table_shapes(model_kind: str, table_rows: List[int] = TABLE_ROWS) -> List[Tuple[int, int]]:
    if "variants" in model_kind:
        return [(rows, dim) for _, rows, dim, _, _ in VARIANT_TABLES]
    return [(r, DIM) for r in table_rows]


def frugal_lookups(dmp: nn.Module) -> List[Any]:
    """The frugal lookups of every sharded module (a sharded module keeps its lookups in a plain list)."""
    from torchrec_frugal.torchrec.embedding_types import FrugalShardedModuleMixin

    return [lookup for m in dmp.modules() if isinstance(m, FrugalShardedModuleMixin) for lookup in m.frugal_lookups()]


def sharding_types(dmp: nn.Module) -> Dict[str, str]:
    return {t: ps.sharding_type for mp in dmp.plan.plan.values() for t, ps in mp.items()}


def full_tables(dmp: nn.Module, key: str, shapes: List[Tuple[int, int]]) -> List[Optional[np.ndarray]]:
    """Every table t0, t1, ..., whole on rank 0 (collective)."""
    sd = dmp.state_dict()
    out: List[Optional[np.ndarray]] = []
    for t, (rows, dim) in enumerate(shapes):
        full = torch.zeros(rows, dim) if dist.get_rank() == 0 else None
        sd[f"{key}.t{t}.weight"].gather(dst=0, out=full)
        out.append(full.numpy() if full is not None else None)
    return out


def train(
    dmp: nn.Module, opt: Any, batches: Iterator[Any], pipeline: Optional[str] = None, device: torch.device = CPU
) -> List[float]:
    """Per-step losses, from a plain loop or a train pipeline ("frugal", or "sparse_dist": TorchRec's,
    each forward computing its rows), on ``device``."""
    if pipeline is None:
        losses = []
        for batch in batches:
            batch = batch.to(device)
            opt.zero_grad()
            loss, _ = dmp(batch)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    from torchrec_frugal.torchrec import FrugalTrainPipeline

    pipe: Any = FrugalTrainPipeline(dmp, opt, device) if pipeline == "frugal" else TrainPipelineSparseDist(dmp, opt, device)
    losses = []
    while True:
        try:
            out = pipe.progress(batches)
        except StopIteration:
            return losses
        losses.append(out[0].item())


def release(dmp: nn.Module) -> None:
    for lookup in frugal_lookups(dmp):
        lookup.close()
    dist.barrier()
    gc.collect()


# ---------------------------------------------------------------------------------------------
# Scenarios, run in every rank.


def run_training(
    world: int,
    sharding: str,
    opt: str,
    pipeline: Optional[str] = None,
    model_kind: str = "dlrm",
    table_rows: List[int] = TABLE_ROWS,
    steps: int = STEPS,
    data: str = "zipf",
    config: Optional[Any] = None,
    device: str = "cpu",
) -> Dict[str, Any]:
    """One training run: losses, final tables (rank 0), sharding types, and each frugal engine's
    (device, host path)."""
    dev = torch.device(device)
    dmp, optimizer, key = build(world, sharding, opt, model_kind, table_rows, config=config, device=dev)
    if "variants" in model_kind:
        batches: Iterator[Any] = VariantBatches(dist.get_rank(), model_kind == "weighted_variants").batches(0, steps)
    elif data == "zipf":
        batches = ZipfBatches(dist.get_rank(), table_rows).batches(0, steps)
    else:
        from torchrec.datasets.random import RandomRecDataset

        batches = iter(
            RandomRecDataset(
                keys=[f"f{t}" for t in range(len(table_rows))],
                batch_size=BATCH,
                hash_sizes=table_rows,
                ids_per_feature=3,
                num_dense=DENSE_IN,
                manual_seed=dist.get_rank(),
                num_batches=steps,
            )
        )
    losses = train(dmp, optimizer, batches, pipeline, dev)
    result = {
        "losses": np.array(losses),
        "tables": full_tables(dmp, key, table_shapes(model_kind, table_rows)),
        "types": sharding_types(dmp),
        "engines": [(str(g.engine.device), g.engine.host.path) for lookup in frugal_lookups(dmp) for g in lookup.groups],
    }
    release(dmp)
    return result


def run_checks(world: int) -> Dict[str, Any]:
    """Bad inputs and learning-rate changes on an all-frugal DLRM; reports what was seen."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from torchrec_frugal.errors import FrugalInputError
    from torchrec_frugal.torchrec import FrugalShardedEmbeddingBagCollection

    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    # FATAL: a bad id refused (WARNING, the default, trains it as row 0: test_torchrec_bounds_check.py)
    dmp, optimizer, key = build(world, "frugal", "adagrad", fused_extra={"bounds_check_mode": BoundsCheckMode.FATAL})
    ebc = next(m for m in dmp.modules() if isinstance(m, FrugalShardedEmbeddingBagCollection))
    data = ZipfBatches(dist.get_rank())
    seen: Dict[str, Any] = {}

    def snapshot() -> List[np.ndarray]:
        """This rank's blocks of every table, then of every row-wise Adagrad state."""
        model, state = dmp.state_dict(), optimizer.state_dict()["state"]
        weights, momentum = [], []
        for t in range(len(TABLE_ROWS)):
            weights.append(torch.cat([s.tensor for s in model[f"{key}.t{t}.weight"].local_shards()]).numpy())
            st = state[f"{key}.t{t}.weight"][f"t{t}.momentum1"]
            momentum.append(torch.cat([s.tensor for s in st.local_shards()]).numpy())
        return weights + momentum

    def refused(name: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
            seen[name] = None
        except FrugalInputError as e:
            seen[name] = str(e)

    def with_ids(batch: Any, feature: str, bad: int) -> Any:
        kjt = batch.sparse_features
        values = kjt.values().clone()
        start = kjt.offset_per_key()[kjt.keys().index(feature)]
        values[start] = bad
        batch.sparse_features = KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=kjt.lengths())
        return batch

    def step(batch: Any) -> float:
        optimizer.zero_grad()
        loss, _ = dmp(batch)
        loss.backward()
        optimizer.step()
        return loss.item()

    step(data.batch(0))
    before = snapshot()
    refused("out_of_range", lambda: dmp(with_ids(data.batch(1), "f3", TABLE_ROWS[3])))
    refused("negative", lambda: dmp(with_ids(data.batch(1), "f5", -7)))
    good = data.batch(1).sparse_features
    n_last = good.length_per_key()[-1]  # a feature no table serves is ignored, as stock does; one missing is refused
    lacking = KeyedJaggedTensor(
        keys=good.keys()[:-1], values=good.values()[: good.values().numel() - n_last], lengths=good.lengths()[:-BATCH]
    )
    missing = data.batch(1)
    missing.sparse_features = lacking
    refused("missing_feature", lambda: dmp(missing))
    ebc.push_lookahead(data.batch(2).sparse_features)  # announce batch 2, then train batch 1
    refused("lookahead_mismatch", lambda: dmp(data.batch(1)))
    seen["unchanged"] = all(np.array_equal(x, y) for x, y in zip(before, snapshot()))
    seen["trains_after"] = np.isfinite(step(data.batch(2)))  # the announced batch trains

    # A learning rate set through DMP.fused_optimizer's param_groups takes effect.
    for g in dmp.fused_optimizer.param_groups:
        g["lr"] = 0.0
    before = snapshot()
    step(data.batch(3))
    after = snapshot()
    n = len(TABLE_ROWS)
    seen["lr0_weights_unchanged"] = all(np.array_equal(x, y) for x, y in zip(before[:-n], after[:-n]))
    seen["lr0_momentum_changed"] = any(not np.array_equal(x, y) for x, y in zip(before[-n:], after[-n:]))
    for g in dmp.fused_optimizer.param_groups:
        g["lr"] = LR
    step(data.batch(4))
    seen["lr_restored_trains"] = not all(np.array_equal(x, y) for x, y in zip(after[:-n], snapshot()[:-n]))
    seen["dense_optimizer_tables"] = [k for k in optimizer.params if "embedding_bags" in k and k not in dmp.fused_optimizer.params]
    seen["fused_keys"] = sorted(dmp.fused_optimizer.params.keys())

    # FrugalTrainPipeline reads L batches ahead and announces them: after one step, the engines'
    # window holds steps 1..L (room for one more), and L + 1 batches were read.
    from torchrec_frugal.torchrec import FrugalTrainPipeline

    read: List[int] = []

    def source() -> Iterator[Any]:
        for s in range(10, 30):
            read.append(s)
            yield data.batch(s)

    # The forward of an announced batch reuses the rows computed when it was announced (the planner
    # thread also reads one batch beyond the window, and plans it when it gets to it).
    computed: List[int] = []
    for lookup in ebc.frugal_lookups():
        own = lookup.fused_ids  # the ids checked and fused: what planning a batch or computing its rows begins with
        lookup.fused_ids = lambda f, own=own: computed.append(1) or own(f)  # type: ignore[method-assign]
    FrugalTrainPipeline(dmp, optimizer, torch.device("cpu")).progress(source())
    seen["pipeline_read"] = len(read)
    seen["rows_computed_per_lookup"] = len(computed) / len(ebc.frugal_lookups())
    seen["pipeline_capacity"] = ebc.lookahead_capacity()

    # A save hands out views of the shared tables; a load writes each rank's own row block only.
    from torchrec_frugal.torchrec.checkpoint import row_blocks

    engines = ebc.frugal_engines()
    written: List[int] = []
    for eng in engines:
        def spy(parts: Any, orig: Any = eng.write_rows) -> None:
            written.append(sum(int(rows.numel()) for rows, weights, _ in parts if weights is not None))
            orig(parts)

        eng.write_rows = spy  # type: ignore[method-assign]
    sd = dmp.state_dict()
    host = [(e.host_block(0, e.num_rows)[0].data_ptr(), e.num_rows * e.dim * 4) for e in engines]
    shards = [sh.tensor for t in range(len(TABLE_ROWS)) for sh in sd[f"{key}.t{t}.weight"].local_shards()]
    seen["save_shards_are_views"] = all(  # inside a host table, and storage no larger than the shard
        any(p <= x.data_ptr() < p + n for p, n in host) and x.untyped_storage().nbytes() == x.numel() * 4 for x in shards
    )
    last = len(TABLE_ROWS) - 1
    new_table = torch.arange(TABLE_ROWS[last] * DIM, dtype=torch.float32).reshape(-1, DIM) / 1e6
    sd[f"{key}.t{last}.weight"] = new_table  # a whole tensor, the same on every rank
    dmp.load_state_dict(sd)
    rank = dist.get_rank()
    seen["load_rows_written"] = sum(written)
    seen["load_rows_own_blocks"] = sum(row_blocks(n, world)[rank][1] for n in TABLE_ROWS)
    final = full_tables(dmp, key, table_shapes("dlrm"))[last]
    seen["loaded_whole_table"] = bool(np.array_equal(final, new_table.numpy())) if rank == 0 else True
    release(dmp)
    return seen


def run_checkpoint(
    rank: int, world: int, phase: str, directory: str, k: int, steps: int, device: str = "cpu", sharding: str = "frugal"
) -> Dict[str, Any]:
    """phase "save": train steps [0, k) and save with torch.distributed.checkpoint;
    phase "resume": fresh model, load, train steps [k, steps); phase "whole": train [0, steps).
    Frugal tables on ``device``; ``sharding`` as for :func:`build` ("mixed": frugal and table_wise)."""
    import torch.distributed.checkpoint as dcp

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dmp, optimizer, key = build(world, sharding, "adagrad", device=dev)
    data = ZipfBatches(dist.get_rank())
    result: Dict[str, Any] = {}
    if phase == "whole":
        result["losses"] = np.array(train(dmp, optimizer, data.batches(0, steps), pipeline="frugal", device=dev))
        result["tables"] = full_tables(dmp, key, table_shapes("dlrm"))
    elif phase == "save":
        result["losses"] = np.array(train(dmp, optimizer, data.batches(0, k), pipeline="frugal", device=dev))
        dcp.save({"model": dmp.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=directory)
    else:
        state = {"model": dmp.state_dict(), "optim": optimizer.state_dict()}
        dcp.load(state, checkpoint_id=directory)
        dmp.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        result["losses"] = np.array(train(dmp, optimizer, data.batches(k, steps), pipeline="frugal", device=dev))
        result["tables"] = full_tables(dmp, key, table_shapes("dlrm"))
    release(dmp)
    return result


SCENARIOS_2: Dict[str, Dict[str, Any]] = {
    "frugal_sgd": dict(sharding="frugal", opt="sgd"),
    "tw_sgd": dict(sharding="table_wise", opt="sgd"),
    "rw_sgd": dict(sharding="row_wise", opt="sgd"),
    "frugal_adagrad": dict(sharding="frugal", opt="adagrad"),
    "frugal_adagrad_pipeline": dict(sharding="frugal", opt="adagrad", pipeline="frugal"),
    "tw_adagrad": dict(sharding="table_wise", opt="adagrad"),
    "rw_adagrad": dict(sharding="row_wise", opt="adagrad"),
    "mixed_adagrad": dict(sharding="mixed", opt="adagrad"),
    "default_planner_adagrad": dict(sharding="default", opt="adagrad"),
    "ec_frugal_adagrad": dict(sharding="frugal", opt="adagrad", model_kind="ec", table_rows=TABLE_ROWS[::2]),
    "ec_tw_adagrad": dict(sharding="table_wise", opt="adagrad", model_kind="ec", table_rows=TABLE_ROWS[::2]),
    "ec_frugal_two_groups": dict(
        sharding="frugal_two_groups", opt="adagrad", model_kind="ec", table_rows=TABLE_ROWS[::2], steps=100
    ),
    "ec_tw_100": dict(sharding="table_wise", opt="adagrad", model_kind="ec", table_rows=TABLE_ROWS[::2], steps=100),
    "variants_frugal": dict(sharding="frugal", opt="adagrad", model_kind="variants", steps=100),
    "variants_tw": dict(sharding="table_wise", opt="adagrad", model_kind="variants", steps=100),
    "weighted_variants_frugal": dict(sharding="frugal", opt="adagrad", model_kind="weighted_variants", steps=100),
    "weighted_variants_tw": dict(sharding="table_wise", opt="adagrad", model_kind="weighted_variants", steps=100),
    "random_frugal_pipeline": dict(sharding="frugal", opt="adagrad", pipeline="frugal", steps=60, data="random"),
    "random_tw_pipeline": dict(sharding="table_wise", opt="adagrad", pipeline="sparse_dist", steps=60, data="random"),
}

SCENARIOS_4: Dict[str, Dict[str, Any]] = {
    "frugal_sgd": dict(sharding="frugal", opt="sgd", pipeline="frugal"),
    # Frugal tables through TorchRec's own pipeline: no plans, no lookahead.
    "frugal_sgd_inline": dict(sharding="frugal", opt="sgd", pipeline="sparse_dist"),
    "tw_sgd": dict(sharding="table_wise", opt="sgd"),
    "rw_sgd": dict(sharding="row_wise", opt="sgd"),
    "frugal_adagrad": dict(sharding="frugal", opt="adagrad"),
    "tw_adagrad": dict(sharding="table_wise", opt="adagrad"),
    "rw_adagrad": dict(sharding="row_wise", opt="adagrad"),
}


def _all_scenarios(rank: int, world: int, scenarios: Dict[str, Dict[str, Any]], checks: bool) -> Dict[str, Any]:
    out = {name: run_training(world, **kw) for name, kw in scenarios.items()}
    if checks:
        out["checks"] = run_checks(world)
    return out


@pytest.fixture(scope="module")
def world2() -> List[Dict[str, Any]]:
    return run_ranks(2, _all_scenarios, SCENARIOS_2, True)


@pytest.fixture(scope="module")
def world4() -> List[Dict[str, Any]]:
    return run_ranks(4, _all_scenarios, SCENARIOS_4, False)


# ---------------------------------------------------------------------------------------------
# Assertions.


def assert_same_training(results: List[Dict[str, Any]], a: str, b: str) -> None:
    """Loss of every rank at every step, and every final table, within REL_TOL relative."""
    for rank, res in enumerate(results):
        la, lb = res[a]["losses"], res[b]["losses"]
        assert la.shape == lb.shape and la.size > 0
        rel = np.abs(la - lb) / np.abs(lb)
        assert rel.max() <= REL_TOL, f"rank {rank} {a} vs {b}: step {rel.argmax()} loss rel diff {rel.max():.3g}"
    for t, (x, y) in enumerate(zip(results[0][a]["tables"], results[0][b]["tables"])):
        rel = np.abs(x - y).max() / np.abs(y).max()
        assert rel <= REL_TOL, f"{a} vs {b}: table t{t} rel diff {rel:.3g}"


@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
@pytest.mark.parametrize("stock", ["tw", "rw"])
def test_dlrm_frugal_matches_stock_2_ranks(world2: List[Dict[str, Any]], opt: str, stock: str) -> None:
    assert set(world2[0][f"frugal_{opt}"]["types"].values()) == {"frugal"}
    assert_same_training(world2, f"frugal_{opt}", f"{stock}_{opt}")


@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
@pytest.mark.parametrize("stock", ["tw", "rw"])
def test_dlrm_frugal_matches_stock_4_ranks(world4: List[Dict[str, Any]], opt: str, stock: str) -> None:
    assert_same_training(world4, f"frugal_{opt}", f"{stock}_{opt}")


def test_planned_steps_train_bit_for_bit_as_inline_ones_on_4_ranks(world4: List[Dict[str, Any]]) -> None:
    """Batches planned on the planner thread and updates on the exchange worker, against each
    forward computing its rows and the update inside backward: the same losses and tables, bit for bit."""
    for res in world4:
        assert np.array_equal(res["frugal_sgd"]["losses"], res["frugal_sgd_inline"]["losses"])
    for x, y in zip(world4[0]["frugal_sgd"]["tables"], world4[0]["frugal_sgd_inline"]["tables"]):
        assert np.array_equal(x, y)


def test_frugal_train_pipeline_matches_plain_loop(world2: List[Dict[str, Any]]) -> None:
    assert_same_training(world2, "frugal_adagrad_pipeline", "tw_adagrad")
    assert_same_training(world2, "frugal_adagrad_pipeline", "frugal_adagrad")


def test_mixed_frugal_and_table_wise_plan(world2: List[Dict[str, Any]]) -> None:
    types = world2[0]["mixed_adagrad"]["types"]
    n = len(TABLE_ROWS)
    assert [types[f"t{t}"] for t in range(n)] == ["frugal"] * (n // 2) + ["table_wise"] * (n - n // 2)
    assert_same_training(world2, "mixed_adagrad", "tw_adagrad")


def test_default_planner_with_frugal_sharder(world2: List[Dict[str, Any]]) -> None:
    """DistributedModelParallel(plan=None) plans with TorchRec's planner; the shims plan every table of
    the frugal sharder frugal."""
    assert set(world2[0]["default_planner_adagrad"]["types"].values()) == {"frugal"}
    assert_same_training(world2, "default_planner_adagrad", "tw_adagrad")


def test_embedding_collection_frugal_matches_table_wise(world2: List[Dict[str, Any]]) -> None:
    assert_same_training(world2, "ec_frugal_adagrad", "ec_tw_adagrad")


def test_engine_groups_pooling_modes_weights_and_shared_features(world2: List[Dict[str, Any]]) -> None:
    """Two dims (two engines), MEAN pooling, weighted ids, a table with two features, a shared feature."""
    assert_same_training(world2, "variants_frugal", "variants_tw")
    assert_same_training(world2, "weighted_variants_frugal", "weighted_variants_tw")
    assert_same_training(world2, "ec_frugal_two_groups", "ec_tw_100")


def test_random_rec_dataset_with_pipelines(world2: List[Dict[str, Any]]) -> None:
    assert_same_training(world2, "random_frugal_pipeline", "random_tw_pipeline")


def test_bad_inputs_are_refused_and_change_nothing(world2: List[Dict[str, Any]]) -> None:
    for seen in (r["checks"] for r in world2):
        assert seen["out_of_range"] is not None and "'f3'" in seen["out_of_range"] and "'t3'" in seen["out_of_range"]
        assert f"id {TABLE_ROWS[3]}" in seen["out_of_range"]
        assert seen["negative"] is not None and "'f5'" in seen["negative"] and "-7" in seen["negative"]
        missing = f"'f{len(TABLE_ROWS) - 1}'"
        assert seen["missing_feature"] is not None and "lacks feature" in seen["missing_feature"] and missing in seen["missing_feature"]
        assert seen["lookahead_mismatch"] is not None and "lookahead" in seen["lookahead_mismatch"]
        assert "'t" in seen["lookahead_mismatch"]
        assert seen["unchanged"] and seen["trains_after"]


def test_checkpoint_save_is_views_and_load_writes_own_blocks(world2: List[Dict[str, Any]]) -> None:
    """Saving copies no table; loading writes exactly this rank's row block of every table (no
    all-gather of whole tables), and a whole tensor loaded on every rank lands whole."""
    for r, out in enumerate(world2):
        c = out["checks"]
        assert c["save_shards_are_views"], r
        assert c["load_rows_written"] == c["load_rows_own_blocks"] < sum(TABLE_ROWS), (r, c)
        assert c["loaded_whole_table"], r


def test_learning_rate_through_param_groups(world2: List[Dict[str, Any]]) -> None:
    for seen in (r["checks"] for r in world2):
        assert seen["lr0_weights_unchanged"] and seen["lr0_momentum_changed"] and seen["lr_restored_trains"]
        assert seen["dense_optimizer_tables"] == []
        assert seen["fused_keys"] == [
            f"model.sparse_arch.embedding_bag_collection.embedding_bags.t{t}.weight" for t in range(len(TABLE_ROWS))
        ]


def test_pipeline_reads_and_announces_lookahead_batches(world2: List[Dict[str, Any]]) -> None:
    for seen in (r["checks"] for r in world2):
        assert seen["pipeline_read"] == LOOKAHEAD + 2
        # once per batch planned (the last one read may not be yet), not again for the step that trained batch 0
        assert LOOKAHEAD + 1 <= seen["rows_computed_per_lookup"] <= LOOKAHEAD + 2
        assert seen["pipeline_capacity"] == 1


def test_checkpoint_resumes_bit_for_bit(world2: List[Dict[str, Any]]) -> None:
    """Save at step k with torch.distributed.checkpoint, load into fresh processes, continue."""
    k = STEPS // 2
    with tempfile.TemporaryDirectory() as directory:
        saved = run_ranks(2, run_checkpoint, "save", directory, k, STEPS)
        resumed = run_ranks(2, run_checkpoint, "resume", directory, k, STEPS)
    for rank in range(2):
        whole = world2[rank]["frugal_adagrad_pipeline"]["losses"]
        assert np.array_equal(saved[rank]["losses"], whole[:k])
        assert np.array_equal(resumed[rank]["losses"], whole[k:])
    for x, y in zip(resumed[0]["tables"], world2[0]["frugal_adagrad_pipeline"]["tables"]):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("saved_as, resumed_as", [("frugal", "row_wise"), ("table_wise", "frugal")])
def test_a_checkpoint_resumes_under_another_sharding(saved_as: str, resumed_as: str) -> None:
    """A checkpoint is TorchRec's: saved under frugal, it resumes under stock row_wise (and a
    table_wise one under frugal), weights and row-wise Adagrad state resharded by
    torch.distributed.checkpoint; the run continues like the uninterrupted one (1e-4 relative:
    FBGEMM's kernels against the engine's)."""
    k, steps = 15, 30
    with tempfile.TemporaryDirectory() as directory:
        whole = run_ranks(2, run_checkpoint, "whole", directory, k, steps, "cpu", saved_as)
        run_ranks(2, run_checkpoint, "save", directory, k, steps, "cpu", saved_as)
        resumed = run_ranks(2, run_checkpoint, "resume", directory, k, steps, "cpu", resumed_as)
    for rank in range(2):
        np.testing.assert_allclose(resumed[rank]["losses"], whole[rank]["losses"][k:], rtol=REL_TOL)
    for t, (x, y) in enumerate(zip(resumed[0]["tables"], whole[0]["tables"])):
        np.testing.assert_allclose(x, y, rtol=REL_TOL, atol=1e-6, err_msg=f"table t{t}")


def test_a_mixed_plan_resumes_bit_for_bit() -> None:
    """Frugal and table_wise tables in one plan (fused row-wise Adagrad, FBGEMM's state for the
    stock ones, the engines' for the frugal ones) save and load through one checkpoint: the
    resumed run continues the uninterrupted one bit for bit, losses and every table."""
    k, steps = 15, 30
    with tempfile.TemporaryDirectory() as directory:
        whole = run_ranks(2, run_checkpoint, "whole", directory, k, steps, "cpu", "mixed")
        saved = run_ranks(2, run_checkpoint, "save", directory, k, steps, "cpu", "mixed")
        resumed = run_ranks(2, run_checkpoint, "resume", directory, k, steps, "cpu", "mixed")
    for rank in range(2):
        assert np.array_equal(saved[rank]["losses"], whole[rank]["losses"][:k])
        assert np.array_equal(resumed[rank]["losses"], whole[rank]["losses"][k:])
    moved = 0
    for t, (x, y) in enumerate(zip(resumed[0]["tables"], whole[0]["tables"])):
        assert np.array_equal(x, y), f"table t{t}"
        moved += int(not np.array_equal(x, initial_table(t, x.shape[0])))
    assert moved == len(TABLE_ROWS)  # every table trained, frugal and table_wise alike
