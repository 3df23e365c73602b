"""frugal_row_wise on nodes simulated on this machine: against TorchRec's row_wise, step for step.

Each node is a set of ranks with torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK and a
shared-memory directory of its own (``pooled(..., nodes=N)``: one pool of ranks per layout, each
test running the scenarios it reads). TorchRec's DLRM with the 8 Zipf-skewed tables of
``test_torchrec_distributed`` trains from the same initial weights under frugal_row_wise and under
stock row_wise; each rank's loss at every step and the final tables must agree within 1e-4
relative (SGD and row-wise Adagrad, plain loop and train pipeline, and an EmbeddingCollection
model), FrugalShardingPlanner must choose frugal_row_wise on a topology of nodes, and the
checkpoint of frugal_row_wise must load into a fresh model and continue bit for bit. The plain
"frugal" sharding, which keeps a table in one node's shared memory, must refuse to span nodes.
"""
from __future__ import annotations

import tempfile
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rank_pool import Scenarios, pooled
from torchrec_ranks import (
    BATCH,
    DIM,
    LOOKAHEAD,
    REL_TOL,
    TABLE_ROWS,
    ZipfBatches,
    build,
    frugal_lookups,
    full_tables,
    fused_params,
    release,
    run_training,
    table_shapes,
    train,
)

STEPS = 60
# (optimizer, pipeline, model): DLRM's EmbeddingBagCollection, or an EmbeddingCollection ("ec")
RUNS = [
    ("sgd", None, "dlrm"),
    ("adagrad", None, "dlrm"),
    ("adagrad", "pipeline", "dlrm"),
    ("adagrad", None, "ec"),
    ("adagrad", "pipeline", "ec"),
]
RUN_IDS = [f"{opt}/{pipe}/{model}" for opt, pipe, model in RUNS]


def _training(rank: int, world: int, sharding: str, opt: str, pipeline: Any, model: str) -> Dict[str, Any]:
    rows = TABLE_ROWS[::2] if model == "ec" else TABLE_ROWS
    pipe = None if pipeline is None else ("frugal" if sharding == "frugal_row_wise" else "sparse_dist")
    return run_training(world, sharding, opt, pipeline=pipe, model_kind=model, table_rows=rows, steps=STEPS)


def _checkpoint(rank: int, world: int, ckpt_dir: str) -> Dict[str, Any]:
    """Train k steps, save with torch.distributed.checkpoint, train on; then load the checkpoint
    into a fresh model and train the same steps again: the tables must be equal bit for bit.

    The dense layers' DDP keeps its first gradient buckets (``find_unused_parameters=True``
    without a static graph never rebuilds them). By default DDP rebuilds its buckets after the
    first backward of every start, so the first step after a resume all-reduces with other
    buckets than the uninterrupted run had there, and gloo's ring over 4 ranks then adds some
    floats in another order (stock row_wise resumes within 7.5e-8 so, bit for bit without).
    """
    import torch.distributed.checkpoint as dcp
    from torchrec.distributed.model_parallel import DefaultDataParallelWrapper

    k = STEPS // 2

    def fresh() -> Any:
        wrapper = DefaultDataParallelWrapper(static_graph=False, find_unused_parameters=True)
        return build(world, "frugal_row_wise", "adagrad", data_parallel_wrapper=wrapper)

    dmp, opt, key = fresh()
    data = ZipfBatches(dist.get_rank())
    train(dmp, opt, data.batches(0, k))
    dcp.save({"model": dmp.state_dict(), "optim": opt.state_dict()}, checkpoint_id=ckpt_dir)
    first_losses = train(dmp, opt, data.batches(k, STEPS))
    first = full_tables(dmp, key, table_shapes("dlrm"))
    release(dmp)
    dmp, opt, key = fresh()
    state = {"model": dmp.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, checkpoint_id=ckpt_dir)
    dmp.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    second_losses = train(dmp, opt, data.batches(k, STEPS))
    second = full_tables(dmp, key, table_shapes("dlrm"))
    release(dmp)
    return {"first": first, "second": second, "first_losses": first_losses, "second_losses": second_losses}


def _refuses_frugal_across_nodes(rank: int, world: int) -> str:
    from torchrec_frugal.errors import FrugalError

    try:
        build(world, "frugal", "sgd")
    except FrugalError as e:
        return str(e)
    return "no error"


