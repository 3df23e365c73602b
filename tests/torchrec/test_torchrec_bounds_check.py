"""``bounds_check_mode`` as FBGEMM 1.8 defines it, on frugal tables (CPU, gloo, 2 ranks).

First FBGEMM's own CPU semantics, which frugal copies (one process, a stock TBE): under WARNING and
IGNORE (and V2_*) an id out of range or negative becomes 0 in place, offsets unchanged, so the bag
reads and trains row 0; -1 (the pruned-row marker) is left and the kernel raises; NONE and FATAL
raise. Then frugal against stock table_wise on the same streams, where one rank or the other
feeds ids out of range: with the key unset (FBGEMM's default WARNING) through FrugalTrainPipeline's
planner thread, WARNING explicit through TorchRec's TrainPipelineSparseDist (unplanned), IGNORE in a plain loop with eval forwards, MEAN bags and
a feature two tables serve, and frugal_row_wise across 2 nodes (repaired before the input dist):
losses at every step and final tables within float tolerance, each bad id counted, the warning
naming table, feature and id (IGNORE: none). -1 under WARNING and any bad id under NONE drop the
batch on every rank (as FATAL does, ``tests/torchrec/test_torchrec_bad_batch.py``), and the run then equals
one without that batch.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rank_pool import Scenarios, pooled
from torchrec_ranks import (
    REL_TOL,
    TABLE_ROWS,
    VariantBatches,
    ZipfBatches,
    build,
    full_tables,
    release,
    table_shapes,
)
from torchrec_frugal.host.launch import run_ranks

STEPS = 8
# (step, rank) -> [(feature, position in the feature's ids, id)]
BAD: Dict[Tuple[int, int], List[Tuple[str, int, int]]] = {
    (1, 1): [("f2", 0, TABLE_ROWS[2])],
    (3, 0): [("f5", 0, -7), ("f5", 1, 10**9)],
    (3, 1): [("f0", 1, TABLE_ROWS[0] + 3)],
    (5, 0): [("f2", 2, TABLE_ROWS[2])],
}
# The variants model: f2 is served by t1 (800 rows, MEAN) and t2 (300 rows): 500 is out of t2's range only.
VARIANT_BAD: Dict[Tuple[int, int], List[Tuple[str, int, int]]] = {
    (1, 0): [("f2", 0, 500)],
    (2, 1): [("f1", 0, 800), ("f0", 0, -3)],
}
DROPPED = 3  # the step of the batch dropped in the -1 and NONE runs (rank 0's)
LOGGER = "torchrec_frugal.torchrec.bounds_check"


# ---------------------------------------------------------------------------------------------
# FBGEMM's semantics, one process.


def _tbe(mode: Any) -> Any:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(5, 4, EmbeddingLocation.HOST, ComputeDevice.CPU), (4, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=EmbOptimType.EXACT_SGD,
        learning_rate=1.0,
        bounds_check_mode=mode,
    )
    w = torch.arange(36, dtype=torch.float32).reshape(9, 4)
    tbe.split_embedding_weights()[0].copy_(w[:5])
    tbe.split_embedding_weights()[1].copy_(w[5:])
    return tbe


def _step(mode: Any, indices: List[int], offsets: List[int]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(indices after the call, offsets after, pooled output, both tables after one SGD step)."""
    tbe = _tbe(mode)
    i, o = torch.tensor(indices), torch.tensor(offsets)
    out = tbe(i, o)
    out.backward(torch.ones_like(out))
    return i, o, out.detach(), torch.cat([w.flatten() for w in tbe.split_embedding_weights()])


