"""The test harness: a failing scenario or run fails alone, and the rest carries on."""
from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from rank_pool import RankPool, Scenarios
from runs import Runs


def _sum_of_ranks(rank: int, world: int, offset: int) -> tuple:
    t = [rank + offset]
    out = [None] * world
    dist.all_gather_object(out, t[0])
    return os.getpid(), sum(out)


def _fails_on_rank_1(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("scenario broken on purpose")
    dist.barrier()  # rank 0 waits in a collective its peer never joins


def test_a_failing_scenario_fails_alone_and_the_pool_respawns() -> None:
    pool = RankPool(2, timeout=60, pg_timeout_s=20)
    try:
        results = Scenarios(
            pool, {"a": (_sum_of_ranks, (10,)), "broken": (_fails_on_rank_1, ()), "b": (_sum_of_ranks, (1,))}
        )
        assert [r["a"][1] for r in results] == [21, 21]
        pids = {r["a"][0] for r in results}
        assert len(pids) == 2
        with pytest.raises(RuntimeError, match="scenario 'broken' failed:(.|\\n)*rank 1 failed(.|\\n)*broken on purpose"):
            results[0]["broken"]
        with pytest.raises(RuntimeError, match="failed earlier"):  # not run again
            results[1]["broken"]
        assert [r["b"][1] for r in results] == [3, 3]
        assert not pids & {r["b"][0] for r in results}  # fresh ranks after the failure
        assert results[0]["a"] is results[0]["a"]  # run once
    finally:
        pool.close()


def test_runs_are_made_once_on_first_read_and_a_failure_stays_with_its_run() -> None:
    made = []

    def broken() -> None:
        made.append("broken")
        raise ValueError("run broken on purpose")

    runs = Runs({"a": lambda: made.append("a") or len(made), "broken": broken})
    assert made == []
    assert runs["a"] == 1 and runs["a"] == 1 and made == ["a"]
    with pytest.raises(RuntimeError, match="run 'broken' failed") as info:
        runs["broken"]
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(RuntimeError, match="failed earlier"):
        runs["broken"]
    assert made == ["a", "broken"]
    with pytest.raises(KeyError):
        runs["missing"]