def _bad_ids(rank: int, world: int) -> Dict[str, Any]:
    """Every rank feeds an id out of range (then a negative one): each is refused, naming the
    feature, table and id, before the input dist sends it to another node; nothing changes.
    Then every rank announces batch 2 and trains batch 3: refused at the input dist (whose ids
    the announcement already sent), naming the feature; batch 2 then trains."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from torchrec_frugal.errors import FrugalInputError
    from torchrec_frugal.torchrec import FrugalShardedEmbeddingBagCollection

    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    fatal = {"bounds_check_mode": BoundsCheckMode.FATAL}  # WARNING, the default, trains it as row 0
    dmp, opt, key = build(world, "frugal_row_wise", "adagrad", fused_extra=fatal)
    data = ZipfBatches(dist.get_rank())
    train(dmp, opt, data.batches(0, 2))
    before = full_tables(dmp, key, table_shapes("dlrm"))
    seen: Dict[str, Any] = {}
    for name, feature, bad in (("out_of_range", "f3", TABLE_ROWS[3]), ("negative", "f5", -7)):
        batch = data.batch(2)
        kjt = batch.sparse_features
        values = kjt.values().clone()
        values[kjt.offset_per_key()[kjt.keys().index(feature)]] = bad
        batch.sparse_features = KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=kjt.lengths())
        try:
            dmp(batch)
            seen[name] = None
        except FrugalInputError as e:
            seen[name] = str(e)
    ebc = next(m for m in dmp.modules() if isinstance(m, FrugalShardedEmbeddingBagCollection))
    ebc.push_lookahead(data.batch(2).sparse_features)
    try:
        dmp(data.batch(3))
        seen["not_announced"] = None
    except FrugalInputError as e:
        seen["not_announced"] = str(e)
    after = full_tables(dmp, key, table_shapes("dlrm"))
    seen["unchanged"] = dist.get_rank() != 0 or all(np.array_equal(a, b) for a, b in zip(before, after))
    seen["trains_after"] = bool(np.isfinite(train(dmp, opt, data.batches(2, 3))).all())
    release(dmp)
    return seen


def _lookahead_across_nodes(rank: int, world: int) -> Dict[str, Any]:
    """FrugalTrainPipeline announces L batches ahead through the cross-node input dist: after one
    step each node's engine holds steps 1..L, and the step's forward reused the rows computed when
    its batch was announced (each of the L + 1 batches read was turned into rows once).

    Over 12 steps, the bytes and collectives between nodes with the lookahead equal those without
    it (the steps' input dists reuse the ids their announcements sent), and so do the losses."""
    import os

    from examples.comm_counter import CommCounter
    from torchrec_frugal.torchrec import FrugalShardedEmbeddingBagCollection, FrugalTrainPipeline

    dmp, opt, _ = build(world, "frugal_row_wise", "adagrad")
    ebc = next(m for m in dmp.modules() if isinstance(m, FrugalShardedEmbeddingBagCollection))
    data = ZipfBatches(dist.get_rank())
    computed: List[int] = []
    for lookup in ebc.frugal_lookups():
        own = lookup.group_rows
        lookup.group_rows = lambda f, own=own: computed.append(1) or own(f)  # type: ignore[method-assign]
    FrugalTrainPipeline(dmp, opt, torch.device("cpu")).progress(data.batches(0, 20))
    seen: Dict[str, Any] = {"window": ebc.lookahead(), "rows_computed_per_lookup": len(computed) / len(ebc.frugal_lookups()),
                            "capacity": ebc.lookahead_capacity()}  # fmt: skip
    release(dmp)
    counter = CommCounter(int(os.environ["LOCAL_WORLD_SIZE"]))
    for window in (LOOKAHEAD, 0):
        dmp, opt, _ = build(world, "frugal_row_wise", "adagrad")
        pipeline = FrugalTrainPipeline(dmp, opt, torch.device("cpu"), lookahead=window)
        counter.reset()
        counter.install()
        try:
            batches = iter(data.batches(0, 12))
            losses = [float(pipeline.progress(batches)[0].detach()) for _ in range(12)]
        finally:
            counter.uninstall()
        seen[f"L={window}"] = {"between": counter.between_nodes, "calls": counter.calls, "losses": losses}
        release(dmp)
    return seen


def _hardware_plan(rank: int, world: int) -> Dict[str, Any]:
    """FrugalShardingPlanner(hardware="cpu") on the topology of the nodes: what it chose and predicted."""
    import os

    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.planner import Topology

    from torchrec_frugal.config import FrugalConfig
    from torchrec_frugal.torchrec import FrugalEmbeddingBagCollectionSharder
    from torchrec_frugal.torchrec.planner.planners import FrugalShardingPlanner

    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=f"t{t}", embedding_dim=DIM, num_embeddings=r, feature_names=[f"f{t}"])
                for t, r in enumerate(TABLE_ROWS)],
        device=torch.device("meta"),
    )  # fmt: skip
    sharder = FrugalEmbeddingBagCollectionSharder(fused_params=fused_params("adagrad"), config=FrugalConfig(lookahead=0))
    topology = Topology(world_size=world, compute_device="cpu", local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]))
    planner = FrugalShardingPlanner(topology=topology, batch_size=BATCH, hardware="cpu")
    plan = planner.collective_plan(ebc, [sharder], dist.GroupMember.WORLD)
    return {
        "types": {name: ps.sharding_type for m in plan.plan.values() for name, ps in m.items()},  # type: ignore[attr-defined]
        "lookahead": planner.lookahead,
        "sharder_lookahead": planner.sharders()[0].config.lookahead,  # type: ignore[attr-defined]
        "given_lookahead": sharder.config.lookahead,  # the script's own config, left as it was
        "cache_ratio": planner.cache_ratio,
        "predicted": {k: c.samples_per_second for k, c in planner.predicted.items()},
        "bytes_between": planner.predicted["plan"].details["embedding_bytes_between_nodes_per_step"],
    }


