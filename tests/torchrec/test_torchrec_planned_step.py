"""Batches planned ahead by FrugalTrainPipeline, gradients handed to the exchange worker (CPU,
gloo, 2 ranks).

Every batch the pipeline reads is planned off the training thread (its rows checked and made
unique, the engines' step plans, the pooling indices), the batch's forward takes the plan instead
of reading its ids, and its backward hands the gradients to the exchange worker. Checked here:
the planner thread trains the same model as TorchRec's TrainPipelineSparseDist (no plans, no
lookahead), bit for bit (losses and tables; L = 6 and L = 0,
EmbeddingBagCollection with SUM, MEAN and weighted bags, EmbeddingCollection, a planner or an
exchange worker lagging behind, a loader that refills the buffers it yielded). In steady state the training thread calls none of the planning
or exchange functions and runs none of the host-reading ops of an id check or a unique; the ops
it runs do not depend on the batch size, and it reads no more values to the host than stock
TorchRec's table_wise step. A bad id fails at its batch's step, with the feature named.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist

import torchrec_ranks as base
from rank_pool import Scenarios, pooled
from torchrec_ranks import (
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

STEPS = 40
# "thread": FrugalTrainPipeline (its planner thread); "none": TrainPipelineSparseDist (no plans).
PLANNERS = ("thread", "none")
# (model kind, lookahead, table rows): the set-ups each pipeline trains.
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
    ("torchrec_frugal.torchrec.embedding_lookup", "FrugalEmbeddingLookup", "fused_ids"),
    ("torchrec_frugal.torchrec.embedding_lookup", None, "sorted_unique"),
    ("torchrec_frugal.torchrec.embedding_lookup", "FrugalEmbeddingLookup", "plan"),
    ("torchrec_frugal.fused_rows", "FusedRows", "of_table_runs"),
    ("torchrec_frugal.fused_rows", "FusedRows", "of_ids"),
    ("torchrec_frugal.fused_rows", "FusedRows", "check"),
    ("torchrec_frugal.engine.frugal_engine", "FrugalEngine", "plan_step"),
    ("torchrec_frugal.engine.frugal_engine", None, "plan_lookup"),
    ("torchrec_frugal.engine.step_reads", None, "plan_lookup"),  # an unplanned lookup's split
    ("torch", None, "unique"),
    ("torchrec_frugal.torchrec.train_pipeline.batch_planner", None, "snapshot"),  # the copy of a batch read
)
# What a step's update calls once backward handed its gradients over: the exchange worker's.
EXCHANGE_CALLS = (
    ("torchrec_frugal.engine.gradient_exchange", "GradientExchange", "stage"),
    ("torchrec_frugal.engine.gradient_exchange", "GradientExchange", "sum_owned"),
    ("torchrec_frugal.engine.owner_update", "OwnerUpdate", "apply"),
    ("torchrec_frugal.engine.flush.flusher", "Flusher", "flush_once"),
    ("torchrec_frugal.engine.flush.flusher", "Flusher", "flush_due"),
    ("torchrec_frugal.engine.lookahead.ring", "LookaheadRing", "publish"),  # the lookahead of a batch announced
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


def batches_of(kind: str, rows: List[int], refill: bool = False, unused_feature: bool = False) -> Iterator[Any]:
    """This rank's STEPS batches. ``refill``: a loader that reuses its buffers: once it made the
    next batch, the ids of the one it yielded before are overwritten in place (with other valid
    ids), as a loader refilling page-locked buffers does. ``unused_feature``: each KJT also
    carries, first, a feature no table serves (ids outside every table)."""
    if "variants" in kind:
        data: Any = VariantBatches(dist.get_rank(), kind == "weighted_variants")
    else:
        data = ZipfBatches(dist.get_rank(), rows)
    previous = None
    for s in range(STEPS):
        batch = data.batch(s)
        if refill and previous is not None:
            previous.sparse_features.values().zero_()  # id 0: valid in every table
        previous = batch
        if unused_feature:
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

            kjt, stride = batch.sparse_features, batch.sparse_features.stride()
            batch.sparse_features = KeyedJaggedTensor(
                keys=["unused"] + kjt.keys(),
                values=torch.cat([torch.full((stride,), 10**9, dtype=kjt.values().dtype), kjt.values()]),
                lengths=torch.cat([torch.ones(stride, dtype=kjt.lengths().dtype), kjt.lengths()]),
                stride=stride,
            )
        yield batch


def pipeline(dmp: Any, opt: Any, planner: str) -> Any:
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    from torchrec_frugal.torchrec import FrugalTrainPipeline

    if planner == "none":
        return TrainPipelineSparseDist(dmp, opt, torch.device("cpu"))
    return FrugalTrainPipeline(dmp, opt, torch.device("cpu"))


def train_with(
    planner: str,
    kind: str,
    lookahead: int,
    rows: List[int],
    plan_delay_s: float = 0.0,
    update_delay_s: float = 0.0,
    refill: bool = False,
    unused_feature: bool = False,
) -> Dict[str, Any]:
    """Losses and final tables of STEPS pipelined steps. ``plan_delay_s``: every plan made that
    much later (a planner lagging behind the training thread); ``update_delay_s``: every owner
    update that much later (an exchange worker lagging behind)."""
    import time

    from torchrec_frugal.engine.owner_update import OwnerUpdate
    from torchrec_frugal.torchrec.embedding_lookup import FrugalEmbeddingLookup

    plan, apply = FrugalEmbeddingLookup.plan, OwnerUpdate.apply
    if plan_delay_s:
        FrugalEmbeddingLookup.plan = lambda self, f: time.sleep(plan_delay_s) or plan(self, f)  # type: ignore[method-assign]
    if update_delay_s:
        OwnerUpdate.apply = lambda self, *a: time.sleep(update_delay_s) or apply(self, *a)  # type: ignore[method-assign]
    try:
        return _train_with(planner, kind, lookahead, rows, refill, unused_feature)
    finally:
        FrugalEmbeddingLookup.plan, OwnerUpdate.apply = plan, apply  # type: ignore[method-assign]


def _train_with(
    planner: str, kind: str, lookahead: int, rows: List[int], refill: bool = False, unused_feature: bool = False,
) -> Dict[str, Any]:
    world = dist.get_world_size()
    dmp, opt, key = build(world, "frugal", "adagrad", kind, rows, config=config(lookahead))
    pipe = pipeline(dmp, opt, planner)
    source = batches_of(kind, rows, refill, unused_feature)
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

        for module_name, cls, name in PLANNING_CALLS + EXCHANGE_CALLS:
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
            for lookup in frugal_lookups(dmp):  # the last step's update may still be on the worker
                for g in lookup.groups:
                    g.engine.drain()
        dist.barrier()
    finally:
        base.BATCH = old_batch
    main = threading.main_thread().name
    out = {
        "training_thread_calls": calls.on(main),
        "planner_calls": {k: v for (t, k), v in calls.counts.items() if t.startswith("frugal-planner")},
        "exchange_calls": {k: v for (t, k), v in calls.counts.items() if t.startswith("frugal-exchange")},
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


def bad_id_is_named() -> Optional[Tuple[int, str]]:
    """A batch with an id out of range, planned at the first step: the error, at its own step
    (the progress() call that would have trained it), names its feature (and the call)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from torchrec_frugal.errors import FrugalInputError

    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    world = dist.get_world_size()
    fatal = {"bounds_check_mode": BoundsCheckMode.FATAL}  # WARNING, the default, trains it as row 0
    dmp, opt, _ = build(world, "frugal", "adagrad", "dlrm", TABLE_ROWS, config=config(6), fused_extra=fatal)
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

    pipe, it = pipeline(dmp, opt, "thread"), source()
    found = None
    for call in range(4):  # batch 3 is planned at the first call, raised at the fourth
        try:
            pipe.progress(it)
        except FrugalInputError as e:
            found = (call, str(e))
            break
    release(dmp)
    return found


