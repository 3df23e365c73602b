"""Frugal sharding inside TorchRec against TorchRec's own sharding (CPU, gloo, 2 and 4 ranks).

TorchRec's DLRM (in DLRMTrain) with 8 tables of 1,000 to 200,000 rows (dim 16) trains 300 steps on
Zipf-skewed ids, each rank on its own batches, from the same initial weights and with the same
fused optimizer (EXACT_SGD, EXACT_ROWWISE_ADAGRAD), once with frugal tables and once with
TorchRec's table_wise and row_wise shardings. Each rank's loss at every step and the final tables
must agree within 1e-4 relative. Also: a plan mixing frugal and table_wise tables, an
EmbeddingCollection model, FrugalTrainPipeline against TrainPipelineSparseDist, RandomRecDataset,
TorchRec's default planner given the frugal sharder, bad inputs, learning-rate changes, and a
checkpoint saved at step k and loaded into fresh processes, which must continue bit-for-bit.

Each world size spawns its ranks once (a module-scoped pool); each test runs the scenarios it reads.
"""
from __future__ import annotations

import tempfile
from typing import Any, Callable, Dict, Iterator, List

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rank_pool import Scenarios, pooled
from torchrec_frugal.host.launch import run_ranks
from torchrec_ranks import (  # noqa: F401
    BATCH,
    DIM,
    LOOKAHEAD,
    LR,
    REL_TOL,
    STEPS,
    TABLE_ROWS,
    ZipfBatches,
    assert_same_training,
    build,
    full_tables,
    initial_table,
    release,
    run_checkpoint,
    run_training,
    table_shapes,
)


