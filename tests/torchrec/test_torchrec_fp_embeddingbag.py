"""FeatureProcessedEmbeddingBagCollection (position-weighted features) with frugal tables: the
frugal sharder's wrapper planned by FrugalShardingPlanner, and TorchRec's own wrapper around the
frugal sharder planned by DistributedModelParallel, are planned "frugal" and train as TorchRec's
own sharder does with table_wise tables (2 gloo ranks, row-wise Adagrad)."""
from __future__ import annotations

from typing import Any, Dict, Iterator, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from rank_pool import Scenarios, pooled
from torchrec_ranks import full_tables, initial_table, release

ROWS = [400, 700]
DIM = 8
BATCH = 16
STEPS = 10
MAX_LENGTH = 4
LR = 0.05


class FPModel(nn.Module):
    """Position-weighted bags of two tables, then a linear head."""

    def __init__(self) -> None:
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.modules.feature_processor_ import PositionWeightedModule
        from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

        super().__init__()
        ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name=f"t{t}", embedding_dim=DIM, num_embeddings=n, feature_names=[f"f{t}"])
                for t, n in enumerate(ROWS)
            ],
            is_weighted=True,
            device=torch.device("meta"),
        )
        processors = {f"f{t}": PositionWeightedModule(max_feature_length=MAX_LENGTH) for t in range(len(ROWS))}
        self.fp = FeatureProcessedEmbeddingBagCollection(ebc, processors)
        self.over = nn.Linear(len(ROWS) * DIM, 1)

    def forward(self, features: Any, labels: torch.Tensor) -> torch.Tensor:
        logits = self.over(self.fp(features).values()).squeeze(1)
        return nn.functional.binary_cross_entropy_with_logits(logits, labels)


def batch(rank: int, step: int) -> Tuple[Any, torch.Tensor]:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(1000 * rank + step)
    lengths = torch.randint(0, MAX_LENGTH + 1, (len(ROWS) * BATCH,), generator=gen)
    per_feature = lengths.view(len(ROWS), BATCH).sum(1).tolist()
    values = torch.cat([torch.randint(0, n, (k,), generator=gen) for n, k in zip(ROWS, per_feature)])
    labels = torch.randint(0, 2, (BATCH,), generator=gen).float()
    return KeyedJaggedTensor(keys=[f"f{t}" for t in range(len(ROWS))], values=values, lengths=lengths), labels


def train(sharding: str) -> Dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
    from torchrec.distributed.planner import Topology
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingPlan
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from torchrec_frugal.config import FrugalConfig
    from torchrec_frugal.torchrec import (
        FrugalEmbeddingBagCollectionSharder,
        FrugalFeatureProcessedEmbeddingBagCollectionSharder,
        FrugalShardingPlanner,
    )

    torch.manual_seed(0)
    model = FPModel()
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR}
    world = dist.get_world_size()
    if sharding == "frugal":
        inner = FrugalEmbeddingBagCollectionSharder(fused_params=fused, config=FrugalConfig(lookahead=0, cache_ratio=0.1))
        sharder: Any = FrugalFeatureProcessedEmbeddingBagCollectionSharder(inner)
        planner = FrugalShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"), batch_size=BATCH)
        plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    elif sharding == "wrapped":  # TorchRec's own sharder wrapping ours, planned by DistributedModelParallel
        inner = FrugalEmbeddingBagCollectionSharder(fused_params=fused, config=FrugalConfig(lookahead=0, cache_ratio=0.1))
        sharder = FeatureProcessedEmbeddingBagCollectionSharder(ebc_sharder=inner)
        plan = None
    else:
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

        sharder = FeatureProcessedEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder(fused_params=fused))
        gen = {f"t{t}": table_wise(rank=t % world, compute_kernel="fused") for t in range(len(ROWS))}
        plan = ShardingPlan({"fp": construct_module_sharding_plan(model.fp, gen, sharder=sharder, local_size=world, world_size=world)})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    kinds = sorted({ps.sharding_type for ps in dmp.plan.plan["fp"].values()})  # type: ignore[attr-defined]
    key = "fp._embedding_bag_collection.embedding_bags"
    sd = dmp.state_dict()
    for t, n in enumerate(ROWS):  # both start from the same tables
        sd[f"{key}.t{t}.weight"] = initial_table(t, n, DIM)
    dmp.load_state_dict(sd)
    dense = torch.optim.SGD([p for _, p in in_backward_optimizer_filter(dmp.named_parameters())], lr=LR)
    losses = []
    for s in range(STEPS):
        features, labels = batch(dist.get_rank(), s)
        dense.zero_grad()
        loss = dmp(features, labels)
        loss.backward()
        dense.step()
        losses.append(loss.item())
    out = {"kinds": kinds, "losses": np.array(losses), "tables": full_tables(dmp, key, [(n, DIM) for n in ROWS])}
    release(dmp)
    return out


def _train(rank: int, world: int, sharding: str) -> Dict[str, Any]:
    return train(sharding)


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    yield from pooled(2, {s: (_train, (s,)) for s in ("frugal", "wrapped", "table_wise")})


@pytest.mark.parametrize("how", ["frugal", "wrapped"])
def test_planned_frugal_and_trained_as_stock(world2: Scenarios, how: str) -> None:
    """``frugal``: our sharder, FrugalShardingPlanner; ``wrapped``: TorchRec's sharder wrapping ours,
    DistributedModelParallel(plan=None)."""
    for res in world2:
        assert res[how]["kinds"] == ["frugal"] and res["table_wise"]["kinds"] == ["table_wise"]
        np.testing.assert_allclose(res[how]["losses"], res["table_wise"]["losses"], rtol=1e-5)
    for t, (x, y) in enumerate(zip(world2[0][how]["tables"], world2[0]["table_wise"]["tables"])):
        start = initial_table(t, ROWS[t], DIM).numpy()
        moved = np.abs(y - start).max()
        assert moved > 1e-3, (t, moved)  # the tables trained, and the position weights weighed in
        assert np.abs(x - y).max() <= 1e-4 * moved, (t, np.abs(x - y).max(), moved)
