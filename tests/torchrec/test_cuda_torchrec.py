"""TorchRec with frugal tables on CUDA: 2 and 4 ranks sharing GPU 0 (gloo) against TorchRec on CPU.

The model, data, initial tables and tolerance of tests/torchrec/test_torchrec_distributed.py: TorchRec's DLRM
with 8 tables, Zipf ids, each rank its own batches. In the same processes every rank trains the
model twice: with frugal tables planned by FrugalShardingPlanner and served from cuda:0 (dense
layers on cuda:0 too), and with TorchRec's table_wise sharding on CPU (FBGEMM's CPU kernels:
frugal tables need no FBGEMM CUDA kernel, so the CPU build of FBGEMM is enough here). Each rank's
loss at every step and the final tables must agree within 1e-4 relative, for EXACT_SGD and
EXACT_ROWWISE_ADAGRAD, in a plain loop and under FrugalTrainPipeline. Also: an EmbeddingCollection
model, the pinned host path, and a checkpoint saved on CUDA and resumed in fresh processes.

scripts/device_check.sh runs this file on a GPU machine; without CUDA or TorchRec it is skipped.
"""
from __future__ import annotations

import tempfile
from typing import Any, Dict, Iterator

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (runs in scripts/device_check.sh)")
pytest.importorskip("torchrec", reason="needs TorchRec (scripts/device_check.sh brings it)")

import torchrec_ranks as trd  # noqa: E402
from rank_pool import Scenarios, pooled  # noqa: E402
from torchrec_frugal.host.launch import run_ranks  # noqa: E402

STEPS = 200
EC_ROWS = trd.TABLE_ROWS[::2]
DEVICE = "cuda:0"  # every rank's frugal tables and dense layers


def _scenarios(world: int) -> Dict[str, Dict[str, Any]]:
    """name -> run_training arguments; "cpu_*" are the TorchRec references."""
    from torchrec_frugal.config import FrugalConfig

    cuda, cpu = dict(device=DEVICE, steps=STEPS), dict(device="cpu", steps=STEPS)
    out: Dict[str, Dict[str, Any]] = {
        "cpu_tw_sgd": dict(sharding="table_wise", opt="sgd", **cpu),
        "cpu_tw_adagrad": dict(sharding="table_wise", opt="adagrad", **cpu),
        "cuda_frugal_sgd_pipeline": dict(sharding="frugal", opt="sgd", pipeline="frugal", **cuda),
        "cuda_frugal_adagrad": dict(sharding="frugal", opt="adagrad", **cuda),
    }
    if world == 2:
        pinned = FrugalConfig(lookahead=trd.LOOKAHEAD, cache_ratio=0.05, host_path="pinned")
        out.update(
            cuda_frugal_sgd=dict(sharding="frugal", opt="sgd", **cuda),
            cuda_frugal_adagrad_pipeline=dict(sharding="frugal", opt="adagrad", pipeline="frugal", **cuda),
            cuda_frugal_adagrad_pinned=dict(sharding="frugal", opt="adagrad", pipeline="frugal", config=pinned, **cuda),
            cpu_ec_tw_adagrad=dict(sharding="table_wise", opt="adagrad", model_kind="ec", table_rows=EC_ROWS, **cpu),
            cuda_ec_frugal_adagrad=dict(
                sharding="frugal", opt="adagrad", model_kind="ec", table_rows=EC_ROWS, pipeline="frugal", **cuda
            ),
        )
    return out


def _train(rank: int, world: int, kw: Dict[str, Any]) -> Dict[str, Any]:
    torch.cuda.set_device(0)
    return trd.run_training(world, **kw)


def _pooled(world: int) -> Iterator[Scenarios]:
    yield from pooled(world, {name: (_train, (kw,)) for name, kw in _scenarios(world).items()}, timeout=600)


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    yield from _pooled(2)


@pytest.fixture(scope="module")
def world4() -> Iterator[Scenarios]:
    yield from _pooled(4)


def _on_gpu(results: Scenarios, name: str, path: str = "zero_copy") -> None:
    """Every engine of every rank ran on DEVICE with host rows read by ``path``."""
    for res in results:
        engines = res[name]["engines"]
        assert engines and all(e == (DEVICE, path) for e in engines), engines
        assert set(res[name]["types"].values()) == {"frugal"}


@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
@pytest.mark.parametrize("pipeline", [False, True])
def test_frugal_on_cuda_matches_torchrec_on_cpu_2_ranks(world2: Scenarios, opt: str, pipeline: bool) -> None:
    name = f"cuda_frugal_{opt}" + ("_pipeline" if pipeline else "")
    _on_gpu(world2, name)
    trd.assert_same_training(world2, name, f"cpu_tw_{opt}")


@pytest.mark.parametrize("name, ref", [("cuda_frugal_sgd_pipeline", "cpu_tw_sgd"), ("cuda_frugal_adagrad", "cpu_tw_adagrad")])
def test_frugal_on_cuda_matches_torchrec_on_cpu_4_ranks(world4: Scenarios, name: str, ref: str) -> None:
    _on_gpu(world4, name)
    trd.assert_same_training(world4, name, ref)


def test_pinned_host_path_on_cuda(world2: Scenarios) -> None:
    _on_gpu(world2, "cuda_frugal_adagrad_pinned", path="pinned")
    trd.assert_same_training(world2, "cuda_frugal_adagrad_pinned", "cpu_tw_adagrad")


def test_embedding_collection_on_cuda(world2: Scenarios) -> None:
    _on_gpu(world2, "cuda_ec_frugal_adagrad")
    trd.assert_same_training(world2, "cuda_ec_frugal_adagrad", "cpu_ec_tw_adagrad")


def test_checkpoint_saved_and_resumed_on_cuda(world2: Scenarios) -> None:
    """Save at step k with torch.distributed.checkpoint, load into fresh processes, continue: the
    same losses and tables as the run that was never interrupted (CUDA may reorder float sums)."""
    k = STEPS // 2
    with tempfile.TemporaryDirectory() as directory:
        saved = run_ranks(2, trd.run_checkpoint, "save", directory, k, STEPS, DEVICE, timeout=600)
        resumed = run_ranks(2, trd.run_checkpoint, "resume", directory, k, STEPS, DEVICE, timeout=600)
    whole = [{"losses": world2[r]["cuda_frugal_adagrad_pipeline"]["losses"]} for r in range(2)]
    joined = [
        {"losses": torch.cat([torch.from_numpy(saved[r]["losses"]), torch.from_numpy(resumed[r]["losses"])]).numpy()}
        for r in range(2)
    ]
    joined[0]["tables"] = resumed[0]["tables"]
    whole[0]["tables"] = world2[0]["cuda_frugal_adagrad_pipeline"]["tables"]
    trd.assert_same_training([{"a": j, "b": w} for j, w in zip(joined, whole)], "a", "b")
