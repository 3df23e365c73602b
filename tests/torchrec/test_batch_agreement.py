"""The batch agreement (CPU, 2 and 3 ranks): through named pipes on one machine, over gloo across
machines; the same verdicts either way, no file left, and a peer that stops, dies or reads other
batches is named instead of waited for."""
from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch.distributed as dist

from torchrec_frugal.errors import FrugalError
from torchrec_frugal.host import shm
from torchrec_frugal.host.launch import run_ranks
from torchrec_frugal.torchrec.train_pipeline.batch_agreement import BatchAgreement, batch_agreement
from torchrec_frugal.host.node_agreement import NodeBatchAgreement

# batch index -> the ranks that refuse it
REFUSALS: Dict[int, List[int]] = {0: [], 1: [1], 2: [0, 1], 3: [], 4: [0], 5: [], 6: [1], 7: [2], 8: [0, 2]}


def _verdicts(rank: int, world: int) -> Dict[str, Any]:
    agree = batch_agreement(dist.group.WORLD, timeout_s=30.0)
    left = shm.list_segments()
    got = {i: agree(i, rank in refusing) for i, refusing in REFUSALS.items()}
    return {"kind": type(agree.__self__).__name__, "got": got, "left": left}  # type: ignore[attr-defined]


@pytest.mark.parametrize("world,nodes", [(2, 1), (3, 1), (2, 2)])
def test_every_rank_learns_every_refusal(world: int, nodes: int) -> None:
    """One machine: named pipes, unlinked once opened; two machines: gloo."""
    kind = NodeBatchAgreement.__name__ if nodes == 1 else BatchAgreement.__name__
    for res in run_ranks(world, _verdicts, nodes=nodes):
        assert res["kind"] == kind
        assert res["got"] == {i: [r for r in refusing if r < world] for i, refusing in REFUSALS.items()}
        assert [n for n in res["left"] if "agreement" in n] == []


def _verdict_or_error(agree: NodeBatchAgreement, index: int) -> str:
    """The outcome of batch ``index``, which this rank planned: "agreed", or the error's message."""
    try:
        agree.refused_by(index, False)
    except FrugalError as e:
        return str(e)
    return "agreed"


def _stops(rank: int, world: int) -> str:
    agree = NodeBatchAgreement(dist.group.WORLD, timeout_s=3.0)
    agree.refused_by(0, False)
    if rank == 1:
        return "stopped"  # reads no more batches (then exits: its end of the pipe closes, or the wait times out)
    return _verdict_or_error(agree, 1)


def _closes(rank: int, world: int) -> str:
    agree = NodeBatchAgreement(dist.group.WORLD, timeout_s=30.0)
    agree.refused_by(0, False)
    if rank == 1:
        agree.close()
    dist.barrier()  # rank 1's pipes are closed before rank 0 sends its next verdict
    if rank == 1:
        return "closed"
    return _verdict_or_error(agree, 1)


def _other_batches(rank: int, world: int) -> str:
    return _verdict_or_error(NodeBatchAgreement(dist.group.WORLD, timeout_s=30.0), 7 + rank)


def _after_close(rank: int, world: int) -> str:
    agree = NodeBatchAgreement(dist.group.WORLD, timeout_s=30.0)
    agree.close()
    return _verdict_or_error(agree, 0)


def test_a_rank_that_stops_is_named_not_waited_for() -> None:
    message = run_ranks(2, _stops)[0]
    assert "could not agree on batch 1: rank(s) [1] " in message, message
    assert message.endswith("are gone") or "did not answer" in message and "3 s" in message, message


def test_a_verdict_sent_to_a_closed_rank_names_it() -> None:
    """The peer's FIFO has no reader left: the write fails at once (EPIPE), named, not a BrokenPipeError."""
    message = run_ranks(2, _closes)[0]
    assert message == "FrugalTrainPipeline: the ranks could not agree on batch 1: rank(s) [1] are gone", message


def test_ranks_that_read_other_batches_are_told() -> None:
    for rank, message in enumerate(run_ranks(2, _other_batches)):
        other = 1 - rank
        assert f"rank {rank}'s batch {7 + rank} met batch {7 + other} of rank {other}" in message, message


def test_an_agreement_closed_refuses_to_agree_by_name() -> None:
    for rank, message in enumerate(run_ranks(2, _after_close)):
        assert message == f"FrugalTrainPipeline: rank {rank}'s batch agreement is closed: it cannot agree on batch 0", message
