"""``dcp.load`` in place, the TorchRec way, restores frugal tables and their optimizer state as stock.

TorchRec users restore a checkpoint by loading it with torch.distributed.checkpoint into the
model's and the optimizer's own state_dicts: ``dcp.load({"model": model.state_dict(), "optim":
optimizer.state_dict()})``, whose tensors are the live tables and optimizer state, with no
``load_state_dict`` afterwards. Here a DLRM with 4 Zipf-skewed tables trains K steps on 2 ranks,
saves with ``dcp.save``, trains K more, loads the checkpoint in place that way, evaluates a
held-out batch and replays those K steps (in a plain loop, or in a train pipeline detached for the
load with the replay's batches announced and in flight). Under frugal sharding (EXACT_SGD and
EXACT_ROWWISE_ADAGRAD; frugal_row_wise on 2 simulated nodes) the eval and the replay must go as
stock row_wise's after the same load (losses, tables, momentum1 within 1e-4 relative), the eval
must see the state saved and the replay repeat the steps it replays; the load must have changed
every table (and momentum1) it restores.
"""
from __future__ import annotations

import itertools
import tempfile
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rank_pool import Scenarios, pooled
from torchrec_ranks import CPU, REL_TOL, TABLE_ROWS, ZipfBatches, build, release, table_shapes, train

ROWS = TABLE_ROWS[:4]
K = 8  # steps before the save, then again before the load (the steps replayed)


def _gathered(sd: Dict[str, Any], key: str, shape: List[int]) -> Optional[np.ndarray]:
    """A ShardedTensor of ``sd`` whole on rank 0 (collective); None elsewhere."""
    full = torch.zeros(shape) if dist.get_rank() == 0 else None
    sd[key].gather(dst=0, out=full)
    return None if full is None else full.numpy().copy()


def _state(dmp: Any, optimizer: Any, key: str, opt: str) -> Dict[str, Optional[np.ndarray]]:
    """Every table and, under row-wise Adagrad, every momentum1, whole on rank 0 (collective)."""
    model, state = dmp.state_dict(), optimizer.state_dict()["state"]
    out = {}
    for t, (rows, dim) in enumerate(table_shapes("dlrm", ROWS)):
        out[f"t{t}"] = _gathered(model, f"{key}.t{t}.weight", [rows, dim])
        if opt == "adagrad":
            out[f"t{t}.momentum1"] = _gathered(state[f"{key}.t{t}.weight"], f"t{t}.momentum1", [rows])
    return out


def _evaluate(dmp: Any, data: Any) -> float:
    """The loss of a held-out batch, from a forward without gradients in eval mode."""
    dmp.eval()
    with torch.no_grad():
        loss = dmp(data.batch(10**6))[0].item()
    dmp.train()
    return loss