def test_fbgemm_cpu_reads_and_trains_an_out_of_range_id_as_row_0() -> None:
    """What frugal copies: 2 tables (5 and 4 rows), 2 bags each; 7 and -2 become 0 in place under
    WARNING, IGNORE and their V2, offsets kept; output and update equal those of ids 0."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode as M

    offsets = [0, 2, 3, 4, 6]
    _, _, out0, w0 = _step(M.FATAL, [1, 0, 2, 3, 0, 1], offsets)
    for mode in (M.WARNING, M.IGNORE, M.V2_WARNING, M.V2_IGNORE):
        i, o, out, w = _step(mode, [1, 7, 2, 3, -2, 1], offsets)
        assert i.tolist() == [1, 0, 2, 3, 0, 1] and o.tolist() == offsets, mode
        torch.testing.assert_close(out, out0, rtol=0, atol=0)
        torch.testing.assert_close(w, w0, rtol=0, atol=0)
        assert float(w[0]) == -1.0  # row 0 of table 0 trained: 0 - lr * 1
        with pytest.raises(RuntimeError, match="out of bounds: -1"):  # the pruned-row marker is left
            _step(mode, [1, -1, 2, 3, 1], [0, 2, 3, 4, 5])
    for mode in (M.FATAL, M.NONE, M.V2_FATAL):
        with pytest.raises(RuntimeError):
            _step(mode, [1, 7, 2, 3, 1], [0, 2, 3, 4, 5])


def test_modes_are_folded_and_the_environment_overrides_as_fbgemm_does(monkeypatch: pytest.MonkeyPatch) -> None:
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode as M

    from torchrec_frugal.torchrec.bounds_check import ENV, bounds_check_mode

    monkeypatch.delenv(ENV, raising=False)
    assert [bounds_check_mode(m) for m in M] == ["FATAL", "WARNING", "IGNORE", "NONE", "IGNORE", "WARNING", "FATAL"]
    assert bounds_check_mode(None) == "WARNING" and bounds_check_mode("V2_IGNORE") == "IGNORE"
    monkeypatch.setenv(ENV, str(M.FATAL.value))
    assert bounds_check_mode(M.WARNING) == "FATAL" and bounds_check_mode(None) == "FATAL"
    monkeypatch.setenv(ENV, "9")
    with pytest.raises(ValueError, match=ENV):
        bounds_check_mode(None)


def test_row_zero_sets_what_fbgemm_sets_and_refuses_the_rest() -> None:
    from torchrec_frugal.errors import FrugalInputError
    from torchrec_frugal.torchrec.bounds_check import row_zero

    ids = torch.tensor([3, 9, -2, 0, 4], dtype=torch.int32)
    fixed, repair = row_zero(ids, 5, "t", "f", "WARNING")
    assert fixed.dtype == torch.int64 and fixed.tolist() == [3, 0, 0, 0, 4]
    assert repair is not None and (repair.table, repair.feature, repair.first, repair.count) == ("t", "f", 9, 2)
    same, none = row_zero(torch.tensor([0, 4]), 5, "t", "f", "IGNORE")
    assert same.tolist() == [0, 4] and none is None
    with pytest.raises(FrugalInputError, match=r"table 't': id -1 .*pruned-row marker"):
        row_zero(torch.tensor([2, -1, 9]), 5, "t", "f", "IGNORE")
    for mode in ("FATAL", "NONE"):
        with pytest.raises(FrugalInputError, match=rf"table 't': id 9 is out of range \[0, 5\) \(bounds_check_mode {mode}\)"):
            row_zero(ids, 5, "t", "f", mode)


def test_warnings_are_rate_limited_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    """The first FIRST_WARNINGS batches of a table logged with table, feature and id, then the count
    at each power of two; IGNORE counts and logs nothing."""
    from torchrec_frugal.torchrec.bounds_check import FIRST_WARNINGS, OutOfRangeLog, RowZero

    log = OutOfRangeLog()
    with caplog.at_level("WARNING", logger=LOGGER):
        for b in range(20):
            log.report([RowZero("t3", "f3", 10, "WARNING", 10 + b, 1), RowZero("t4", "f4", 10, "IGNORE", -5, 2)])
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert log.counts == {"t3": 20, "t4": 40}
    assert len(lines) == FIRST_WARNINGS + 2, lines  # counts 8 and 16 after the first 5
    for b, line in enumerate(lines[:FIRST_WARNINGS]):
        assert line.startswith(f"table 't3', feature 'f3': id {10 + b} is out of range [0, 10); read and trained as row 0")
    assert lines[FIRST_WARNINGS].startswith("table 't3': 8 ids out of range") and "16 ids" in lines[-1]
    assert not any("t4" in line for line in lines)


# ---------------------------------------------------------------------------------------------
# Frugal against stock, 2 ranks.


def _with_bad_ids(batch: Any, bad: List[Tuple[str, int, int]]) -> Any:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = batch.sparse_features
    values = kjt.values().clone()
    opk = kjt.offset_per_key()
    for feature, position, value in bad:
        k = kjt.keys().index(feature)
        assert opk[k] + position < opk[k + 1], (feature, position)
        values[opk[k] + position] = value
    batch.sparse_features = KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=kjt.lengths(), weights=kjt.weights_or_none())
    return batch


def stream(
    model: str, bad: Dict[Tuple[int, int], List[Tuple[str, int, int]]], skip: Optional[int] = None, steps: int = STEPS
) -> Iterator[Any]:
    """This rank's batches with the bad ids of ``bad``; step ``skip`` left out (a reference run)."""
    rank = dist.get_rank()
    data: Any = ZipfBatches(rank) if model == "dlrm" else VariantBatches(rank, weighted=False)
    for s in range(steps):
        if s != skip:
            yield _with_bad_ids(data.batch(s), bad.get((s, rank), []))