def _planned(rank: int, world: int) -> Dict[str, Any]:
    return run_training(world, "frugal_nodes", "adagrad", steps=STEPS)


def _engine_ranks(rank: int, world: int) -> List[int]:
    dmp = build(world, "frugal_row_wise", "sgd")[0]
    ranks = [g.engine.world_size for lookup in frugal_lookups(dmp) for g in lookup.groups]
    release(dmp)
    return ranks


@pytest.fixture(scope="module", params=[(4, 2), (2, 2)], ids=["2nodes_x2", "2nodes_x1"])
def nodes(request: Any) -> Iterator[Scenarios]:
    world, n = request.param
    with tempfile.TemporaryDirectory() as ckpt_dir:
        yield from pooled(world, {
            **{(run, sharding): (_training, (sharding, *r)) for run, r in zip(RUN_IDS, RUNS)
               for sharding in ("frugal_row_wise", "row_wise")},
            "planned": (_planned, ()),
            "hardware_plan": (_hardware_plan, ()),
            "engine_ranks": (_engine_ranks, ()),
            "checkpoint": (_checkpoint, (ckpt_dir,)),
            "refusal": (_refuses_frugal_across_nodes, ()),
            "bad_ids": (_bad_ids, ()),
            "lookahead": (_lookahead_across_nodes, ()),
        }, nodes=n)  # fmt: skip


@pytest.mark.parametrize("run", RUN_IDS)
def test_frugal_row_wise_matches_stock_row_wise(nodes: Scenarios, run: str) -> None:
    for rank, r in enumerate(nodes):
        frugal, stock = r[(run, "frugal_row_wise")], r[(run, "row_wise")]
        assert set(frugal["types"].values()) == {"frugal_row_wise"} and frugal["types"].keys() == stock["types"].keys()
        assert len(frugal["losses"]) == STEPS
        np.testing.assert_allclose(frugal["losses"], stock["losses"], rtol=REL_TOL, err_msg=f"rank {rank}")
    r0 = nodes[0]
    for t, (a, b) in enumerate(zip(r0[(run, "frugal_row_wise")]["tables"], r0[(run, "row_wise")]["tables"])):
        np.testing.assert_allclose(a, b, rtol=REL_TOL, atol=1e-6, err_msg=f"table t{t}")


