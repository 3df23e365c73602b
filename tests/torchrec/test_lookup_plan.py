"""A batch planned ahead (``FrugalEmbeddingLookup.plan``): its bags laid out sample by sample as
TorchRec's pooled output lists them, and the transposition for the backward taken from the sort
that deduplicated its rows equal to the one sorted afresh (``transpose_bags``), bit for bit: bags
of one id and of many (empty ones included), pooling weights and MEAN, sequence embeddings, and
a table read by two features (whose rows the planner sorts again)."""
from __future__ import annotations

from typing import Iterator, List

import pytest
import torch
from torchrec.modules.embedding_configs import PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_frugal.config import FrugalConfig, OptimizerSpec
from torchrec_frugal.torchrec.embedding_lookup import FrugalEmbeddingLookup, sample_major
from torchrec_frugal.torchrec.row_pooling import transpose_bags
from torchrec_frugal.torchrec.types import FrugalTable

# (table, rows, dim, features, pooling): t0 and t1 share an engine, each read by one feature;
# t2 has an engine of its own and is read by two features.
TABLES = [("t0", 40, 8, ["f0"], PoolingType.SUM), ("t1", 3000, 8, ["f1"], PoolingType.MEAN), ("t2", 70_000, 4, ["f2", "f3"], PoolingType.SUM)]
STRIDE = 64


def sample_major_reference(lengths: List[int], num_features: int, stride: int) -> List[int]:
    starts = [sum(lengths[:k]) for k in range(len(lengths))]
    return [starts[f * stride + b] + j for b in range(stride) for f in range(num_features) for j in range(lengths[f * stride + b])]


@pytest.mark.parametrize("max_len", [0, 1, 4])
def test_sample_major_lists_bags_sample_by_sample(max_len: int) -> None:
    g = torch.Generator().manual_seed(max_len)
    num_features, stride = 3, 5
    lengths = torch.ones(num_features * stride, dtype=torch.int32) if max_len == 1 else torch.randint(0, max_len + 1, (num_features * stride,), generator=g)
    n = int(lengths.sum())
    order, by_sample = sample_major(lengths, num_features, stride, n)
    assert order.tolist() == sample_major_reference(lengths.tolist(), num_features, stride)
    assert by_sample.dtype == torch.int64
    assert by_sample.tolist() == lengths.view(num_features, stride).t().reshape(-1).tolist()


def batches(weighted: bool) -> Iterator[KeyedJaggedTensor]:
    g = torch.Generator().manual_seed(int(weighted))
    keys = [f for _, _, _, fs, _ in TABLES for f in fs]
    rows = [r for _, r, _, fs, _ in TABLES for _ in fs]
    for max_len in (1, 4):
        lengths = torch.ones(len(keys) * STRIDE, dtype=torch.int64) if max_len == 1 else torch.randint(0, max_len + 1, (len(keys) * STRIDE,), generator=g)
        per_key = lengths.view(len(keys), STRIDE).sum(1).tolist()
        values = torch.cat([torch.randint(0, min(r, 30), (n,), generator=g) for r, n in zip(rows, per_key)])
        weights = torch.rand(values.numel(), generator=g) if weighted else None
        yield KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, weights=weights, stride=STRIDE)


@pytest.mark.parametrize("pooled,weighted", [(True, False), (True, True), (False, False)])
def test_planned_transposition_equals_a_fresh_sort(tmp_path, pooled: bool, weighted: bool) -> None:
    tables = [
        FrugalTable(
            name=name, num_embeddings=rows, embedding_dim=dim, feature_names=features,
            pooling=pooling if pooled else PoolingType.NONE, init_fn=torch.nn.init.zeros_,
            optimizer=OptimizerSpec("sgd", lr=0.1), cache_ratio=0.1, presample_counts=None,
        )
        for name, rows, dim, features, pooling in TABLES
    ]
    lookup = FrugalEmbeddingLookup(tables, pooled, FrugalConfig(shm_dir=str(tmp_path)), None, torch.device("cpu"))
    try:
        for features in batches(weighted):
            plan = lookup.plan(features)
            assert len(plan.batches) == 2
            for b in plan.batches:
                fresh = transpose_bags(b.inverse, b.lengths if pooled else None, b.rows.numel(), b.weights)
                assert b.transposed is not None
                assert torch.equal(b.transposed.indices, fresh.indices)
                assert torch.equal(b.transposed.offsets, fresh.offsets)
                assert (b.transposed.weights is None) == (fresh.weights is None)
                if fresh.weights is not None:
                    assert torch.equal(b.transposed.weights, fresh.weights)
            # the layout: group 0's bags sample by sample, each value's row the id it read
            b0, lengths = plan.batches[0], features.lengths()[: 2 * STRIDE]
            values = features.values()[: int(lengths.sum())]
            order = torch.tensor(sample_major_reference(lengths.tolist(), 2, STRIDE), dtype=torch.int64) if pooled else torch.arange(values.numel())
            fused = values + torch.tensor([0, 40]).repeat_interleave(lengths.view(2, STRIDE).sum(1))
            assert torch.equal(b0.rows[b0.inverse], fused[order])
    finally:
        lookup.close()