def _train(
    rank: int, world: int, planner: str, kind: str, lookahead: int, rows: List[int], options: Dict[str, Any]
) -> Dict[str, Any]:
    base.VariantsModel = TracedVariantsModel  # type: ignore[misc]  # what build() makes of "variants"
    return train_with(planner, kind, lookahead, rows, **options)


def _trained(setup: str, planner: str, **options: Any) -> Tuple[Any, tuple]:
    """The job training SETUPS[setup] with ``planner`` (and train_with's ``options``)."""
    kind, lookahead, rows = SETUPS[setup]
    return _train, (planner, kind, lookahead, rows, options)


def _steady_state(rank: int, world: int, kind: str, batch_scale: int) -> Dict[str, Any]:
    base.VariantsModel = TracedVariantsModel  # type: ignore[misc]
    return steady_state(kind, batch_scale)


def _stock_steady_state_ops(rank: int, world: int) -> Dict[str, int]:
    return stock_steady_state_ops()


def _bad_id_is_named(rank: int, world: int) -> Optional[Tuple[int, str]]:
    return bad_id_is_named()


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    yield from pooled(2, {
        **{(name, planner): _trained(name, planner) for name in SETUPS for planner in PLANNERS},
        ("dlrm_L6", "lagging_thread"): _trained("dlrm_L6", "thread", plan_delay_s=0.02),
        ("dlrm_L6", "lagging_exchange"): _trained("dlrm_L6", "thread", update_delay_s=0.02),
        **{(name, "refilling_loader"): _trained(name, "thread", refill=True) for name in ("dlrm_L6", "dlrm_L0")},
        ("dlrm_L6", "unused_feature"): _trained("dlrm_L6", "thread", unused_feature=True),
        "steady_dlrm": (_steady_state, ("dlrm", 1)),
        "steady_dlrm_x8": (_steady_state, ("dlrm", 8)),
        "steady_mean": (_steady_state, ("variants", 1)),
        "steady_stock": (_stock_steady_state_ops, ()),
        "bad_id": (_bad_id_is_named, ()),
    })


