"""Our calls into TorchRec's planner warn of nothing: the consumer topology is built by
TopologyFactory, and FrugalShardingPlanner's default storage reservation passes the dense
estimate TorchRec asks for, reserving what TorchRec's default reserves (plans unchanged)."""
from __future__ import annotations

import logging
import warnings

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.models.dlrm import DLRM, DLRMTrain

from torchrec_frugal.torchrec import FrugalEmbeddingBagCollectionSharder, FrugalShardingPlanner
from torchrec_frugal.torchrec.planner.storage_reservations import DenseEstimateStorageReservation, dense_tensor_estimate
from torchrec_frugal.torchrec.planner.topology import consumer_pcie_topology

ADAGRAD = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1}
WORRIES = ("topology", "storagereservation", "dense_tensor_estimate", "dense tensor")


def dlrm(dense_device: str = "cpu") -> DLRMTrain:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=n, feature_names=[f"f{i}"])
        for i, n in enumerate([1000, 5000, 200000])
    ]
    return DLRMTrain(
        DLRM(
            embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
            dense_in_features=13,
            dense_arch_layer_sizes=[32, 16],
            over_arch_layer_sizes=[32, 1],
            dense_device=torch.device(dense_device),
        )
    )


def worrying(records, messages) -> list:
    texts = [str(w.message) for w in messages] + [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    return [t for t in texts if any(word in t.lower() for word in WORRIES)]


@pytest.mark.parametrize("compute_device", ["cuda", "cpu"])
def test_consumer_topology_and_planning_warn_nothing(caplog, compute_device: str) -> None:
    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        topo = consumer_pcie_topology(2, gpu="rtx3090", compute_device=compute_device)
        planner = FrugalShardingPlanner(topology=topo, batch_size=128)
        plan = planner.plan(dlrm(), [FrugalEmbeddingBagCollectionSharder(fused_params=ADAGRAD)])
    assert plan.plan
    assert worrying(caplog.records, caught) == []


def test_the_reservation_plans_what_torchrecs_default_plans() -> None:
    """Same plan and reserved storage as TorchRec's default ``HeuristicalStorageReservation(0.15)``,
    whose dense size TorchRec measures itself; only the warnings go."""
    topo = consumer_pcie_topology(2, gpu="rtx3080")
    sharders = [EmbeddingBagCollectionSharder(fused_params=ADAGRAD)]
    ours = DenseEstimateStorageReservation()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        default = HeuristicalStorageReservation(percentage=0.15)
    plans, storage = [], []
    for reservation in (ours, default):
        planner = EmbeddingShardingPlanner(topology=topo, batch_size=512, storage_reservation=reservation)
        plans.append(str(planner.plan(dlrm(), sharders)))
        reserved = reservation.last_reserved_topology
        assert reserved is not None
        storage.append([d.storage for d in reserved.devices])
    assert plans[0] == plans[1] and storage[0] == storage[1]


def test_dense_estimate_is_none_in_a_dry_run() -> None:
    """Dense parameters on the meta device: no estimate, so TorchRec's dry-run warning (then true) stays."""
    sharders = [EmbeddingBagCollectionSharder()]
    assert dense_tensor_estimate(dlrm("meta"), sharders) is None
    model = dlrm()
    params = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embedding_bag" not in n)
    buffers = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if "embedding_bag" not in n)
    assert dense_tensor_estimate(model, sharders) == round(6.0 * params + buffers)  # as TorchRec measures it
