"""One sharded collection called twice before backward, as stock TorchRec allows (CPU, gloo, 2 ranks).

Two towers share an EmbeddingBagCollection: the model pools the batch's ids and a second set of
ids (the same features, other rows) through it, then backward runs once. Stock's fused optimizer
applies each call's gradients as its own update, in backward's order; frugal tables do the same
(the second call reads after flushing every pending write, the second update runs in a step of
its own). Also: a forward whose loss is dropped before the next training step (an eval in train
mode), and a state_dict between a forward and its backward. Plain loops, the variants model
(MEAN pooling, a table serving two features, two dims), SGD and row-wise Adagrad: losses and
tables against stock table_wise, and the update of the second call shown to matter.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import torchrec_ranks as base
from rank_pool import Scenarios, pooled
from torchrec_ranks import VariantBatches, VariantsModel, build, full_tables, initial_table, release, table_shapes

STEPS = 12
LOOPS = ("two_towers", "dropped_forward", "state_dict_between")


def other_tower(kjt: Any) -> Any:
    """The second tower's ids: the same features and bags, other rows of the same tables."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    values = (kjt.values() * 7 + 3) % 300  # below every serving table's size
    return KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=kjt.lengths(), weights=kjt.weights_or_none())


class TwoTowerModel(VariantsModel):
    """The variants model whose collection is called twice per forward (query and item towers)."""

    def __init__(self, weighted: bool) -> None:
        super().__init__(weighted)
        self.over = nn.Linear(2 * (8 + 16 + 16 + 8) + base.DENSE_IN, 1)

    def forward(self, batch: Any) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        query = self.ebc(batch.sparse_features).to_dict()
        item = self.ebc(other_tower(batch.sparse_features)).to_dict()
        x = torch.cat([query[k] for k in sorted(query)] + [item[k] for k in sorted(item)] + [batch.dense_features], dim=1)
        logits = self.over(x).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


def train(sharding: str, opt: str, loop: str) -> Dict[str, Any]:
    base.VariantsModel = TwoTowerModel if loop == "two_towers" else VariantsModel  # type: ignore[misc]
    try:
        dmp, optimizer, key = build(dist.get_world_size(), sharding, opt, "variants")
    finally:
        base.VariantsModel = VariantsModel  # type: ignore[misc]
    data = VariantBatches(dist.get_rank(), weighted=False)
    losses: List[float] = []
    for s in range(STEPS):
        if loop == "dropped_forward" and s % 3 == 1:
            dmp(data.batch(500 + s))  # a forward whose loss nobody backwards
        optimizer.zero_grad()
        loss, _ = dmp(data.batch(s))
        if loop == "state_dict_between" and s % 3 == 2:
            dmp.state_dict()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    out = {"losses": np.array(losses), "tables": full_tables(dmp, key, table_shapes("variants"))}
    release(dmp)
    return out


def _train(rank: int, world: int, sharding: str, opt: str, loop: str) -> Dict[str, Any]:
    return train(sharding, opt, loop)


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    yield from pooled(2, {
        (loop, sharding, opt): (_train, (sharding, opt, loop))
        for loop in LOOPS
        for opt in ("sgd", "adagrad")
        for sharding in ("frugal", "table_wise")
        if loop == "two_towers" or opt == "adagrad"
    })


@pytest.mark.parametrize("loop, opt", [("two_towers", "sgd"), ("two_towers", "adagrad"), ("dropped_forward", "adagrad"), ("state_dict_between", "adagrad")])
def test_a_collection_called_again_before_backward_trains_as_stock(world2: Scenarios, loop: str, opt: str) -> None:
    for res in world2:
        frugal, stock = res[(loop, "frugal", opt)], res[(loop, "table_wise", opt)]
        assert frugal["losses"].shape == (STEPS,)
        np.testing.assert_allclose(frugal["losses"], stock["losses"], rtol=1e-5, atol=0)
    frugal, stock = world2[0][(loop, "frugal", opt)], world2[0][(loop, "table_wise", opt)]
    for t, (a, b) in enumerate(zip(frugal["tables"], stock["tables"])):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-6, err_msg=f"table {t}")
        assert not np.array_equal(a, initial_table(t, *table_shapes("variants")[t]).numpy())  # trained


def test_the_second_call_is_trained(world2: Scenarios) -> None:
    """The rows only the second tower reads move: its update is applied, not dropped."""
    one, two = world2[0][("dropped_forward", "frugal", "adagrad")], world2[0][("two_towers", "frugal", "adagrad")]
    assert any(not np.allclose(a, b, atol=1e-4) for a, b in zip(one["tables"], two["tables"]))