def run_checks(world: int) -> Dict[str, Any]:
    """Bad inputs and learning-rate changes on an all-frugal DLRM; reports what was seen."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from torchrec_frugal.errors import FrugalInputError
    from torchrec_frugal.torchrec import FrugalShardedEmbeddingBagCollection

    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    # FATAL: a bad id refused (WARNING, the default, trains it as row 0: test_torchrec_bounds_check.py)
    dmp, optimizer, key = build(world, "frugal", "adagrad", fused_extra={"bounds_check_mode": BoundsCheckMode.FATAL})
    ebc = next(m for m in dmp.modules() if isinstance(m, FrugalShardedEmbeddingBagCollection))
    data = ZipfBatches(dist.get_rank())
    seen: Dict[str, Any] = {}

    def snapshot() -> List[np.ndarray]:
        """This rank's blocks of every table, then of every row-wise Adagrad state."""
        model, state = dmp.state_dict(), optimizer.state_dict()["state"]
        weights, momentum = [], []
        for t in range(len(TABLE_ROWS)):
            weights.append(torch.cat([s.tensor for s in model[f"{key}.t{t}.weight"].local_shards()]).numpy())
            st = state[f"{key}.t{t}.weight"][f"t{t}.momentum1"]
            momentum.append(torch.cat([s.tensor for s in st.local_shards()]).numpy())
        return weights + momentum

    def refused(name: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
            seen[name] = None
        except FrugalInputError as e:
            seen[name] = str(e)

    def with_ids(batch: Any, feature: str, bad: int) -> Any:
        kjt = batch.sparse_features
        values = kjt.values().clone()
        start = kjt.offset_per_key()[kjt.keys().index(feature)]
        values[start] = bad
        batch.sparse_features = KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=kjt.lengths())
        return batch

    def step(batch: Any) -> float:
        optimizer.zero_grad()
        loss, _ = dmp(batch)
        loss.backward()
        optimizer.step()
        return loss.item()

    step(data.batch(0))
    before = snapshot()
    refused("out_of_range", lambda: dmp(with_ids(data.batch(1), "f3", TABLE_ROWS[3])))
    refused("negative", lambda: dmp(with_ids(data.batch(1), "f5", -7)))
    good = data.batch(1).sparse_features
    n_last = good.length_per_key()[-1]  # a feature no table serves is ignored, as stock does; one missing is refused
    lacking = KeyedJaggedTensor(
        keys=good.keys()[:-1], values=good.values()[: good.values().numel() - n_last], lengths=good.lengths()[:-BATCH]
    )
    missing = data.batch(1)
    missing.sparse_features = lacking
    refused("missing_feature", lambda: dmp(missing))
    ebc.push_lookahead(data.batch(2).sparse_features)  # announce batch 2, then train batch 1
    refused("lookahead_mismatch", lambda: dmp(data.batch(1)))
    seen["unchanged"] = all(np.array_equal(x, y) for x, y in zip(before, snapshot()))
    seen["trains_after"] = np.isfinite(step(data.batch(2)))  # the announced batch trains

    # A learning rate set through DMP.fused_optimizer's param_groups takes effect.
    for g in dmp.fused_optimizer.param_groups:
        g["lr"] = 0.0
    before = snapshot()
    step(data.batch(3))
    after = snapshot()
    n = len(TABLE_ROWS)
    seen["lr0_weights_unchanged"] = all(np.array_equal(x, y) for x, y in zip(before[:-n], after[:-n]))
    seen["lr0_momentum_changed"] = any(not np.array_equal(x, y) for x, y in zip(before[-n:], after[-n:]))
    for g in dmp.fused_optimizer.param_groups:
        g["lr"] = LR
    step(data.batch(4))
    seen["lr_restored_trains"] = not all(np.array_equal(x, y) for x, y in zip(after[:-n], snapshot()[:-n]))
    seen["dense_optimizer_tables"] = [k for k in optimizer.params if "embedding_bags" in k and k not in dmp.fused_optimizer.params]
    seen["fused_keys"] = sorted(dmp.fused_optimizer.params.keys())

    # FrugalTrainPipeline reads L batches ahead and announces them: after one step, the engines'
    # window holds steps 1..L (room for one more), and L + 1 batches were read.
    from torchrec_frugal.torchrec import FrugalTrainPipeline

    read: List[int] = []

    def source() -> Iterator[Any]:
        for s in range(10, 30):
            read.append(s)
            yield data.batch(s)

    # The forward of an announced batch reuses the rows computed when it was announced (the planner
    # thread also reads one batch beyond the window, and plans it when it gets to it).
    computed: List[int] = []
    for lookup in ebc.frugal_lookups():
        own = lookup.fused_ids  # the ids checked and fused: what planning a batch or computing its rows begins with
        lookup.fused_ids = lambda f, own=own: computed.append(1) or own(f)  # type: ignore[method-assign]
    FrugalTrainPipeline(dmp, optimizer, torch.device("cpu")).progress(source())
    seen["pipeline_read"] = len(read)
    seen["rows_computed_per_lookup"] = len(computed) / len(ebc.frugal_lookups())
    seen["pipeline_capacity"] = ebc.lookahead_capacity()

    # A save hands out views of the shared tables; a load writes each rank's own row block only.
    from torchrec_frugal.torchrec.checkpoint import row_blocks

    engines = ebc.frugal_engines()
    written: List[int] = []
    for eng in engines:
        def spy(parts: Any, orig: Any = eng.write_rows) -> None:
            written.append(sum(int(rows.numel()) for rows, weights, _ in parts if weights is not None))
            orig(parts)

        eng.write_rows = spy  # type: ignore[method-assign]
    sd = dmp.state_dict()
    host = [(e.host_block(0, e.num_rows)[0].data_ptr(), e.num_rows * e.dim * 4) for e in engines]
    shards = [sh.tensor for t in range(len(TABLE_ROWS)) for sh in sd[f"{key}.t{t}.weight"].local_shards()]
    seen["save_shards_are_views"] = all(  # inside a host table, and storage no larger than the shard
        any(p <= x.data_ptr() < p + n for p, n in host) and x.untyped_storage().nbytes() == x.numel() * 4 for x in shards
    )
    last = len(TABLE_ROWS) - 1
    new_table = torch.arange(TABLE_ROWS[last] * DIM, dtype=torch.float32).reshape(-1, DIM) / 1e6
    sd[f"{key}.t{last}.weight"] = new_table  # a whole tensor, the same on every rank
    dmp.load_state_dict(sd)
    rank = dist.get_rank()
    seen["load_rows_written"] = sum(written)
    seen["load_rows_own_blocks"] = sum(row_blocks(n, world)[rank][1] for n in TABLE_ROWS)
    final = full_tables(dmp, key, table_shapes("dlrm"))[last]
    seen["loaded_whole_table"] = bool(np.array_equal(final, new_table.numpy())) if rank == 0 else True
    release(dmp)
    return seen


