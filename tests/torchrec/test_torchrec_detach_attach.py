"""FrugalTrainPipeline's detach / attach and epoch loops, as TorchRec users write them (CPU, gloo, 2 ranks).

Two loops, each run with frugal tables under FrugalTrainPipeline (L = 4: batches announced ahead)
and with table_wise tables under TorchRec's TrainPipelineSparseDist: an epoch loop (train to
StopIteration, detach, an eval forward without gradients, the next epoch on a new iterator), and a
detach in the middle of an epoch (eval forward while batches are announced and in flight, attach,
train on). Same losses, eval losses and tables as stock, to float tolerance.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rank_pool import Scenarios, pooled
from torchrec_ranks import TABLE_ROWS, ZipfBatches, build, full_tables, initial_table, release, table_shapes

LOOPS = ("epochs", "midway", "midway_no_attach")


def train(sharding: str, loop: str) -> Dict[str, Any]:
    """Losses of the training steps, losses of the eval forwards, and the final tables (on rank 0)."""
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    from torchrec_frugal.config import FrugalConfig
    from torchrec_frugal.torchrec import FrugalTrainPipeline

    frugal = sharding == "frugal"
    dmp, opt, key = build(2, sharding, "adagrad", config=FrugalConfig(lookahead=4, cache_ratio=0.05) if frugal else None)
    pipe = (FrugalTrainPipeline if frugal else TrainPipelineSparseDist)(dmp, opt, torch.device("cpu"))
    data = ZipfBatches(dist.get_rank())
    losses: List[float] = []
    evals: List[float] = []

    def run(it: Any, steps: int = 10**6) -> None:
        for _ in range(steps):
            try:
                losses.append(pipe.progress(it)[0].item())
            except StopIteration:
                return

    def evaluate(step: int) -> None:
        dmp.eval()
        with torch.no_grad():
            evals.append(dmp(data.batch(1000 + step))[0].item())
        dmp.train()

    if loop == "epochs":
        for epoch in range(3):
            run(data.batches(8 * epoch, 8 * epoch + 8))
            pipe.detach()
            evaluate(epoch)
    else:
        it = data.batches(0, 16)
        run(it, 5)
        pipe.detach()
        evaluate(0)
        if loop == "midway":
            pipe.attach(dmp)
        run(it)  # progress() attaches a detached model itself
        pipe.detach()
        evaluate(1)
    out = {"losses": np.array(losses), "evals": np.array(evals), "tables": full_tables(dmp, key, table_shapes("dlrm"))}
    release(dmp)
    return out


def _train(rank: int, world: int, sharding: str, loop: str) -> Dict[str, Any]:
    return train(sharding, loop)


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    yield from pooled(2, {
        (loop, sharding): (_train, (sharding, loop)) for loop in LOOPS for sharding in ("frugal", "table_wise")
    })


@pytest.mark.parametrize("loop", LOOPS)
def test_detach_eval_attach_trains_as_stock(world2: Scenarios, loop: str) -> None:
    for rank, res in enumerate(world2):
        frugal, stock = res[(loop, "frugal")], res[(loop, "table_wise")]
        assert frugal["losses"].shape == stock["losses"].shape == ((24,) if loop == "epochs" else (16,))
        np.testing.assert_allclose(frugal["losses"], stock["losses"], rtol=0, atol=1e-6)
        assert frugal["evals"].shape == stock["evals"].shape and frugal["evals"].size >= 2
        np.testing.assert_allclose(frugal["evals"], stock["evals"], rtol=0, atol=1e-6)
        assert len(set(frugal["evals"].tolist())) == frugal["evals"].size  # each eval saw the model of its time
        if rank == 0:
            for t, (a, b) in enumerate(zip(frugal["tables"], stock["tables"])):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=f"table t{t}")
            # training moved the tables (so equal tables say something)
            assert any(not np.array_equal(a, initial_table(t, rows).numpy()) for t, (a, rows) in enumerate(zip(frugal["tables"], TABLE_ROWS)))
