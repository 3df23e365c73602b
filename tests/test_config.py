"""Configuration validation: every error names the bad field and the bad value."""
from __future__ import annotations

import dataclasses
import re

import pytest

from torchrec_frugal.config import OPTIMIZER_KINDS, QUEUE_KINDS, FrugalConfig, OptimizerSpec, TableSpec


def test_defaults_are_valid():
    cfg = FrugalConfig()
    assert (cfg.lookahead, cfg.cache_ratio, cfg.queue) == (10, 0.05, "two_level")
    assert OptimizerSpec().kind == "sgd"
    TableSpec("t", 1, 1)


@pytest.mark.parametrize(
    "field,value",
    [
        ("lookahead", -1),
        ("cache_ratio", -0.01),
        ("cache_ratio", 1.5),
        ("cache_ratio", float("nan")),
        ("flush_workers", -2),
        ("queue", "fifo"),
        ("flush_chunk_rows", 0),
        ("max_deferred_rows", -1),
        ("timeout_s", 0.0),
        ("timeout_s", -3.0),
        ("lookahead", 2.5),  # refused where given, not later inside the shared-memory sizing
        ("lookahead", True),
        ("lookahead", "3"),
        ("flush_workers", 1.5),
        ("cache_ratio", "0.1"),
        ("mailbox_rows", 0),
        ("update_uncached_in_host", "yes"),
        ("lookahead_thread", 1),
        ("timeout_s", float("nan")),
    ],
)
def test_frugal_config_rejects(field, value):
    with pytest.raises(ValueError) as ei:
        FrugalConfig(**{field: value})
    msg = str(ei.value)
    assert field in msg
    assert (repr(value) if isinstance(value, str) else str(value)) in msg


@pytest.mark.parametrize(
    "kw",
    [
        dict(lookahead=0),  # write-through ablation
        dict(cache_ratio=0.0),
        dict(cache_ratio=1.0),
        dict(flush_workers=0),
        dict(flush_chunk_rows=1),
        dict(max_deferred_rows=0),
        dict(queue="heap"),
        dict(timeout_s=0.001),
    ],
)
def test_frugal_config_accepts_boundaries(kw):
    cfg = FrugalConfig(**kw)
    for k, v in kw.items():
        assert getattr(cfg, k) == v


def test_queue_error_lists_choices():
    with pytest.raises(ValueError) as ei:
        FrugalConfig(queue="Heap")
    for q in QUEUE_KINDS:
        assert q in str(ei.value)
    assert "'Heap'" in str(ei.value)


@pytest.mark.parametrize(
    "rows,dim,field,value",
    [(0, 8, "num_embeddings", 0), (-5, 8, "num_embeddings", -5), (10, 0, "embedding_dim", 0), (10, -1, "embedding_dim", -1)],
)
def test_table_spec_rejects(rows, dim, field, value):
    with pytest.raises(ValueError) as ei:
        TableSpec("user_id", rows, dim)
    msg = str(ei.value)
    assert "'user_id'" in msg and field in msg
    assert re.search(rf"(?<![\d-]){value}(?!\d)", msg), msg


def test_table_spec_is_frozen():
    t = TableSpec("t", 4, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.num_embeddings = 5  # type: ignore[misc]


def test_optimizer_spec_rejects_kind():
    with pytest.raises(ValueError) as ei:
        OptimizerSpec(kind="lamb")
    msg = str(ei.value)
    assert "'lamb'" in msg and "kind" in msg
    for k in OPTIMIZER_KINDS:
        assert k in msg


def test_optimizer_spec_is_mutable():
    spec = OptimizerSpec(kind="rowwise_adagrad", lr=0.1)
    spec.lr = 0.05  # a learning-rate schedule changes the spec in place
    assert spec.lr == 0.05
    assert OptimizerSpec().extra is not OptimizerSpec().extra


@pytest.mark.parametrize(
    "field,value",
    [
        ("lr", -0.1),
        ("eps", -1e-8),
        ("beta1", 1.0),  # bias correction 1 - beta1**t == 0: adam divides by zero
        ("beta1", -0.1),
        ("beta2", 1.0),
        ("beta2", 1.5),
        ("weight_decay", -0.01),
    ],
)
def test_optimizer_spec_rejects_numeric(field, value):
    """Same ranges as torch.optim.Adam: lr >= 0, eps >= 0, 0 <= beta < 1, weight_decay >= 0."""
    with pytest.raises(ValueError) as ei:
        OptimizerSpec(kind="adam", **{field: value})
    msg = str(ei.value)
    assert field in msg and str(value) in msg


@pytest.mark.parametrize(
    "kw,threads",
    [
        (dict(), 1),  # CPU device: the exchange worker only (no flusher or lookahead thread)
        (dict(flush_workers=1), 2),
        (dict(flush_workers=2), 3),
    ],
)
def test_the_engine_starts_its_helper_threads_by_device_unless_told(kw, threads, tmp_path):
    from torchrec_frugal import FrugalEngine

    with FrugalEngine([TableSpec("t", 64, 4)], OptimizerSpec(), FrugalConfig(shm_dir=str(tmp_path), **kw)) as eng:
        assert len(eng.background_threads) == threads
        assert all(t.is_alive() for t in eng.background_threads)


@pytest.mark.parametrize("rows,dim,field,value", [(10.0, 8, "num_embeddings", 10.0), (10, "8", "embedding_dim", "8")])
def test_table_spec_rejects_non_int_sizes(rows, dim, field, value):
    with pytest.raises(ValueError) as ei:
        TableSpec("user_id", rows, dim)
    msg = str(ei.value)
    assert "'user_id'" in msg and field in msg and repr(value) in msg


def test_optimizer_spec_rejects_a_non_number():
    with pytest.raises(ValueError) as ei:
        OptimizerSpec(kind="sgd", lr="0.1")  # type: ignore[arg-type]
    assert "lr" in str(ei.value) and "'0.1'" in str(ei.value)


def test_planner_arguments_are_refused_where_given():
    from torchrec_frugal.torchrec.planner.planners import FrugalShardingPlanner, frugal

    with pytest.raises(ValueError, match=r"zipf_s must be > 0, got -1"):
        FrugalShardingPlanner(zipf_s=-1.0)
    with pytest.raises(TypeError, match="config must be a FrugalConfig, got dict"):
        FrugalShardingPlanner(config={"lookahead": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"cache_ratio must be in \[0, 1\], got 2"):
        frugal(cache_ratio=2)


def test_pipeline_lookahead_is_refused_where_given():
    import torch

    from torchrec_frugal.torchrec.train_pipeline.train_pipelines import FrugalTrainPipeline

    with pytest.raises(ValueError, match=r"lookahead must be an int, got 2.5 \(float\)"):
        FrugalTrainPipeline(torch.nn.Linear(1, 1), torch.optim.SGD([torch.zeros(1)]), torch.device("cpu"), lookahead=2.5)