SCENARIOS_2: Dict[str, Dict[str, Any]] = {
    "frugal_sgd": dict(sharding="frugal", opt="sgd"),
    "tw_sgd": dict(sharding="table_wise", opt="sgd"),
    "rw_sgd": dict(sharding="row_wise", opt="sgd"),
    "frugal_adagrad": dict(sharding="frugal", opt="adagrad"),
    "frugal_adagrad_pipeline": dict(sharding="frugal", opt="adagrad", pipeline="frugal"),
    "tw_adagrad": dict(sharding="table_wise", opt="adagrad"),
    "rw_adagrad": dict(sharding="row_wise", opt="adagrad"),
    "mixed_adagrad": dict(sharding="mixed", opt="adagrad"),
    "default_planner_adagrad": dict(sharding="default", opt="adagrad"),
    "ec_frugal_adagrad": dict(sharding="frugal", opt="adagrad", model_kind="ec", table_rows=TABLE_ROWS[::2]),
    "ec_tw_adagrad": dict(sharding="table_wise", opt="adagrad", model_kind="ec", table_rows=TABLE_ROWS[::2]),
    "ec_frugal_two_groups": dict(
        sharding="frugal_two_groups", opt="adagrad", model_kind="ec", table_rows=TABLE_ROWS[::2], steps=100
    ),
    "ec_tw_100": dict(sharding="table_wise", opt="adagrad", model_kind="ec", table_rows=TABLE_ROWS[::2], steps=100),
    "variants_frugal": dict(sharding="frugal", opt="adagrad", model_kind="variants", steps=100),
    "variants_tw": dict(sharding="table_wise", opt="adagrad", model_kind="variants", steps=100),
    "weighted_variants_frugal": dict(sharding="frugal", opt="adagrad", model_kind="weighted_variants", steps=100),
    "weighted_variants_tw": dict(sharding="table_wise", opt="adagrad", model_kind="weighted_variants", steps=100),
    "random_frugal_pipeline": dict(sharding="frugal", opt="adagrad", pipeline="frugal", steps=60, data="random"),
    "random_tw_pipeline": dict(sharding="table_wise", opt="adagrad", pipeline="sparse_dist", steps=60, data="random"),
}


SCENARIOS_4: Dict[str, Dict[str, Any]] = {
    "frugal_sgd": dict(sharding="frugal", opt="sgd", pipeline="frugal"),
    # Frugal tables through TorchRec's own pipeline: no plans, no lookahead.
    "frugal_sgd_inline": dict(sharding="frugal", opt="sgd", pipeline="sparse_dist"),
    "tw_sgd": dict(sharding="table_wise", opt="sgd"),
    "rw_sgd": dict(sharding="row_wise", opt="sgd"),
    "frugal_adagrad": dict(sharding="frugal", opt="adagrad"),
    "tw_adagrad": dict(sharding="table_wise", opt="adagrad"),
    "rw_adagrad": dict(sharding="row_wise", opt="adagrad"),
}


def _training(rank: int, world: int, kw: Dict[str, Any]) -> Dict[str, Any]:
    return run_training(world, **kw)


def _checks(rank: int, world: int) -> Dict[str, Any]:
    return run_checks(world)


