"""Batches planned ahead by FrugalTrainPipeline (CPU, gloo, 2 ranks).

Every batch the pipeline reads is planned off the training thread (its rows checked and made
unique, the engines' step plans, the pooling indices), and the batch's forward takes the plan
instead of reading its ids. Checked here: the planner thread, the inline planner and no planner
train the same model bit for bit (losses and tables; L = 6 and L = 0, EmbeddingBagCollection with
SUM, MEAN and weighted bags, EmbeddingCollection, a planner lagging behind); in steady state the training thread calls none
of the planning functions and runs none of the host-reading ops of an id check or a unique, and
the ops it runs do not depend on the batch size, and it reads no more values
to the host than stock TorchRec's table_wise step; a bad id fails where it is planned with the
feature named.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist

import test_torchrec_distributed as base
from test_torchrec_distributed import (
    TABLE_ROWS,
    VariantBatches,
    VariantsModel,
    ZipfBatches,
    build,
    frugal_lookups,
    full_tables,
    release,
    table_shapes,
)
from torchrec_frugal.test_utils import run_ranks

STEPS = 40
PLANNERS = ("thread", "inline", "none")
# (model kind, lookahead, table rows): the set-ups each planner trains.
SETUPS: Dict[str, Tuple[str, int, List[int]]] = {
    "dlrm_L6": ("dlrm", 6, TABLE_ROWS),
    "dlrm_L0": ("dlrm", 0, TABLE_ROWS),
    "mean_variants": ("variants", 6, TABLE_ROWS),
    "weighted_variants": ("weighted_variants", 6, TABLE_ROWS),
    "ec": ("ec", 6, TABLE_ROWS[::2]),
}
# What planning a batch calls, by where it is defined: none of it may run on the training thread.
PLANNING_CALLS = (
    ("torchrec_frugal.torchrec.embedding_lookup", "FrugalEmbeddingLookup", "group_rows"),
    ("torchrec_frugal.torchrec.embedding_lookup", "FrugalEmbeddingLookup", "plan"),
    ("torchrec_frugal.fused_rows", "FusedRows", "of_table_ids"),
    ("torchrec_frugal.fused_rows", "FusedRows", "of_ids"),
    ("torchrec_frugal.fused_rows", "FusedRows", "check"),
    ("torchrec_frugal.engine", "FrugalEngine", "plan_step"),
    ("torchrec_frugal.engine", None, "plan_lookup"),
    ("torch", None, "unique"),
)
# Host-reading aten ops of an id check, a unique or a comparison of batches.
PLANNING_OPS = {"_unique2", "unique_dim", "unique_consecutive", "sort", "equal", "masked_select", "min", "max"}


class TracedVariantsModel(VariantsModel):
    """The variants model with a forward TorchRec's pipeline can trace (the pooled KeyedTensor's
    values, in key order, instead of a dict)."""

    def forward(self, batch: Any) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        pooled = self.ebc(batch.sparse_features).values()
        logits = self.over(torch.cat([pooled, batch.dense_features], dim=1)).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


def config(lookahead: int) -> Any:
    from torchrec_frugal.config import FrugalConfig

    return FrugalConfig(lookahead=lookahead, cache_ratio=0.05)


def batches_of(kind: str, rows: List[int], batch: Optional[Callable[[int], Any]] = None) -> Iterator[Any]:
    if "variants" in kind:
        data: Any = VariantBatches(dist.get_rank(), kind == "weighted_variants")
    else:
        data = ZipfBatches(dist.get_rank(), rows)
    return (data.batch(s) for s in range(STEPS))


def pipeline(dmp: Any, opt: Any, planner: str) -> Any:
    from torchrec_frugal.torchrec import FrugalTrainPipeline

    return FrugalTrainPipeline(dmp, opt, torch.device("cpu"), planner=planner)


def train_with(planner: str, kind: str, lookahead: int, rows: List[int], plan_delay_s: float = 0.0) -> Dict[str, Any]:
    """Losses and final tables of STEPS pipelined steps; ``plan_delay_s``: every plan made that
    much later (a planner that lags the training thread)."""
    import time

    from torchrec_frugal.torchrec.embedding_lookup import FrugalEmbeddingLookup

    plan = FrugalEmbeddingLookup.plan
    if plan_delay_s:
        FrugalEmbeddingLookup.plan = lambda self, f: time.sleep(plan_delay_s) or plan(self, f)  # type: ignore[method-assign]
    try:
        return _train_with(planner, kind, lookahead, rows)
    finally:
        FrugalEmbeddingLookup.plan = plan  # type: ignore[method-assign]


def _train_with(planner: str, kind: str, lookahead: int, rows: List[int]) -> Dict[str, Any]:
    world = dist.get_world_size()
    dmp, opt, key = build(world, "frugal", "adagrad", kind, rows, config=config(lookahead))
    pipe = pipeline(dmp, opt, planner)
    source = batches_of(kind, rows)
    losses = []
    while True:
        try:
            losses.append(pipe.progress(source)[0].item())
        except StopIteration:
            break
    out = {"losses": np.array(losses), "tables": full_tables(dmp, key, table_shapes(kind, rows))}
    release(dmp)
    return out


class CallsByThread:
    """Counts calls of the planning functions per thread name while installed."""

    def __init__(self) -> None:
        self.counts: Dict[Tuple[str, str], int] = collections.Counter()
        self._undo: List[Tuple[Any, str, Any]] = []

    def __enter__(self) -> "CallsByThread":
        import importlib

        for module_name, cls, name in PLANNING_CALLS:
            owner = importlib.import_module(module_name)
            owner = getattr(owner, cls) if cls is not None else owner
            fn = owner.__dict__[name]

            def wrapper(*args: Any, fn: Any = fn, name: str = name, **kwargs: Any) -> Any:
                self.counts[(threading.current_thread().name, name)] += 1
                return fn(*args, **kwargs)

            self._undo.append((owner, name, fn))
            setattr(owner, name, wrapper)
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)

    def on(self, thread: str) -> Dict[str, int]:
        return {name: n for (t, name), n in self.counts.items() if t == thread}


def ops_of_steps(pipe: Any, source: Iterator[Any], steps: int) -> Dict[str, int]:
    """Aten ops the training thread (and autograd, which carries the mode) runs in ``steps`` progress() calls."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Dict[str, int] = collections.Counter()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            counts[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with Record():
        for _ in range(steps):
            pipe.progress(source)
    return counts