class _Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run(
    sharding: str,
    mode: Optional[str],
    loop: str,
    bad: Dict[Tuple[int, int], List[Tuple[str, int, int]]],
    model: str = "dlrm",
    skip: Optional[int] = None,
) -> Dict[str, Any]:
    """Train ``STEPS`` batches: losses, FrugalInputErrors by progress() call, final tables, the
    bounds_check warnings logged, the ids counted as row 0 per table, and the logits of an eval
    forward of the last batch with its bad ids (``loop``: "plain", "stock" for TrainPipelineSparseDist,
    or "thread" for FrugalTrainPipeline)."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    from torchrec_frugal.config import FrugalConfig
    from torchrec_frugal.errors import FrugalInputError
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    from torchrec_frugal.torchrec import FrugalTrainPipeline

    from torchrec_ranks import frugal_lookups

    handler = _Captured()
    logging.getLogger(LOGGER).addHandler(handler)
    extra = None if mode is None else {"bounds_check_mode": BoundsCheckMode[mode]}
    config = FrugalConfig(lookahead=4, cache_ratio=0.05, timeout_s=60.0)
    dmp, opt, key = build(dist.get_world_size(), sharding, "adagrad", model, config=config, fused_extra=extra)
    losses: List[float] = []
    errors: List[Tuple[int, str]] = []
    source = stream(model, bad, skip)
    if loop == "plain":
        for batch in source:
            opt.zero_grad()
            loss, _ = dmp(batch)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    else:
        pipe = (
            TrainPipelineSparseDist(dmp, opt, torch.device("cpu"))
            if loop == "stock"
            else FrugalTrainPipeline(dmp, opt, torch.device("cpu"))
        )
        for call in range(2 * STEPS):
            try:
                losses.append(pipe.progress(source)[0].item())
            except FrugalInputError as e:
                errors.append((call, str(e)))
            except StopIteration:
                break
        pipe.detach()  # the model's own forward back, for the eval forward
    rank = dist.get_rank()
    data: Any = ZipfBatches(rank) if model == "dlrm" else VariantBatches(rank, weighted=False)
    last = _with_bad_ids(data.batch(STEPS - 1), [("f2" if model == "dlrm" else "f1", 0, 10**6)])
    try:  # an eval forward (no gradients) of a batch with a bad id
        with torch.no_grad():
            logits: Optional[np.ndarray] = dmp(last)[1][1].numpy()
    except FrugalInputError:  # refused (NONE), changing nothing
        logits = None
    counts: Dict[str, int] = {}  # the ids read as row 0, per table: each lookup's, and frugal_row_wise's
    logs = [lookup.out_of_range for lookup in frugal_lookups(dmp)]
    logs += [m.row_wise_out_of_range for m in dmp.modules() if hasattr(m, "row_wise_out_of_range")]
    for log in logs:
        for t, n in log.counts.items():
            counts[t] = counts.get(t, 0) + n
    shapes = table_shapes("variants" if model == "variants" else "dlrm")
    out = {
        "losses": np.array(losses),
        "errors": errors,
        "tables": full_tables(dmp, key, shapes),
        "warnings": handler.lines,
        "counts": counts,
        "logits": logits,
    }
    logging.getLogger(LOGGER).removeHandler(handler)
    release(dmp)
    return out


RUNS: Dict[str, Tuple[str, Optional[str], str, Dict[Tuple[int, int], List[Tuple[str, int, int]]], str, Optional[int]]] = {
    # name: (sharding, mode, loop, bad ids, model, step skipped)
    "stock": ("table_wise", None, "plain", BAD, "dlrm", None),
    "unset_thread": ("frugal", None, "thread", BAD, "dlrm", None),
    "warning_unplanned": ("frugal", "WARNING", "stock", BAD, "dlrm", None),
    "ignore_plain": ("frugal", "IGNORE", "plain", BAD, "dlrm", None),
    "stock_variants": ("table_wise", None, "plain", VARIANT_BAD, "variants", None),
    "variants": ("frugal", None, "plain", VARIANT_BAD, "variants", None),  # not traceable: no pipeline
    "pruned": ("frugal", "WARNING", "thread", {(DROPPED, 0): [("f4", 0, -1)]}, "dlrm", None),
    "none_mode": ("frugal", "NONE", "thread", {(DROPPED, 0): [("f4", 0, TABLE_ROWS[4])]}, "dlrm", None),
    "without_dropped": ("frugal", "WARNING", "thread", {}, "dlrm", DROPPED),
}


def _run(rank: int, world: int, *spec: Any) -> Dict[str, Any]:
    return run(*spec)


@pytest.fixture(scope="module")
def world2() -> Iterator[Scenarios]:
    yield from pooled(2, {name: (_run, spec) for name, spec in RUNS.items()})


def expected_counts(rank: int) -> Dict[str, int]:
    """Per table, the ids of rank ``rank``'s BAD stream and its eval forward (one of f2's)."""
    counts = {"t2": 1}
    for (_, r), ids in BAD.items():
        if r == rank:
            for feature, _, _ in ids:
                counts[f"t{feature[1:]}"] = counts.get(f"t{feature[1:]}", 0) + 1
    return counts


def assert_warned(lines: List[str], rank: int) -> None:
    """One warning per feature of a batch with bad ids (each names its first), then the eval's."""
    expected = [
        f"table 't{ids[0][0][1:]}', feature '{ids[0][0]}': id {ids[0][2]} is out of range"
        for (_, r), ids in sorted(BAD.items())
        if r == rank
    ]
    expected.append(f"table 't2', feature 'f2': id {10**6} is out of range")
    assert len(lines) == len(expected), lines
    for line, start in zip(lines, expected):
        assert line.startswith(start) and "read and trained as row 0" in line, (line, start)