def assert_bit_identical(results: Sequence[Mapping[Any, Any]], a: Tuple[str, str], b: Tuple[str, str]) -> None:
    for rank, res in enumerate(results):
        assert res[a]["losses"].shape == (STEPS,)
        assert np.array_equal(res[a]["losses"], res[b]["losses"]), (rank, a, b)
    for t, (x, y) in enumerate(zip(results[0][a]["tables"], results[0][b]["tables"])):
        assert np.array_equal(x, y), (a, b, t)


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_planned_batches_train_bit_for_bit_as_unplanned(world2: Scenarios, setup: str) -> None:
    assert_bit_identical(world2, (setup, "thread"), (setup, "none"))


@pytest.mark.parametrize("lagging", ["lagging_thread", "lagging_exchange"])
def test_a_lagging_planner_or_exchange_worker_trains_the_same(world2: Scenarios, lagging: str) -> None:
    assert_bit_identical(world2, ("dlrm_L6", lagging), ("dlrm_L6", "none"))


@pytest.mark.parametrize("setup", ["dlrm_L6", "dlrm_L0"])
def test_a_loader_that_refills_its_buffers_trains_as_a_fresh_one(world2: Scenarios, setup: str) -> None:
    """A batch is planned from a copy of its ids taken when it was read: a loader may then refill
    the buffers it yielded (the dense features here stay as they were)."""
    assert_bit_identical(world2, (setup, "refilling_loader"), (setup, "none"))


def test_a_feature_no_table_serves_is_ignored_through_the_pipeline(world2: Scenarios) -> None:
    """Planned, announced and trained as if the batch did not carry it (as stock TorchRec ignores it)."""
    assert_bit_identical(world2, ("dlrm_L6", "unused_feature"), ("dlrm_L6", "none"))


@pytest.mark.parametrize("steady", ["steady_dlrm", "steady_dlrm_x8", "steady_mean"])
def test_training_thread_plans_nothing(world2: Scenarios, steady: str) -> None:
    for res in world2:
        seen = res[steady]
        assert seen["training_thread_calls"] == {}, seen["training_thread_calls"]
        # The planner did the work: per step, each lookup's rows (one lookup here) and each engine's plan.
        assert seen["planner_calls"].get("sorted_unique", 0) >= 6 and seen["planner_calls"].get("plan_step", 0) >= 6
        # ... and the exchange worker the update.
        assert seen["exchange_calls"].get("sum_owned", 0) >= 6 and seen["exchange_calls"].get("apply", 0) >= 6
        assert seen["exchange_calls"].get("publish", 0) >= 6 and seen["planner_calls"].get("snapshot", 0) >= 6
        assert not PLANNING_OPS & set(seen["ops"]), sorted(PLANNING_OPS & set(seen["ops"]))


def test_training_thread_ops_do_not_grow_with_the_batch(world2: Scenarios) -> None:
    for res in world2:
        small, large = res["steady_dlrm"]["ops"], res["steady_dlrm_x8"]["ops"]
        assert set(small) == set(large)
        # Host reads of a value: as many at 8x the batch (none per id), and no more than stock
        # TorchRec's table_wise sharding makes in the same steps (its dense optimizer's and FBGEMM's).
        assert small.get("_local_scalar_dense", 0) == large.get("_local_scalar_dense", 0)
        assert small.get("_local_scalar_dense", 0) <= res["steady_stock"].get("_local_scalar_dense", 0)


def test_a_bad_id_is_named_at_its_batchs_step(world2: Scenarios) -> None:
    for res in world2:
        assert res["bad_id"] is not None and res["bad_id"][0] == 3, res["bad_id"]
        message = res["bad_id"][1]
        assert "'f2'" in message and f"id {TABLE_ROWS[2] + 5}" in message, message


@pytest.fixture(scope="module")
def world1() -> Iterator[Scenarios]:
    yield from pooled(1, {
        "planned": (_train, ("thread", "dlrm", 10, TABLE_ROWS, {})),
        "inline": (_train, ("none", "dlrm", 10, TABLE_ROWS, {})),
    })


def test_one_rank_planned_steps_train_bit_for_bit_as_inline_ones(world1: Scenarios) -> None:
    """World 1, L = 10: the planner thread against each forward computing its rows."""
    res = world1[0]
    planned, inline = res["planned"], res["inline"]
    assert planned["losses"].shape == (STEPS,)
    np.testing.assert_array_equal(planned["losses"], inline["losses"])
    for x, y in zip(planned["tables"], inline["tables"]):
        np.testing.assert_array_equal(x, y)