def _replay(rank: int, world: int, sharding: str, opt: str, pipeline: bool, directory: str) -> Dict[str, Any]:
    """Train K steps, dcp.save, train K more, dcp.load in place into the live state_dicts, evaluate,
    replay those K steps. With ``pipeline``, the K steps and their replay run in one train pipeline
    (FrugalTrainPipeline, or TrainPipelineSparseDist for stock), detached for the load, so that the
    replay's first batches are announced and in flight while the checkpoint loads and the eval
    forward reads the tables between steps. Returns the losses of both passes and of the evals at
    the save and after the load, and the state at the save, before the load, right after it and
    after the replay (rank 0)."""
    import torch.distributed.checkpoint as dcp
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    from torchrec_frugal.torchrec import FrugalTrainPipeline

    dmp, optimizer, key = build(world, sharding, opt, table_rows=ROWS)
    data = ZipfBatches(rank, ROWS)
    train(dmp, optimizer, data.batches(0, K))
    dcp.save({"model": dmp.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=directory)
    out: Dict[str, Any] = {"saved": _state(dmp, optimizer, key, opt), "eval_saved": _evaluate(dmp, data)}
    if pipeline:
        pipe = (TrainPipelineSparseDist if sharding in STOCK else FrugalTrainPipeline)(dmp, optimizer, CPU)
        stream = itertools.chain(data.batches(K, 2 * K), data.batches(K, 2 * K))
        out["first"] = [pipe.progress(stream)[0].item() for _ in range(K)]
        pipe.detach()
    else:
        out["first"] = train(dmp, optimizer, data.batches(K, 2 * K))
    out["before"] = _state(dmp, optimizer, key, opt)
    dcp.load({"model": dmp.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=directory)
    out["eval_loaded"] = _evaluate(dmp, data)
    out["loaded"] = _state(dmp, optimizer, key, opt)
    if pipeline:
        out["replay"] = [pipe.progress(stream)[0].item() for _ in range(K)]
    else:
        out["replay"] = train(dmp, optimizer, data.batches(K, 2 * K))
    out["after"] = _state(dmp, optimizer, key, opt)
    release(dmp)
    return out


STOCK = ("row_wise",)
RUNS_2 = {
    "frugal_sgd": ("frugal", "sgd", False),
    "row_wise_sgd": ("row_wise", "sgd", False),
    "frugal_adagrad": ("frugal", "adagrad", False),
    "row_wise_adagrad": ("row_wise", "adagrad", False),
    "frugal_adagrad_pipeline": ("frugal", "adagrad", True),
    "row_wise_adagrad_pipeline": ("row_wise", "adagrad", True),
}
RUNS_NODES = {
    "frugal_row_wise_adagrad": ("frugal_row_wise", "adagrad", False),
    "row_wise_adagrad": ("row_wise", "adagrad", False),
}


def _run(rank: int, world: int, sharding: str, opt: str, pipeline: bool) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        # every rank saves into rank 0's directory (one machine)
        objs: List[Any] = [d]
        dist.broadcast_object_list(objs, src=0)
        out = _replay(rank, world, sharding, opt, pipeline, objs[0])
        dist.barrier()
    return out


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    yield from pooled(2, {name: (_run, args) for name, args in RUNS_2.items()})


@pytest.fixture(scope="module")
def nodes2() -> Iterator[Scenarios]:
    yield from pooled(2, {name: (_run, args) for name, args in RUNS_NODES.items()}, nodes=2)


def _max_rel(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, float]:
    """Per table (and momentum1), max |a - b| over max |b|."""
    return {k: float(np.abs(a[k] - b[k]).max() / np.abs(b[k]).max()) for k in b}


def _check(results: Sequence[Mapping[str, Any]], frugal: str, stock: str) -> None:
    for rank, r in enumerate(results):
        f, s = r[frugal], r[stock]
        assert len(f["replay"]) == K
        np.testing.assert_allclose(f["replay"], s["replay"], rtol=REL_TOL, err_msg=f"rank {rank}: replay losses")
        # the replay repeats the steps trained after the save
        np.testing.assert_allclose(f["replay"], f["first"], rtol=REL_TOL, err_msg=f"rank {rank}: replay vs first pass")
        np.testing.assert_allclose(s["replay"], s["first"], rtol=REL_TOL, err_msg=f"rank {rank}: stock replay")
        # an eval forward right after the load sees the state saved, as stock's does
        evals = [f["eval_saved"], f["eval_loaded"], s["eval_saved"], s["eval_loaded"]]
        np.testing.assert_allclose(evals, evals[0], rtol=REL_TOL, err_msg=f"rank {rank}: evals")
    f, s = results[0][frugal], results[0][stock]
    # the load restores something that had changed since the save, in every table and state
    changed = _max_rel(f["before"], f["saved"])
    assert min(changed.values()) > 5 * REL_TOL, changed
    for state in ("loaded", "after"):
        diff = _max_rel(f[state], s[state])
        assert max(diff.values()) <= REL_TOL, f"{frugal} vs {stock}, {state}: {diff}"
    restored = _max_rel(f["loaded"], f["saved"])
    assert max(restored.values()) <= REL_TOL, restored
    replayed = _max_rel(f["after"], f["before"])
    assert max(replayed.values()) <= REL_TOL, replayed


@pytest.mark.parametrize("run", ["sgd", "adagrad", "adagrad_pipeline"])
def test_dcp_load_in_place_trains_on_as_stock(world2: Scenarios, run: str) -> None:
    _check(world2, f"frugal_{run}", f"row_wise_{run}")


def test_dcp_load_in_place_frugal_row_wise_across_nodes(nodes2: Scenarios) -> None:
    _check(nodes2, "frugal_row_wise_adagrad", "row_wise_adagrad")