def assert_equal_training(a: Dict[str, Any], b: Dict[str, Any], rank: int) -> None:
    """Losses at every step, final tables (rank 0 holds them) and the eval logits within REL_TOL."""
    assert a["losses"].shape == b["losses"].shape == (STEPS,), (a["losses"], b["losses"])
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=REL_TOL)
    assert a["logits"] is not None and b["logits"] is not None
    np.testing.assert_allclose(a["logits"], b["logits"], rtol=REL_TOL, atol=1e-6)
    if rank == 0:
        for t, (x, y) in enumerate(zip(a["tables"], b["tables"])):
            rel = np.abs(x - y).max() / np.abs(y).max()
            assert rel <= REL_TOL, f"table t{t}: rel diff {rel:.3g}"


@pytest.mark.parametrize("name", ["unset_thread", "warning_unplanned", "ignore_plain"])
def test_a_bad_id_trains_as_row_0_equal_to_stock(world2: Scenarios, name: str) -> None:
    for rank, res in enumerate(world2):
        got, stock = res[name], res["stock"]
        assert not got["errors"] and not stock["errors"]
        assert_equal_training(got, stock, rank)
        # Every bad id of this rank's stream counted once, the eval forward's too.
        assert got["counts"] == expected_counts(rank), (rank, got["counts"])
        if name == "ignore_plain":
            assert got["warnings"] == []
        else:
            assert_warned(got["warnings"], rank)


def test_mean_bags_and_a_feature_two_tables_serve_equal_stock(world2: Scenarios) -> None:
    """f2's id 500 is in t1's range (800 rows) and out of t2's (300): row 0 of t2 alone."""
    expected = [{"t2": 1, "t1": 1}, {"t1": 2, "t0": 1}]  # with the eval forward's f1 id (t1)
    for rank, res in enumerate(world2):
        got, stock = res["variants"], res["stock_variants"]
        assert not got["errors"]
        assert_equal_training(got, stock, rank)
        assert got["counts"] == expected[rank], (rank, got["counts"])


@pytest.mark.parametrize("name", ["pruned", "none_mode"])
def test_minus_1_and_none_drop_the_batch_on_every_rank(world2: Scenarios, name: str) -> None:
    """Stock trains no batch holding -1 (WARNING) or an id out of range (NONE: its CPU kernel
    raises): frugal drops it on every rank at its step, and trains on as if it was never read."""
    for rank, res in enumerate(world2):
        got, ref = res[name], res["without_dropped"]
        assert [call for call, _ in got["errors"]] == [DROPPED], got["errors"]
        message = got["errors"][0][1]
        assert f"batch {DROPPED} read by FrugalTrainPipeline is dropped on every rank" in message
        if rank == 0:
            value = "-1" if name == "pruned" else str(TABLE_ROWS[4])
            assert "'f4'" in message and "'t4'" in message and f"id {value} " in message, message
        np.testing.assert_array_equal(got["losses"], ref["losses"])
        if rank == 0:
            for x, y in zip(got["tables"], ref["tables"]):
                np.testing.assert_array_equal(x, y)


# ---------------------------------------------------------------------------------------------
# frugal_row_wise across 2 nodes: repaired before the input dist.


def _nodes_main(rank: int, world: int) -> Dict[str, Any]:
    torch.set_num_threads(1)
    return {
        "stock": run("table_wise", None, "plain", BAD),
        "row_wise": run("frugal_row_wise", None, "thread", BAD),
    }


def test_frugal_row_wise_trains_a_bad_id_as_row_0_of_its_table_equal_to_stock_table_wise() -> None:
    nodes = run_ranks(2, _nodes_main, nodes=2)
    for rank, res in enumerate(nodes):
        got = res["row_wise"]
        assert not got["errors"]
        assert_equal_training(got, res["stock"], rank)
        assert got["counts"] == expected_counts(rank), (rank, got["counts"])
        assert_warned(got["warnings"], rank)