def test_the_planner_puts_tables_on_frugal_row_wise_across_nodes(nodes: Scenarios) -> None:
    """FrugalShardingPlanner on a topology of 2 nodes plans frugal_row_wise for every table, and
    that plan trains exactly as the hand-made one."""
    for r in nodes:
        planned, hand = r["planned"], r[("adagrad/None/dlrm", "frugal_row_wise")]
        assert planned["types"] == hand["types"]
        assert np.array_equal(planned["losses"], hand["losses"])
    for a, b in zip(nodes[0]["planned"]["tables"], nodes[0][("adagrad/None/dlrm", "frugal_row_wise")]["tables"]):
        assert np.array_equal(a, b)


def test_the_planner_prices_the_nodes_with_a_hardware_profile(nodes: Scenarios) -> None:
    """With hardware="cpu" the planner chooses among the shardings that span nodes (frugal_row_wise,
    never frugal), predicts the plan no slower than any uniform one, and every rank gets the same
    choice, with the chosen L in its sharders' config."""
    from torchrec_frugal.estimate.cost_model import planner_shardings

    first = nodes[0]["hardware_plan"]
    assert set(first["types"]) == {f"t{t}" for t in range(len(TABLE_ROWS))}
    assert set(first["types"].values()) <= set(planner_shardings(2, "cpu")) and "frugal" not in first["types"].values()
    assert set(first["predicted"]) == {"plan", *planner_shardings(2, "cpu")}
    assert first["predicted"]["plan"] >= max(v for k, v in first["predicted"].items() if k != "plan") * 0.999
    assert first["bytes_between"] > 0
    if "frugal_row_wise" in first["types"].values():
        assert first["lookahead"] is not None and first["sharder_lookahead"] == first["lookahead"]
        assert 0 <= first["cache_ratio"] <= 1.0 / (len(nodes) // 2)
    assert first["given_lookahead"] == 0  # the planner configures copies, not the script's sharder
    for r in nodes[1:]:
        assert r["hardware_plan"] == first


def test_each_engine_serves_one_node(nodes: Scenarios) -> None:
    world = len(nodes)
    local = world // 2
    for r in nodes:
        assert r["engine_ranks"] and set(r["engine_ranks"]) == {local}


def test_checkpoint_resumes_like_an_uninterrupted_run(nodes: Scenarios) -> None:
    """Bit for bit, with one and with two ranks per node (the dense layers' buckets kept: see
    ``_checkpoint``)."""
    for rank, r in enumerate(nodes):
        assert r["checkpoint"]["second_losses"] == r["checkpoint"]["first_losses"], f"rank {rank}: losses after the resume"
    ck = nodes[0]["checkpoint"]
    for t, (a, b) in enumerate(zip(ck["first"], ck["second"])):
        assert np.array_equal(a, b), f"table t{t}: max difference {np.abs(a - b).max()}"


def test_frugal_refuses_to_span_nodes(nodes: Scenarios) -> None:
    for r in nodes:
        msg = r["refusal"]
        assert "2 nodes" in msg and "(node 0): ranks" in msg and "(node 1): ranks" in msg, msg
        assert "frugal_row_wise" in msg


def test_bad_ids_are_refused_before_they_cross_nodes(nodes: Scenarios) -> None:
    for r in nodes:
        b = r["bad_ids"]
        assert b["out_of_range"] == (
            f"feature 'f3' (table 't3', frugal_row_wise): id {TABLE_ROWS[3]} is out of range [0, {TABLE_ROWS[3]}); "
            "nothing was changed"
        )
        assert b["negative"] is not None and "'f5'" in b["negative"] and "id -7" in b["negative"]
        msg = b["not_announced"]
        assert msg is not None and "announced for its step in feature 'f" in msg and "nothing was changed" in msg, msg
        assert b["unchanged"] and b["trains_after"]


def test_the_lookahead_window_is_fed_across_nodes(nodes: Scenarios) -> None:
    for r in nodes:
        la = r["lookahead"]
        assert la["window"] == LOOKAHEAD and la["capacity"] == 1
        assert la["rows_computed_per_lookup"] == LOOKAHEAD + 1
        ahead, none = la[f"L={LOOKAHEAD}"], la["L=0"]
        assert none["between"] > 0
        assert (ahead["between"], ahead["calls"]) == (none["between"], none["calls"])
        np.testing.assert_allclose(ahead["losses"], none["losses"], rtol=REL_TOL)