def steady_state(kind: str, batch_scale: int) -> Dict[str, Any]:
    """Calls by thread and training-thread ops over 6 steps after 6 warm-up steps (L = 6)."""
    world = dist.get_world_size()
    dmp, opt, key = build(world, "frugal", "adagrad", kind, TABLE_ROWS, config=config(6))
    old_batch = base.BATCH
    base.BATCH = old_batch * batch_scale
    try:
        source = batches_of(kind, TABLE_ROWS)
        pipe = pipeline(dmp, opt, "thread")
        for _ in range(6):
            pipe.progress(source)
        with CallsByThread() as calls:
            ops = ops_of_steps(pipe, source, 6)
        dist.barrier()
    finally:
        base.BATCH = old_batch
    main = threading.main_thread().name
    out = {
        "training_thread_calls": calls.on(main),
        "planner_calls": {k: v for (t, k), v in calls.counts.items() if t.startswith("frugal-planner")},
        "ops": dict(ops),
    }
    release(dmp)
    return out


def stock_steady_state_ops() -> Dict[str, int]:
    """The training thread's ops over 6 steps of TorchRec's own table_wise DLRM and pipeline."""
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    dmp, opt, _ = build(dist.get_world_size(), "table_wise", "adagrad", "dlrm", TABLE_ROWS)
    source = batches_of("dlrm", TABLE_ROWS)
    pipe = TrainPipelineSparseDist(dmp, opt, torch.device("cpu"))
    for _ in range(6):
        pipe.progress(source)
    ops = ops_of_steps(pipe, source, 6)
    dist.barrier()
    return dict(ops)