def _jobs(scenarios: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    return {name: (_training, (kw,)) for name, kw in scenarios.items()}


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    yield from pooled(2, {**_jobs(SCENARIOS_2), "checks": (_checks, ())})


@pytest.fixture(scope="module")
def world4() -> Iterator[Scenarios]:
    yield from pooled(4, _jobs(SCENARIOS_4))


@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
@pytest.mark.parametrize("stock", ["tw", "rw"])
def test_dlrm_frugal_matches_stock_2_ranks(world2: Scenarios, opt: str, stock: str) -> None:
    assert set(world2[0][f"frugal_{opt}"]["types"].values()) == {"frugal"}
    assert_same_training(world2, f"frugal_{opt}", f"{stock}_{opt}")


@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
@pytest.mark.parametrize("stock", ["tw", "rw"])
def test_dlrm_frugal_matches_stock_4_ranks(world4: Scenarios, opt: str, stock: str) -> None:
    assert_same_training(world4, f"frugal_{opt}", f"{stock}_{opt}")


def test_planned_steps_train_bit_for_bit_as_inline_ones_on_4_ranks(world4: Scenarios) -> None:
    """Batches planned on the planner thread and updates on the exchange worker, against each
    forward computing its rows and the update inside backward: the same losses and tables, bit for bit."""
    for res in world4:
        assert np.array_equal(res["frugal_sgd"]["losses"], res["frugal_sgd_inline"]["losses"])
    for x, y in zip(world4[0]["frugal_sgd"]["tables"], world4[0]["frugal_sgd_inline"]["tables"]):
        assert np.array_equal(x, y)


def test_frugal_train_pipeline_matches_plain_loop(world2: Scenarios) -> None:
    assert_same_training(world2, "frugal_adagrad_pipeline", "tw_adagrad")
    assert_same_training(world2, "frugal_adagrad_pipeline", "frugal_adagrad")


def test_mixed_frugal_and_table_wise_plan(world2: Scenarios) -> None:
    types = world2[0]["mixed_adagrad"]["types"]
    n = len(TABLE_ROWS)
    assert [types[f"t{t}"] for t in range(n)] == ["frugal"] * (n // 2) + ["table_wise"] * (n - n // 2)
    assert_same_training(world2, "mixed_adagrad", "tw_adagrad")


def test_default_planner_with_frugal_sharder(world2: Scenarios) -> None:
    """DistributedModelParallel(plan=None) plans with TorchRec's planner; the shims plan every table of
    the frugal sharder frugal."""
    assert set(world2[0]["default_planner_adagrad"]["types"].values()) == {"frugal"}
    assert_same_training(world2, "default_planner_adagrad", "tw_adagrad")


def test_embedding_collection_frugal_matches_table_wise(world2: Scenarios) -> None:
    assert_same_training(world2, "ec_frugal_adagrad", "ec_tw_adagrad")


def test_engine_groups_pooling_modes_weights_and_shared_features(world2: Scenarios) -> None:
    """Two dims (two engines), MEAN pooling, weighted ids, a table with two features, a shared feature."""
    assert_same_training(world2, "variants_frugal", "variants_tw")
    assert_same_training(world2, "weighted_variants_frugal", "weighted_variants_tw")
    assert_same_training(world2, "ec_frugal_two_groups", "ec_tw_100")


def test_random_rec_dataset_with_pipelines(world2: Scenarios) -> None:
    assert_same_training(world2, "random_frugal_pipeline", "random_tw_pipeline")


def test_bad_inputs_are_refused_and_change_nothing(world2: Scenarios) -> None:
    for seen in (r["checks"] for r in world2):
        assert seen["out_of_range"] is not None and "'f3'" in seen["out_of_range"] and "'t3'" in seen["out_of_range"]
        assert f"id {TABLE_ROWS[3]}" in seen["out_of_range"]
        assert seen["negative"] is not None and "'f5'" in seen["negative"] and "-7" in seen["negative"]
        missing = f"'f{len(TABLE_ROWS) - 1}'"
        assert seen["missing_feature"] is not None and "lacks feature" in seen["missing_feature"] and missing in seen["missing_feature"]
        assert seen["lookahead_mismatch"] is not None and "lookahead" in seen["lookahead_mismatch"]
        assert "'t" in seen["lookahead_mismatch"]
        assert seen["unchanged"] and seen["trains_after"]


def test_checkpoint_save_is_views_and_load_writes_own_blocks(world2: Scenarios) -> None:
    """Saving copies no table; loading writes exactly this rank's row block of every table (no
    all-gather of whole tables), and a whole tensor loaded on every rank lands whole."""
    for r, out in enumerate(world2):
        c = out["checks"]
        assert c["save_shards_are_views"], r
        assert c["load_rows_written"] == c["load_rows_own_blocks"] < sum(TABLE_ROWS), (r, c)
        assert c["loaded_whole_table"], r


def test_learning_rate_through_param_groups(world2: Scenarios) -> None:
    for seen in (r["checks"] for r in world2):
        assert seen["lr0_weights_unchanged"] and seen["lr0_momentum_changed"] and seen["lr_restored_trains"]
        assert seen["dense_optimizer_tables"] == []
        assert seen["fused_keys"] == [
            f"model.sparse_arch.embedding_bag_collection.embedding_bags.t{t}.weight" for t in range(len(TABLE_ROWS))
        ]


def test_pipeline_reads_and_announces_lookahead_batches(world2: Scenarios) -> None:
    for seen in (r["checks"] for r in world2):
        assert seen["pipeline_read"] == LOOKAHEAD + 2
        # once per batch planned (the last one read may not be yet), not again for the step that trained batch 0
        assert LOOKAHEAD + 1 <= seen["rows_computed_per_lookup"] <= LOOKAHEAD + 2
        assert seen["pipeline_capacity"] == 1


def test_checkpoint_resumes_bit_for_bit(world2: Scenarios) -> None:
    """Save at step k with torch.distributed.checkpoint, load into fresh processes, continue."""
    k = STEPS // 2
    with tempfile.TemporaryDirectory() as directory:
        saved = run_ranks(2, run_checkpoint, "save", directory, k, STEPS)
        resumed = run_ranks(2, run_checkpoint, "resume", directory, k, STEPS)
    for rank in range(2):
        whole = world2[rank]["frugal_adagrad_pipeline"]["losses"]
        assert np.array_equal(saved[rank]["losses"], whole[:k])
        assert np.array_equal(resumed[rank]["losses"], whole[k:])
    for x, y in zip(resumed[0]["tables"], world2[0]["frugal_adagrad_pipeline"]["tables"]):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("saved_as, resumed_as", [("frugal", "row_wise"), ("table_wise", "frugal")])
def test_a_checkpoint_resumes_under_another_sharding(saved_as: str, resumed_as: str) -> None:
    """A checkpoint is TorchRec's: saved under frugal, it resumes under stock row_wise (and a
    table_wise one under frugal), weights and row-wise Adagrad state resharded by
    torch.distributed.checkpoint; the run continues like the uninterrupted one (1e-4 relative:
    FBGEMM's kernels against the engine's)."""
    k, steps = 15, 30
    with tempfile.TemporaryDirectory() as directory:
        whole = run_ranks(2, run_checkpoint, "whole", directory, k, steps, "cpu", saved_as)
        run_ranks(2, run_checkpoint, "save", directory, k, steps, "cpu", saved_as)
        resumed = run_ranks(2, run_checkpoint, "resume", directory, k, steps, "cpu", resumed_as)
    for rank in range(2):
        np.testing.assert_allclose(resumed[rank]["losses"], whole[rank]["losses"][k:], rtol=REL_TOL)
    for t, (x, y) in enumerate(zip(resumed[0]["tables"], whole[0]["tables"])):
        np.testing.assert_allclose(x, y, rtol=REL_TOL, atol=1e-6, err_msg=f"table t{t}")


def test_a_mixed_plan_resumes_bit_for_bit() -> None:
    """Frugal and table_wise tables in one plan (fused row-wise Adagrad, FBGEMM's state for the
    stock ones, the engines' for the frugal ones) save and load through one checkpoint: the
    resumed run continues the uninterrupted one bit for bit, losses and every table."""
    k, steps = 15, 30
    with tempfile.TemporaryDirectory() as directory:
        whole = run_ranks(2, run_checkpoint, "whole", directory, k, steps, "cpu", "mixed")
        saved = run_ranks(2, run_checkpoint, "save", directory, k, steps, "cpu", "mixed")
        resumed = run_ranks(2, run_checkpoint, "resume", directory, k, steps, "cpu", "mixed")
    for rank in range(2):
        assert np.array_equal(saved[rank]["losses"], whole[rank]["losses"][:k])
        assert np.array_equal(resumed[rank]["losses"], whole[rank]["losses"][k:])
    moved = 0
    for t, (x, y) in enumerate(zip(resumed[0]["tables"], whole[0]["tables"])):
        assert np.array_equal(x, y), f"table t{t}"
        moved += int(not np.array_equal(x, initial_table(t, x.shape[0])))
    assert moved == len(TABLE_ROWS)  # every table trained, frugal and table_wise alike
