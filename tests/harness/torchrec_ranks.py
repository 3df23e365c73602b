"""The TorchRec harness of the multi-process tests: DLRM, EmbeddingCollection and variant
models with frugal or stock tables, their Zipf batches, building them through a planner, training
them step by step, and comparing two runs (losses and tables within ``REL_TOL``).
"""
from __future__ import annotations

import gc
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn



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


class ZipfBatches:
    """Deterministic per-rank batches (torchrec.datasets.utils.Batch) with variable bag sizes."""

    def __init__(self, rank: int, table_rows: List[int] = TABLE_ROWS, seed: int = 0) -> None:
        from torchrec_frugal.synthetic_ids import ZipfIds

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


def assert_same_training(results: Sequence[Mapping[str, Any]], a: str, b: str) -> None:
    """Loss of every rank at every step, and every final table, within REL_TOL relative."""
    for rank, res in enumerate(results):
        la, lb = res[a]["losses"], res[b]["losses"]
        assert la.shape == lb.shape and la.size > 0
        rel = np.abs(la - lb) / np.abs(lb)
        assert rel.max() <= REL_TOL, f"rank {rank} {a} vs {b}: step {rel.argmax()} loss rel diff {rel.max():.3g}"
    for t, (x, y) in enumerate(zip(results[0][a]["tables"], results[0][b]["tables"])):
        rel = np.abs(x - y).max() / np.abs(y).max()
        assert rel <= REL_TOL, f"{a} vs {b}: table t{t} rel diff {rel:.3g}"
