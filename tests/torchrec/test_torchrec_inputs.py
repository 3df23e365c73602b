"""The input check of a frugal sharded module (input dist, lookahead and planned batches alike):
what stock TorchRec ignores is ignored, what frugal tables cannot train is refused by name."""
from __future__ import annotations

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_frugal.errors import FrugalInputError
from torchrec_frugal.torchrec.embedding_types import check_features

SERVED = ["f0", "f1"]


def kjt(keys: list, **kw: object) -> KeyedJaggedTensor:
    n = 2 * len(keys)
    return KeyedJaggedTensor(keys=keys, values=torch.arange(n), lengths=torch.ones(n, dtype=torch.int64), **kw)


def test_a_feature_no_table_serves_is_ignored() -> None:
    check_features(kjt(["extra", "f0", "f1"]), SERVED, "ShardedEBC")


def test_a_missing_feature_is_named() -> None:
    with pytest.raises(FrugalInputError, match=r"ShardedEBC: the input lacks feature\(s\) \['f1'\]"):
        check_features(kjt(["f0"]), SERVED, "ShardedEBC")


def test_variable_batch_size_per_feature_is_refused_naming_vbe() -> None:
    vbe = KeyedJaggedTensor(
        keys=SERVED, values=torch.arange(5), lengths=torch.ones(5, dtype=torch.int64), stride_per_key_per_rank=[[2], [3]]
    )
    with pytest.raises(FrugalInputError, match=r"ShardedEBC: variable batch size per feature \(VBE.*\[2, 3\]"):
        check_features(vbe, SERVED, "ShardedEBC")
