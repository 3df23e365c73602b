"""A batch refused inside FrugalTrainPipeline's window costs that batch alone, on every rank together
(CPU, gloo, 2 ranks).

One rank's loader yields a batch with an id out of range (the other rank's batch of that step is
fine). Every rank's ``progress()`` raises at the step that would have trained it, naming the batch,
having run nothing of it (no rank aborts); the loop catches the error and goes on, and the run
trains, bit for bit, as the same run on streams from which that step's batches were removed. Also
covered: the first batch refused (read before the model is traced), the last one, two in a row,
a window of 0, and frugal_row_wise tables across two nodes (their batches are checked on the
training thread, not planned).
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Set, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rank_pool import Scenarios, pooled
from torchrec_ranks import TABLE_ROWS, ZipfBatches, build, full_tables, release, table_shapes
from torchrec_frugal.host.launch import run_ranks

STEPS = 14
# name -> (lookahead, {(batch index, rank) refused}): batch i of rank r gets a bad id.
SCENARIOS: Dict[str, Tuple[int, Set[Tuple[int, int]]]] = {
    "middle_rank1": (6, {(5, 1)}),
    "first_rank0": (6, {(0, 0)}),
    "last_rank1": (6, {(STEPS - 1, 1)}),
    "two_in_a_row": (6, {(3, 0), (4, 1)}),
    "both_ranks": (6, {(7, 0), (7, 1)}),
    "window_0": (0, {(5, 0)}),
}


def stream(bad: Set[Tuple[int, int]], skip: Set[int]) -> Iterator[Any]:
    """This rank's batches: those of ``bad`` for this rank get an id one past table 2's end;
    indices in ``skip`` are left out (the reference run)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    rank = dist.get_rank()
    data = ZipfBatches(rank)
    for s in range(STEPS):
        if s in skip:
            continue
        b = data.batch(s)
        if (s, rank) in bad:
            kjt = b.sparse_features
            values = kjt.values().clone()
            values[kjt.offset_per_key()[2]] = TABLE_ROWS[2]
            b.sparse_features = KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=kjt.lengths())
        yield b


def train(lookahead: int, bad: Set[Tuple[int, int]], skip: Set[int], sharding: str = "frugal") -> Dict[str, Any]:
    """Run the pipeline to the end of the stream, catching refusals: losses, errors by progress() call, tables."""
    from torchrec_frugal.config import FrugalConfig
    from torchrec_frugal.errors import FrugalInputError
    from torchrec_frugal.torchrec import FrugalTrainPipeline

    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    dmp, opt, key = build(
        dist.get_world_size(),
        sharding,
        "adagrad",
        config=FrugalConfig(lookahead=lookahead, cache_ratio=0.05, timeout_s=60.0),
        fused_extra={"bounds_check_mode": BoundsCheckMode.FATAL},  # WARNING, the default, trains it as row 0
    )
    pipe = FrugalTrainPipeline(dmp, opt, torch.device("cpu"))
    source = stream(bad, skip)
    losses: List[float] = []
    errors: List[Tuple[int, str]] = []
    for call in range(3 * STEPS):
        try:
            losses.append(pipe.progress(source)[0].item())
        except FrugalInputError as e:
            errors.append((call, str(e)))
        except StopIteration:
            break
    out = {"losses": np.array(losses), "errors": errors, "tables": full_tables(dmp, key, table_shapes("dlrm"))}
    release(dmp)
    return out


def _train(rank: int, world: int, lookahead: int, bad: Set[Tuple[int, int]], skip: Set[int]) -> Dict[str, Any]:
    return train(lookahead, bad, skip)


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    jobs: Dict[Any, Any] = {}
    for name, (lookahead, bad) in SCENARIOS.items():
        jobs[name] = (_train, (lookahead, bad, set()))
        jobs[(name, "reference")] = (_train, (lookahead, set(), {s for s, _ in bad}))
    yield from pooled(2, jobs)


ROW_WISE_BAD = {(5, 1)}


def _nodes_main(rank: int, world: int) -> Dict[str, Any]:
    """frugal_row_wise tables over 2 nodes of 1 rank (batches checked, not planned: their ids cross nodes)."""
    torch.set_num_threads(1)
    return {
        "bad": train(4, ROW_WISE_BAD, set(), "frugal_row_wise"),
        "reference": train(4, set(), {s for s, _ in ROW_WISE_BAD}, "frugal_row_wise"),
    }


def test_a_refused_batch_is_dropped_on_every_node_with_frugal_row_wise_tables() -> None:
    nodes = run_ranks(2, _nodes_main, nodes=2)
    for rank, res in enumerate(nodes):
        got, ref = res["bad"], res["reference"]
        assert [call for call, _ in got["errors"]] == [5], (rank, got["errors"])
        assert "batch 5 read by FrugalTrainPipeline is dropped on every rank" in got["errors"][0][1]
        assert got["losses"].shape == (STEPS - 1,)
        np.testing.assert_array_equal(got["losses"], ref["losses"])
        for a, b in zip(got["tables"], ref["tables"]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_refused_batch_is_dropped_on_every_rank_at_its_step(world2: Scenarios, name: str) -> None:
    _, bad = SCENARIOS[name]
    steps = sorted({s for s, _ in bad})
    for rank, res in enumerate(world2):
        got, ref = res[name], res[(name, "reference")]
        # Raised at the step that would have trained the batch: progress() call = batch index.
        assert [call for call, _ in got["errors"]] == steps, (rank, got["errors"])
        for (call, message), s in zip(got["errors"], steps):
            assert f"batch {s} read by FrugalTrainPipeline is dropped on every rank" in message
            if (s, rank) in bad:  # the refusing rank names the feature and the id
                assert "'f2'" in message and str(TABLE_ROWS[2]) in message, message
            else:
                assert "refused theirs" in message, message
        # Every other batch trained, exactly as if the refused ones had never been read.
        assert got["losses"].shape == (STEPS - len(steps),)
        np.testing.assert_array_equal(got["losses"], ref["losses"])
        for a, b in zip(got["tables"], ref["tables"]):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(world2[0][name]["losses"][:3], world2[1][name]["losses"][:3])  # ranks trained their own data