def bad_id_is_named() -> Optional[str]:
    """A batch with an id out of range, read ahead by the pipeline: the error names its feature."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from torchrec_frugal.errors import FrugalInputError

    world = dist.get_world_size()
    dmp, opt, _ = build(world, "frugal", "adagrad", "dlrm", TABLE_ROWS, config=config(6))
    data = ZipfBatches(dist.get_rank())

    def source() -> Iterator[Any]:
        for s in range(10):
            b = data.batch(s)
            if s == 3:
                kjt = b.sparse_features
                values = kjt.values().clone()
                values[kjt.offset_per_key()[2]] = TABLE_ROWS[2] + 5
                b.sparse_features = KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=kjt.lengths())
            yield b

    message = None
    try:
        pipeline(dmp, opt, "thread").progress(source())
    except FrugalInputError as e:
        message = str(e)
    release(dmp)
    return message


def _rank_main(rank: int, world: int) -> Dict[str, Any]:
    torch.set_num_threads(1)
    base.VariantsModel = TracedVariantsModel  # type: ignore[misc]  # what build() makes of "variants"
    out: Dict[str, Any] = {}
    for name, (kind, lookahead, rows) in SETUPS.items():
        for planner in PLANNERS:
            out[(name, planner)] = train_with(planner, kind, lookahead, rows)
    out[("dlrm_L6", "lagging_thread")] = train_with("thread", "dlrm", 6, TABLE_ROWS, plan_delay_s=0.02)
    out["steady_dlrm"] = steady_state("dlrm", 1)
    out["steady_dlrm_x8"] = steady_state("dlrm", 8)
    out["steady_mean"] = steady_state("variants", 1)
    out["steady_stock"] = stock_steady_state_ops()
    out["bad_id"] = bad_id_is_named()
    return out


@pytest.fixture(scope="module")
def world2() -> List[Dict[str, Any]]:
    return run_ranks(2, _rank_main)


@pytest.mark.parametrize("setup", sorted(SETUPS))
@pytest.mark.parametrize("planner", ["thread", "inline"])
def test_planned_batches_train_bit_for_bit_as_unplanned(world2: List[Dict[str, Any]], setup: str, planner: str) -> None:
    for rank, res in enumerate(world2):
        planned, checked = res[(setup, planner)], res[(setup, "none")]
        assert planned["losses"].shape == (STEPS,)
        assert np.array_equal(planned["losses"], checked["losses"]), (rank, setup, planner)
    for t, (x, y) in enumerate(zip(world2[0][(setup, planner)]["tables"], world2[0][(setup, "none")]["tables"])):
        assert np.array_equal(x, y), (setup, planner, t)


def test_a_lagging_planner_trains_the_same(world2: List[Dict[str, Any]]) -> None:
    for res in world2:
        assert np.array_equal(res[("dlrm_L6", "lagging_thread")]["losses"], res[("dlrm_L6", "none")]["losses"])
    for x, y in zip(world2[0][("dlrm_L6", "lagging_thread")]["tables"], world2[0][("dlrm_L6", "none")]["tables"]):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("steady", ["steady_dlrm", "steady_dlrm_x8", "steady_mean"])
def test_training_thread_plans_nothing(world2: List[Dict[str, Any]], steady: str) -> None:
    for res in world2:
        seen = res[steady]
        assert seen["training_thread_calls"] == {}, seen["training_thread_calls"]
        # The planner did the work: per step, each lookup's rows (one lookup here) and each engine's plan.
        assert seen["planner_calls"].get("group_rows", 0) >= 6 and seen["planner_calls"].get("plan_step", 0) >= 6
        assert not PLANNING_OPS & set(seen["ops"]), sorted(PLANNING_OPS & set(seen["ops"]))


def test_training_thread_ops_do_not_grow_with_the_batch(world2: List[Dict[str, Any]]) -> None:
    for res in world2:
        small, large = res["steady_dlrm"]["ops"], res["steady_dlrm_x8"]["ops"]
        assert set(small) == set(large)
        # Host reads of a value: as many at 8x the batch (none per id), and no more than stock
        # TorchRec's table_wise sharding makes in the same steps (its dense optimizer's and FBGEMM's).
        assert small.get("_local_scalar_dense", 0) == large.get("_local_scalar_dense", 0)
        assert small.get("_local_scalar_dense", 0) <= res["steady_stock"].get("_local_scalar_dense", 0)


def test_a_bad_id_is_named_where_it_is_planned(world2: List[Dict[str, Any]]) -> None:
    for res in world2:
        message = res["bad_id"]
        assert message is not None and "'f2'" in message and f"id {TABLE_ROWS[2] + 5}" in message, message
